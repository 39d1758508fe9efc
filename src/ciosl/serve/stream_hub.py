"""Named learners whose log is JetStream (``ciosl serve --log nats://...``): ``hub.Hub`` with
the learners' names, methods and settings in the KV bucket ``ciosl_learners`` instead of
folders, so that every replica serves every learner, whichever replica created it.

A KV entry: key = the learner's name, value = ``{"method", "settings", "stream", "subject",
"created"}``; its stream is ``CIOSL_<name>_<8 hex>`` on subject ``ciosl.<name>.<8 hex>`` (a
new suffix per creation: a name deleted and made again never reuses an old stream). Create is
KV ``create`` (409 when the key exists); delete removes the key and leaves the stream and its
snapshots in place, named in the answer (``nats stream rm`` removes them). ``--dir`` holds
this replica's own things only: ``.hub.lock``, ``token``, ``streams/<stream>/`` (prediction
window, replica tag)."""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from ciosl.fileio import dangling_link, dangling_text
from ciosl.serve import folder as folder_mod
from ciosl.serve.common import Options, _one_line, _stderr
from ciosl.serve.events import EventLog
from ciosl.serve.folder import ServeError
from ciosl.serve.hub import (
    DEFAULT,
    HUB_LOCK,
    NAME,
    Hub,
    Unavailable,
    _Entry,
    check_name,
    settings_of,
)
from ciosl.serve.jetstream import START_SECONDS, Log, parse_log, transient
from ciosl.serve.replica import StreamService

STREAMS = "streams"
OWN = {STREAMS, HUB_LOCK, "token", "extractor.json"}  # what a replica's --dir holds
CACHE_SECONDS = 1.0  # a learner known here is checked against the bucket this often
NAMES_SECONDS = 0.1  # the list of names: read again after this
STALE_SECONDS = 0.5  # how long a read of what is known already waits for the log at most


