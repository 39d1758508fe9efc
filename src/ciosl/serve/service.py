"""A served learner: one learner in a folder, a single writer thread, a write-ahead log.

The folder (``DIR``) holds ``ciosl-serve.json`` (method, settings), ``snapshot.json`` (which
snapshot is current and the sequence number it ends at), ``snapshots/`` (learner files and the
idempotency ids they cover), ``log/`` (the segments of ``wal``), ``token`` and ``.lock``.

The rule: one writer thread takes learn requests in arrival order and applies each to the
learner (all-or-nothing: a request that raises changes nothing and is not logged); a syncer
thread appends the records of every group waiting as one write, fsyncs once (group commit) and
only then acknowledges them, while the writer applies the next group. Recovery is the current snapshot plus the log records after it; a snapshot is written
atomically and the log segments it covers are deleted only after it is current. A request whose
id was acknowledged before (within the last ``id_window`` ids) is answered as a duplicate and
learns nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import fcntl
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.errors import LearnerError, echo
from ciosl.fileio import atomic_write_json, load_json
from ciosl.learners.base import Learner, lock_of
from ciosl.learners.registry import get_method
from ciosl.learners.settings import parse_value, plain
from ciosl.serial import digest
from ciosl.serve import wal

FORMAT = "ciosl-serve"
VERSION = 1
META = "ciosl-serve.json"
POINTER = "snapshot.json"
KNOWN = {META, POINTER, "snapshots", "log", "token", ".lock"}


class ServeError(ValueError):
    """A folder or a setting the server refuses (one line)."""


@dataclass
class Options:
    snapshot_every: int = 100_000  # samples learned between two snapshots (0: never by count)
    snapshot_seconds: float = 300.0  # seconds between two snapshots when there is news (0: never)
    id_window: int = 1_000_000  # how many of the last idempotency ids are remembered
    max_group: int = 512  # requests in one group commit at most
    snapshot_on_close: bool = True
    # the writer thread's nice value (Linux: per thread): under load the scheduler gives the
    # CPU to the threads that answer first, so learning slows down before answers do
    writer_nice: int = 10


@dataclass
class Answer:
    """A finished learn request: HTTP ``status`` and the JSON ``body``."""

    status: int
    body: dict


@dataclass
class _Job:
    kind: str  # "learn", "snapshot", "stop"
    x: np.ndarray | None = None
    y: list | None = None
    rid: str | None = None
    future: cf.Future = field(default_factory=cf.Future)


def settings_for(method: str, overrides: dict[str, str]) -> dict[str, Any]:
    """The settings of ``--method`` with ``--set NAME=VALUE`` parsed by each setting's type and
    checked by the constructor."""
    cls = get_method(method)
    known = {s.name: s for s in cls.settings()}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ServeError(f"--set: unknown setting(s) {', '.join(unknown)} for method "
                         f"{cls.name!r}; valid settings: {', '.join(sorted(known))}")
    values = {k: parse_value(known[k], v) for k, v in overrides.items()}
    return plain(cls(**values).get_params())


def _apply(learner: Learner, x: np.ndarray, y: list) -> None:
    """One request's update: ``learn_one`` for one sample, ``learn_many`` for more (replay
    makes the same calls)."""
    if len(y) == 1:
        learner.learn_one(x[0], y[0])
    else:
        learner.learn_many(x, y)


class Service:
    """One learner served from ``folder``. ``open()`` recovers it and starts the writer."""

    def __init__(self, folder: str | Path, method: str | None, settings: dict | None = None,
                 *, options: Options | None = None, on_commit=None):
        self.folder = Path(folder)
        self.method, self.settings = method, settings
        self.options = options or Options()
        self.on_commit = on_commit  # (fsync seconds, requests, samples) after each group
        self.learner: Learner | None = None
        self.seq = 0  # last record number applied and logged
        self.snap_seq, self.snap_time = 0, time.time()
        self.ids: collections.OrderedDict = collections.OrderedDict()  # id -> seq
        self.broken: str | None = None
        self.recovered = 0  # records replayed at open
        self.recovery_seconds = 0.0
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._syncer: threading.Thread | None = None
        self._sync_queue: queue.Queue = queue.Queue()
        self._lock_fd = -1
        self._segment: wal.Segment | None = None
        self._since_snapshot = 0

    # ------------------------------------------------------------------ folder
    def open(self) -> Service:
        t0 = time.perf_counter()
        self._claim_folder()
        try:
            self._recover()
        except BaseException:
            self._release()
            raise
        self.recovery_seconds = time.perf_counter() - t0
        self._syncer = threading.Thread(target=self._sync, name="ciosl-syncer", daemon=True)
        self._syncer.start()
        self._thread = threading.Thread(target=self._writer, name="ciosl-writer", daemon=True)
        self._thread.start()
        return self

    def _claim_folder(self) -> None:
        f = self.folder
        if f.exists() and not f.is_dir():
            raise ServeError(f"--dir {f}: not a folder")
        f.mkdir(parents=True, exist_ok=True)
        fd = os.open(f / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ServeError(f"--dir {f}: in use by another ciosl serve (it holds "
                             f"{f / '.lock'})") from None
        self._lock_fd = fd
        try:
            self._check_meta()
        except BaseException:
            self._release()
            raise

    def _check_meta(self) -> None:
        f = self.folder
        meta_path = f / META
        if not meta_path.exists():
            others = sorted(p.name for p in f.iterdir() if p.name not in {".lock", "token"})
            if others:
                raise ServeError(f"--dir {f}: not a ciosl serve folder (no {META}; it holds "
                                 f"{', '.join(others[:3])}{'...' if len(others) > 3 else ''})")
            if self.method is None:
                raise ServeError(f"--dir {f} is new: give --method")
            if self.settings is None:
                self.settings = settings_for(self.method, {})
            self.method = get_method(self.method).name
            (f / "snapshots").mkdir(exist_ok=True)
            (f / "log").mkdir(exist_ok=True)
            atomic_write_json(meta_path, {"format": FORMAT, "version": VERSION,
                                          "method": self.method, "settings": self.settings})
            wal.fsync_dir(f)
            return
        try:
            meta = load_json(meta_path, META)
        except ValueError as e:
            raise ServeError(f"--dir {f}: {e}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ServeError(f"{meta_path}: not a ciosl serve folder description")
        if meta.get("version") != VERSION:
            raise ServeError(f"{meta_path}: serve format version {meta.get('version')!r}, this "
                             f"ciosl reads {VERSION}")
        if self.method is not None and get_method(self.method).name != meta["method"]:
            raise ServeError(f"--dir {f} serves method {meta['method']!r}, not "
                             f"{get_method(self.method).name!r}; use another --dir or that method")
        if self.settings is not None and self.settings != meta["settings"]:
            diff = sorted(k for k in {*self.settings, *meta["settings"]}
                          if self.settings.get(k) != meta["settings"].get(k))
            shown = ", ".join(f"{k}={echo(meta['settings'].get(k))}" for k in diff[:3])
            raise ServeError(f"--dir {f} serves {meta['method']} with other settings ({shown}); "
                             "start it without --set, or use another --dir")
        self.method, self.settings = meta["method"], meta["settings"]
        for sub in ("snapshots", "log"):
            if not (f / sub).is_dir():
                raise ServeError(f"--dir {f}: {sub}/ is missing; the folder is damaged")

    def _release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # the flock goes with it
            self._lock_fd = -1

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        f = self.folder
        pointer = f / POINTER
        snap_seq, ids = 0, []
        if pointer.exists():
            try:
                p = load_json(pointer, POINTER)
                snap_seq, file, ids_file = int(p["seq"]), str(p["file"]), str(p["ids"])
                self.learner = Learner.load(f / "snapshots" / file)
                ids = load_json(f / "snapshots" / ids_file, "ids file")
            except (ValueError, KeyError, TypeError, OSError) as e:
                raise ServeError(f"--dir {f}: its snapshot cannot be read ({e}); the folder is "
                                 "damaged") from None
            if self.learner.name != self.method:
                raise ServeError(f"{f / 'snapshots' / file}: holds a {self.learner.name!r} "
                                 f"learner, the folder serves {self.method!r}")
        else:
            self.learner = get_method(self.method)(**self.settings)
        for seq, rid in ids:
            self._remember(rid, seq)
        tail: dict = {}
        self.seq, self.recovered = snap_seq, 0
        try:
            for rec in wal.iter_log(f / "log", snap_seq, tail):  # one record at a time
                try:
                    _apply(self.learner, rec.x, rec.y)
                except Exception as e:
                    raise ServeError(f"--dir {f}: record {rec.seq} of the log does not apply "
                                     f"again ({type(e).__name__}: {e})") from None
                self._remember(rec.id, rec.seq)
                self.seq, self.recovered = rec.seq, self.recovered + 1
        except wal.LogDamaged as e:
            raise ServeError(f"--dir {f}: {e}; refusing to start (the log is never cut in the "
                             "middle)") from None
        self.snap_seq = snap_seq
        self.snap_time = pointer.stat().st_mtime if pointer.exists() else time.time()
        log = f / "log"
        if tail:
            self._segment = wal.Segment(tail["path"], tail["base"], create=False,
                                        good_end=tail["good_end"])
        else:
            self._segment = wal.Segment(log / wal.segment_name(self.seq), self.seq, create=True)

    def _remember(self, rid: str | None, seq: int) -> None:
        if rid is None:
            return
        self.ids[rid] = seq
        while len(self.ids) > self.options.id_window:
            self.ids.popitem(last=False)

    # ------------------------------------------------------------------ requests
    def submit_learn(self, x: np.ndarray, y: list, rid: str | None) -> cf.Future:
        job = _Job("learn", x, y, rid)
        self._queue.put(job)
        return job.future

    def submit_snapshot(self) -> cf.Future:
        job = _Job("snapshot")
        self._queue.put(job)
        return job.future

    def predict_proba(self, X: np.ndarray) -> tuple[list, np.ndarray]:
        """The classes and the probabilities of ``X``, from one state of the learner: its last
        published state where it has one (no wait for a learn step), else under its lock."""
        learner = self.learner
        view = learner.published()
        if view is not None:
            return list(view.classes_), view.predict_proba(X)
        with lock_of(learner):
            if not learner.classes_:
                raise LookupError("nothing learned yet: predict needs at least one class")
            return list(learner.classes_), learner.predict_proba(X)

    def status(self) -> dict:
        learner = self.learner
        with lock_of(learner):
            return {"method": self.method, "seen": int(learner.n_seen_),
                    "classes": len(learner.classes_), "dim": learner.dim_}

    def state_classes(self) -> list:
        with lock_of(self.learner):
            return list(self.learner.classes_)

    def state(self) -> dict:
        """The learner's state digest with the sequence number it ends at."""
        learner = self.learner
        with lock_of(learner):
            return {"seq": self.seq, "seen": int(learner.n_seen_),
                    "classes": list(learner.classes_), "digest": digest(learner.state_dict())}

    def close(self) -> None:
        """Apply and acknowledge what is queued, take a last snapshot, release the folder."""
        if self._thread is not None and self._thread.is_alive():
            stop = _Job("stop")
            self._queue.put(stop)
            self._thread.join()
        if self._syncer is not None and self._syncer.is_alive():
            self._sync_queue.put(None)
            self._syncer.join()
        if self._segment is not None:
            self._segment.close()
        self._release()

    # ------------------------------------------------------------------ the writer
    def _writer(self) -> None:
        if self.options.writer_nice:
            with contextlib.suppress(AttributeError, OSError):  # not Linux: as it is
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               self.options.writer_nice)
        while True:
            timeout = self.options.snapshot_seconds or None
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._maybe_snapshot(idle=True)
                continue
            jobs = [first]
            while len(jobs) < self.options.max_group:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._learn_group([j for j in jobs if j.kind == "learn"])
            stop = False
            for job in jobs:
                if job.kind == "snapshot":
                    self._snapshot_job(job)
                elif job.kind == "stop":
                    stop = True
            if stop:
                self._drain_and_stop()
                return
            self._maybe_snapshot(idle=False)

    def _drain_and_stop(self) -> None:
        rest = []
        while True:
            try:
                rest.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._learn_group([j for j in rest if j.kind == "learn"])
        for job in rest:
            if job.kind == "snapshot":
                self._snapshot_job(job)
        self._sync_queue.join()
        if self.options.snapshot_on_close and self.broken is None and self.seq > self.snap_seq:
            with contextlib.suppress(Exception):
                self._snapshot()

    def _learn_group(self, jobs: list[_Job]) -> None:
        """Apply each request in order and hand its record to the syncer, which writes and
        fsyncs the group and then acknowledges it; the writer goes on applying the next group
        meanwhile (the fsync of one group overlaps the work of the next)."""
        if not jobs:
            return
        learner = self.learner
        blobs: list[bytes] = []
        acks: list[tuple[_Job, Answer]] = []
        samples = 0
        for job in jobs:
            if self.broken is not None:
                job.future.set_result(Answer(503, {"error": self.broken}))
                continue
            if job.rid is not None and job.rid in self.ids:  # acknowledged, or about to be
                acks.append((job, Answer(200, {"learned": 0, "duplicate": True,
                                               "seq": self.ids[job.rid]})))
                continue
            try:
                _apply(learner, job.x, job.y)
            except (ValueError, TypeError) as e:
                job.future.set_result(Answer(422, {"error": _one_line(e)}))
                continue
            except Exception as e:  # a learner's failure: all-or-nothing left it unchanged
                job.future.set_result(Answer(500, {"error": _one_line(e)}))
                continue
            self.seq += 1
            blobs.append(wal.encode(self.seq, job.x, job.y, job.rid))
            self._remember(job.rid, self.seq)  # a retry queued behind it is its duplicate
            samples += len(job.y)
            acks.append((job, Answer(200, {"learned": len(job.y), "duplicate": False,
                                           "seq": self.seq, "seen": int(learner.n_seen_)})))
        self._since_snapshot += samples
        if acks:
            self._sync_queue.put((blobs, acks, samples))

    def _sync(self) -> None:
        """The syncer: writes the records of every group waiting, fsyncs once, then
        acknowledges them (in order: a duplicate's answer comes after its original's)."""
        while True:
            item = self._sync_queue.get()
            items = [item]
            while item is not None:
                try:
                    item = self._sync_queue.get_nowait()
                except queue.Empty:
                    break
                items.append(item)
            groups = [i for i in items if i is not None]
            blobs = [b for g in groups for b in g[0]]
            acks = [a for g in groups for a in g[1]]
            if blobs and self.broken is None:
                t0 = time.perf_counter()
                try:
                    self._segment.append(b"".join(blobs))
                except OSError as e:
                    # applied in memory but not durable: refuse every later learn (a restart
                    # recovers the acknowledged state from the snapshot and the log)
                    self.broken = (f"cannot write the log {self._segment.path} "
                                   f"({e.strerror or e}); restart the server to recover")
                else:
                    if self.on_commit is not None:
                        self.on_commit(time.perf_counter() - t0, len(blobs),
                                       sum(g[2] for g in groups))
            seen = int(self.learner.n_seen_)
            for job, answer in acks:
                if self.broken is not None:
                    answer = Answer(503, {"error": self.broken})
                answer.body.setdefault("seen", seen)
                job.future.set_result(answer)
            for _ in items:
                self._sync_queue.task_done()
            if items[-1] is None:
                return

    def _snapshot_job(self, job: _Job) -> None:
        try:
            job.future.set_result(Answer(200, self._snapshot()))
        except Exception as e:
            job.future.set_result(Answer(500, {"error": _one_line(e)}))

    def _maybe_snapshot(self, *, idle: bool) -> None:
        o = self.options
        if self.broken is not None or self.seq == self.snap_seq:
            return
        due = (o.snapshot_every and self._since_snapshot >= o.snapshot_every) or (
            o.snapshot_seconds and time.time() - self.snap_time >= o.snapshot_seconds)
        if due:
            with contextlib.suppress(Exception):  # the next one tries again; the log holds all
                self._snapshot()

    def _snapshot(self) -> dict:
        """Write the learner and its ids at ``self.seq``, make it current, drop what it
        covers. Runs on the writer thread: no learn is in progress."""
        self._sync_queue.join()  # every applied record is written before the log rotates
        f, s = self.folder, self.seq
        if self.broken is not None:
            raise RuntimeError(self.broken)
        if self._segment.base != s:  # records after s go to a new segment
            self._segment.close()
            self._segment = wal.Segment(f / "log" / wal.segment_name(s), s, create=True)
        t0 = time.perf_counter()
        snaps = f / "snapshots"
        name, ids_name = f"learner-{s:012d}.ciosl", f"ids-{s:012d}.json"
        self.learner.save(snaps / name)
        atomic_write_json(snaps / ids_name, [[q, rid] for rid, q in self.ids.items()])
        wal.fsync_dir(snaps)
        atomic_write_json(f / POINTER, {"seq": s, "file": name, "ids": ids_name,
                                        "seen": int(self.learner.n_seen_), "time": time.time()})
        wal.fsync_dir(f)
        for p in snaps.iterdir():
            if p.name not in (name, ids_name):
                p.unlink(missing_ok=True)
        for base, p in wal.segments(f / "log"):
            if base < s:
                p.unlink(missing_ok=True)
        self.snap_seq, self.snap_time, self._since_snapshot = s, time.time(), 0
        return {"seq": s, "seen": int(self.learner.n_seen_),
                "seconds": round(time.perf_counter() - t0, 6)}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if isinstance(e, LearnerError | ValueError | TypeError) else \
        f"{type(e).__name__}: {line}"


def log_ids(folder: str | Path) -> list[tuple[int, str | None]]:
    """Every (sequence number, id) the folder's snapshot ids and log hold, in order (the
    requests applied, as far as the id window reaches back). For checks and tests; the server
    must not be running."""
    folder = Path(folder)
    snap_seq, out = 0, []
    pointer = folder / POINTER
    if pointer.exists():
        p = json.loads(pointer.read_text())
        snap_seq = p["seq"]
        out = [(int(q), rid) for q, rid in json.loads((folder / "snapshots" / p["ids"]).read_text())]
    return out + [(r.seq, r.id) for r in wal.iter_log(folder / "log", snap_seq, {})]
