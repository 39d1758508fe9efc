"""Many learners in one server: ``ROOT`` holds named learners, each a served folder (its own
writer, log, snapshots, ids, prediction window) that fails alone.

Where a learner lives: ``ROOT/learners/NAME/``, except ``default`` when ``ROOT`` itself is a
served folder (the layout of a single-learner ``ciosl serve``, also what ``--method`` makes in
a new or empty ROOT): such a folder starts and serves as before, at the old URLs. ``ROOT``
holds besides ``.hub.lock`` (held by the running server), ``.trash/`` (deleted learners,
``NAME-<UTC time>``) and ``token``.

Learners are loaded on their first request and unloaded (closed: queued learns applied, a
snapshot taken) after ``unload_after`` seconds without one, or the least recently used first
when more than ``max_loaded`` are loaded; a request never meets a learner being unloaded (a
learner in use is never unloaded).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ciosl.fileio import load_json
from ciosl.learners.registry import get_method
from ciosl.learners.settings import parse_value, plain
from ciosl.serve import folder as folder_mod
from ciosl.serve.common import Options, _one_line
from ciosl.serve.events import EventLog
from ciosl.serve.folder import META, POINTER, ServeError
from ciosl.serve.service import Service

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}", re.ASCII)
LEARNERS, TRASH, HUB_LOCK = "learners", ".trash", ".hub.lock"
ROOT_ENTRIES = {LEARNERS, TRASH, HUB_LOCK, "token", ".lock", "extractor.json"}  # images.PIN
DEFAULT = "default"


class Unavailable(Exception):
    """A request the hub cannot route: ``status`` (400, 404, 409, 503) and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_name(name: Any) -> str:
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        shown = repr(name)[:80]
        raise Unavailable(400, f"name {shown}: a learner's name is 1 to 64 characters of "
                          "A-Z a-z 0-9 _ -, not starting with '-' (no '/', '.' or '..')")
    return name


def settings_of(method: Any, values: Any) -> tuple[str, dict]:
    """A registered method's name and its settings from a JSON object (text parsed as
    ``--set`` does), checked by the constructor; ``Unavailable(400)`` naming what is wrong."""
    if not isinstance(method, str) or ":" in method:
        raise Unavailable(400, f"method: expected the name of a registered method (see GET "
                          f"/v1/methods), got {str(method)[:60]!r}")
    try:
        cls = get_method(method)
    except (ValueError, KeyError) as e:
        raise Unavailable(400, f"method: {_one_line(e)}") from None
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise Unavailable(400, "settings: expected a JSON object of setting: value")
    known = {s.name: s for s in cls.settings()}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise Unavailable(400, f"settings: unknown setting(s) {', '.join(unknown)[:200]} for "
                          f"method {cls.name!r}; valid: {', '.join(sorted(known))}")
    try:
        parsed = {k: parse_value(known[k], v) if isinstance(v, str) and known[k].type is not str
                  else v for k, v in values.items()}
        return cls.name, plain(cls(**parsed).get_params())
    except (ValueError, TypeError) as e:
        raise Unavailable(400, f"settings: {_one_line(e)}") from None


@dataclass
class _Entry:
    service: Service | None = None
    users: int = 0
    last: float = field(default_factory=time.monotonic)
    load_lock: threading.Lock = field(default_factory=threading.Lock)