class StreamHub(Hub):
    def __init__(self, root: str | Path, options: Options, *, max_loaded: int = 256,
                 unload_after: float = 600.0, warn=None):
        super().__init__(root, options, max_loaded=max_loaded, unload_after=unload_after,
                         warn=warn)
        self.log = Log(parse_log(options.log), options.log_replicas or 1,
                       options.log_dedupe_window, warn=warn or _stderr)
        self._known: dict[str, tuple[float, dict]] = {}
        self._names: tuple[float, list[str]] = (0.0, [])
        self._known_lock = threading.Lock()

    # ------------------------------------------------------------------ the root, the bucket
    def open(self, method: str | None = None, settings: dict | None = None) -> StreamHub:
        self.log.connect()  # an unreachable log fails before --dir is touched
        try:
            self._claim()
            deadline = time.monotonic() + START_SECONDS
            while True:  # a cluster electing a leader (a server down) answers in a while
                try:
                    self._open_default(method, settings)
                    self.names()  # read once here: later reads fall back on it
                    break
                except Exception as e:
                    if not (transient(e) or (isinstance(e, Unavailable) and e.status == 503)):
                        raise
                    if time.monotonic() > deadline:
                        raise ServeError(f"--log {self.log.text}: JetStream did not answer "
                                         f"within {START_SECONDS:g} s ({_one_line(e)})") \
                            from None
                time.sleep(0.5)
        except BaseException:
            self.close()
            raise
        self._sweeper = threading.Thread(target=self._sweep, name="ciosl-unloader",
                                         daemon=True)
        self._sweeper.start()
        return self

    def _claim(self) -> None:
        f = self.root
        if f.is_dir() and not (f / STREAMS).is_dir():  # a replica's own folder, or a new one
            others = sorted(p.name for p in f.iterdir() if p.name not in OWN)
            if others:
                raise ServeError(f"--dir {f}: not the folder of a --log nats replica (it "
                                 f"holds {', '.join(others[:3])}); give one of its own")
        link = dangling_link(f)
        if link is not None:
            raise ServeError(f"--dir {f}: {dangling_text(link)}; create its target or give "
                             "another --dir")
        if f.exists() and not f.is_dir():
            raise ServeError(f"--dir {f}: not a folder")
        self._lock_fd = folder_mod.hold(f, HUB_LOCK, "; each replica needs a --dir of its own")

    def _open_default(self, method: str | None, settings: dict | None) -> None:
        if method is not None:
            self._ensure_default(method, settings)
        elif self.exists(DEFAULT):
            entry = self._entries.setdefault(DEFAULT, _Entry())
            entry.service = self._service(DEFAULT, None).open()

    def _ensure_default(self, method: str, settings: dict | None) -> None:
        """``--method``: make the learner ``default`` in the bucket, or check the one there."""
        meta = self.meta(DEFAULT, fresh=True)
        if meta is None:
            try:
                self.create(DEFAULT, method, settings or {})
                return
            except Unavailable as e:
                if e.status == 503:  # the log away: tried again
                    raise
                if e.status != 409:
                    raise ServeError(f"--method {method}: {e}") from None
                meta = self.meta(DEFAULT, fresh=True)
        if meta["method"] != method:
            raise ServeError(f"--method {method}: the learner 'default' in the log "
                             f"{self.log.text} is a {meta['method']!r} learner")
        entry = self._entries.setdefault(DEFAULT, _Entry())
        entry.service = self._service(DEFAULT, None).open()

    def meta(self, name: str, *, fresh: bool = False) -> dict | None:
        """The KV entry of ``name`` (read again after ``CACHE_SECONDS``; a name not known is
        always read, so a learner made through another replica is served at once)."""
        now = time.monotonic()
        with self._known_lock:
            hit = self._known.get(name)
        if hit is not None and not fresh and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        try:  # known: never held up long by a log that is away (answers go on)
            raw = self.log.kv_get(name, STALE_SECONDS if hit is not None else None)
        except Exception as e:
            if hit is not None:  # the log is away: what was known, for another while
                with self._known_lock:
                    self._known[name] = (now, hit[1])
                return hit[1]
            raise Unavailable(503, f"the log {self.log.text} does not answer "
                              f"({_one_line(e)}); retry") from None
        with self._known_lock:
            if raw is None:
                self._known.pop(name, None)
                return None
            meta = json.loads(raw)
            self._known[name] = (now, meta)
            return meta

    def names(self) -> list[str]:
        now = time.monotonic()
        if now - self._names[0] >= NAMES_SECONDS:
            try:
                keys = self.log.kv_keys(STALE_SECONDS if self._names[0] else None)
                self._names = (now, [k for k in keys if NAME.fullmatch(k)])
            except Exception as e:
                if not self._names[0]:
                    raise Unavailable(503, f"the log {self.log.text} does not answer "
                                      f"({_one_line(e)}); retry") from None
                self._names = (now, self._names[1])  # the log is away: what was known
        return list(self._names[1])

    def exists(self, name: str) -> bool:
        return NAME.fullmatch(name) is not None and self.meta(name) is not None

    def folder_of(self, name: str) -> Path:
        meta = self.meta(name)
        return self.root / STREAMS / (meta["stream"] if meta else "_")

    def _service(self, name: str, folder, method=None, settings=None) -> StreamService:
        meta = self.meta(name, fresh=True)
        if meta is None:
            raise Unavailable(404, f"learner {name!r} does not exist")
        events = self.events.setdefault(name, EventLog())
        return StreamService(self.log, name, meta, self.root / STREAMS / meta["stream"],
                             options=self.options, warn=self.warn, on_commit=self._commit,
                             events=events)

    # ------------------------------------------------------------------ managing learners
    def create(self, name: Any, method: Any, settings: Any) -> dict:
        check_name(name)
        method, values = settings_of(method, settings)
        with self._create_lock:
            suffix = secrets.token_hex(4)
            meta = {"method": method, "settings": values, "stream": f"CIOSL_{name}_{suffix}",
                    "subject": f"ciosl.{name}.{suffix}", "created": time.time()}
            try:
                self.log.ensure_stream(meta["stream"], meta["subject"])
                made = self.log.kv_create(name, json.dumps(meta).encode())
            except Exception as e:
                raise Unavailable(503, f"the log {self.log.text} does not answer "
                                  f"({_one_line(e)}); retry") from None
            if not made:
                with contextlib.suppress(Exception):  # new and empty: nobody uses it
                    self.log.call(self.log.js.delete_stream(meta["stream"]))
                raise Unavailable(409, f"learner {name!r} exists already")
            with self._known_lock:
                self._known[name] = (time.monotonic(), meta)
            self._names = (0.0, [])
            entry = _Entry()
            self._make_room(name)
            with entry.load_lock:
                entry.service = self._service(name, None).open()
                with self._lock:
                    self._entries[name] = entry
        self._wake.set()
        return {"name": name, "method": method, "settings": values}

    def delete(self, name: Any, confirm: Any) -> dict:
        check_name(name)
        if confirm != name:
            raise Unavailable(400, f"confirm: deleting learner {name!r} needs ?confirm={name} "
                              "(its name again)")
        meta = self.meta(name, fresh=True)
        if meta is None:
            raise Unavailable(404, f"learner {name!r} does not exist")
        self.log.kv_delete(name)
        with self._known_lock:
            self._known.pop(name, None)
        self._names = (0.0, [])
        with self._lock:
            entry = self._entries.pop(name, None) or _Entry()
        with entry.load_lock:
            if entry.service is not None:
                entry.service.snapshot_on_close = False
                entry.service.close()
                entry.service.broken = f"learner {name!r} was deleted"
                entry.service = None
        self._rows.pop(name, None)
        self.events.pop(name, None)
        return {"deleted": name, "stream": meta["stream"]}

    def unload_idle(self) -> int:
        """Also unload the learners deleted (or made again) through another replica."""
        done = super().unload_idle()
        for name, entry in list(self._entries.items()):
            service = entry.service
            if service is None or entry.users:
                continue
            with contextlib.suppress(Unavailable):
                meta = self.meta(name)
                if meta is None or meta["stream"] != service.stream:
                    service.snapshot_on_close = False  # of a learner deleted: none
                    done += self._unload(name)
        return done

    # ------------------------------------------------------------------ describing learners
    def row(self, name: str) -> dict:
        entry = self._entries.get(name)
        service = entry.service if entry is not None else None
        if service is not None:
            return self._loaded_row(name, service)
        if name in self._rows:  # what was known when it was unloaded
            return {**self._rows[name], "loaded": False}
        meta = self.meta(name) or {}
        return {"name": name, "method": meta.get("method"), "seen": None, "classes": None,
                "seq": None, "loaded": False, "accuracy": None, "feedback": 0, "skipped": None}

    def _loaded_row(self, name: str, service) -> dict:
        return {**super()._loaded_row(name, service), "skipped": service.skipped}

    def settings_of(self, name: str) -> dict:
        return (self.meta(name) or {}).get("settings", {})

    def close(self) -> None:
        super().close()
        self.log.close()