class Hub:
    def __init__(self, root: str | Path, options: Options | None = None, *,
                 max_loaded: int = 256, unload_after: float = 600.0, warn=None):
        folder_mod.check_name(root)
        self.root = Path(root)
        self.options = options or Options()
        self.max_loaded, self.unload_after = max_loaded, unload_after
        self.warn = warn
        self.on_commit = None  # (fsync seconds, requests, samples) of any learner's group
        self.events: dict[str, EventLog] = {}
        self._entries: dict[str, _Entry] = {}
        self._rows: dict[str, dict] = {}  # what was known of a learner when it was unloaded
        self._lock = threading.Lock()
        self._create_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock_fd = -1
        self._sweeper: threading.Thread | None = None

    # ------------------------------------------------------------------ the root
    def open(self, method: str | None = None, settings: dict | None = None) -> Hub:
        """Claim ROOT; with ``method``, make (or check) the learner ``default``."""
        self._claim()
        try:
            if method is not None or (self.root / META).exists():
                self._load_default(method, settings)
        except BaseException:
            self.close()
            raise
        self._sweeper = threading.Thread(target=self._sweep, name="ciosl-unloader",
                                         daemon=True)
        self._sweeper.start()
        return self

    def _claim(self) -> None:
        f = folder_mod.check_place(self.root)
        if f.is_dir() and not (f / META).exists():
            others = sorted(p.name for p in f.iterdir() if p.name not in ROOT_ENTRIES)
            if others:
                raise ServeError(f"--dir {f}: not a ciosl serve folder (it holds "
                                 f"{', '.join(others[:3])})")
        self._lock_fd = folder_mod.hold(f, HUB_LOCK)

    def _load_default(self, method: str | None, settings: dict | None) -> None:
        """The learner ``default``: ROOT itself when it is a served folder, or when ROOT holds
        no learner yet (the single-learner layout), else ``ROOT/learners/default``."""
        here = self.folder_of(DEFAULT)
        if not (here / META).exists() and not self.names():
            here = self.root
        entry = self._entries.setdefault(DEFAULT, _Entry())
        entry.service = self._service(DEFAULT, here, method, settings).open()

    def folder_of(self, name: str) -> Path:
        if name == DEFAULT and (self.root / META).exists():
            return self.root
        return self.root / LEARNERS / name

    def names(self) -> list[str]:
        found = {DEFAULT} if (self.root / META).exists() else set()
        with contextlib.suppress(FileNotFoundError):
            found |= {p.name for p in (self.root / LEARNERS).iterdir()
                      if NAME.fullmatch(p.name) and (p / META).exists()}
        return sorted(found)

    def exists(self, name: str) -> bool:
        return NAME.fullmatch(name) is not None and (self.folder_of(name) / META).exists()

    def _service(self, name: str, folder: Path, method=None, settings=None) -> Service:
        events = self.events.setdefault(name, EventLog())
        return Service(folder, method, settings, options=self.options, warn=self.warn,
                       on_commit=self._commit, events=events)

    def _commit(self, *args) -> None:
        if self.on_commit is not None:
            self.on_commit(*args)

    # ------------------------------------------------------------------ using a learner
    @contextlib.contextmanager
    def use(self, name: str):
        """The learner ``name``, loaded, held for the ``with`` (never unloaded meanwhile)."""
        service = self.acquire(name)
        try:
            yield service
        finally:
            self.release(name)

    def acquire(self, name: str) -> Service:
        check_name(name)
        if not self.exists(name):
            raise Unavailable(404, f"learner {name!r} does not exist")
        with self._lock:
            entry = self._entries.setdefault(name, _Entry())
            entry.users += 1
            entry.last = time.monotonic()
        try:
            with entry.load_lock:
                if entry.service is None:
                    self._make_room(name)
                    try:
                        entry.service = self._service(name, self.folder_of(name)).open()
                    except Exception as e:
                        raise Unavailable(503, f"learner {name!r} cannot be loaded: "
                                          f"{_one_line(e)}") from None
                return entry.service
        except BaseException:
            self.release(name)
            raise

    def release(self, name: str) -> None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                entry.users -= 1
                entry.last = time.monotonic()

    def _make_room(self, name: str) -> None:
        """Unload the least recently used idle learners until one more fits in
        ``max_loaded`` (the loading request waits for it: memory stays bounded however fast
        learners are asked for)."""
        while self.loaded() >= self.max_loaded:
            with self._lock:
                idle = sorted((e.last, n) for n, e in self._entries.items()
                              if e.service is not None and not e.users and n != name)
            if not any(self._unload(n) for _, n in idle[:4]):
                return  # every loaded learner is in use: one more, for now

    def loaded(self) -> int:
        return sum(e.service is not None for e in list(self._entries.values()))

    def _sweep(self) -> None:
        period = max(0.05, min(1.0, self.unload_after / 4))
        while not self._stop.is_set():
            self._wake.wait(period)
            self._wake.clear()
            with contextlib.suppress(Exception):  # the unloader never dies
                self.unload_idle()

    def unload_idle(self) -> int:
        """Unload the learners idle past ``unload_after``, and the least recently used beyond
        ``max_loaded``; how many were unloaded."""
        now = time.monotonic()
        with self._lock:
            loaded = sorted(((e.last, n) for n, e in self._entries.items()
                             if e.service is not None), key=lambda t: t[0])
        excess = len(loaded) - self.max_loaded
        done = 0
        for i, (last, name) in enumerate(loaded):
            if now - last >= self.unload_after or i < excess:
                done += self._unload(name)
        return done

    def _unload(self, name: str) -> bool:
        entry = self._entries.get(name)
        if entry is None or not entry.load_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:  # a request for it now waits for the load lock, then reloads it
                if entry.users or entry.service is None:
                    return False
                service = entry.service
            self._rows[name] = self._loaded_row(name, service)
            try:
                service.close()
            finally:
                entry.service = None  # counted as loaded until it is closed
            return True
        finally:
            entry.load_lock.release()

    # ------------------------------------------------------------------ managing learners
    def create(self, name: Any, method: Any, settings: Any) -> dict:
        check_name(name)
        method, values = settings_of(method, settings)
        with self._create_lock:
            if self.exists(name) or (name == DEFAULT and (self.root / META).exists()):
                raise Unavailable(409, f"learner {name!r} exists already")
            folder = self.root / LEARNERS / name
            if folder.exists():  # a folder left by a creation cut short: made again
                shutil.rmtree(folder)
            (self.root / LEARNERS).mkdir(exist_ok=True)
            entry = _Entry()
            self._make_room(name)
            with entry.load_lock:
                entry.service = self._service(name, folder, method, values).open()
                with self._lock:
                    self._entries[name] = entry
        self._wake.set()
        return {"name": name, "method": method, "settings": values}

    def delete(self, name: Any, confirm: Any) -> dict:
        check_name(name)
        if confirm != name:
            raise Unavailable(400, f"confirm: deleting learner {name!r} needs ?confirm={name} "
                              "(its name again)")
        if not self.exists(name):
            raise Unavailable(404, f"learner {name!r} does not exist")
        with self._lock:
            entry = self._entries.pop(name, None) or _Entry()
        with entry.load_lock:
            if entry.service is not None:
                entry.service.close()  # what was queued is applied and acknowledged first
                # a request that still reaches it hears why, not that a thread stopped
                entry.service.broken = f"learner {name!r} was deleted"
                entry.service = None
        folder = self.folder_of(name)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        trash = self.root / TRASH / f"{name}-{stamp}-{time.time_ns() % 10**6:06d}"
        trash.parent.mkdir(exist_ok=True)
        if folder == self.root:  # the single-learner layout: its files move
            trash.mkdir()
            for p in list(folder.iterdir()):
                if p.name not in ROOT_ENTRIES:
                    os.rename(p, trash / p.name)
        else:
            os.rename(folder, trash)
        self._rows.pop(name, None)
        self.events.pop(name, None)
        return {"deleted": name}

    # ------------------------------------------------------------------ describing learners
    def row(self, name: str) -> dict:
        entry = self._entries.get(name)
        service = entry.service if entry is not None else None
        if service is not None:
            return self._loaded_row(name, service)
        if name not in self._rows:  # read once: a learner not loaded does not change
            self._rows[name] = self._folder_row(name)
        return {**self._rows[name], "loaded": False}

    def _loaded_row(self, name: str, service: Service) -> dict:
        st = service.status()
        with service.score_lock:
            n, correct = service.score.n, service.score.correct
        return {"name": name, "method": service.method, "seen": st["seen"],
                "classes": st["classes"], "seq": service.seq, "loaded": True,
                "accuracy": correct / n if n else None, "feedback": n}

    def _folder_row(self, name: str) -> dict:
        """A learner not loaded since the server started: its last snapshot's figures."""
        folder = self.folder_of(name)
        meta = load_json(folder / META, META)
        p = load_json(folder / POINTER, POINTER) if (folder / POINTER).exists() else {}
        return {"name": name, "method": meta.get("method"), "seen": p.get("seen", 0),
                "classes": p.get("classes", 0), "seq": p.get("seq", 0), "loaded": False,
                "accuracy": p.get("accuracy"), "feedback": p.get("feedback", 0)}

    def settings_of(self, name: str) -> dict:
        return load_json(self.folder_of(name) / META, META).get("settings", {})

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._sweeper is not None:
            self._sweeper.join()
        for name, entry in list(self._entries.items()):
            with entry.load_lock:
                if entry.service is not None:
                    try:
                        entry.service.close()
                    except Exception as e:  # one learner's failure: the others still close
                        if self.warn is not None:
                            self.warn(f"ciosl serve: learner {name!r}: {_one_line(e)}")
                    entry.service = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
