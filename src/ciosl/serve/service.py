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

import concurrent.futures as cf
import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.errors import LearnerError
from ciosl.fileio import atomic_write_json, load_json
from ciosl.learners.base import Learner, lock_of
from ciosl.learners.registry import get_method
from ciosl.learners.settings import parse_value, plain
from ciosl.serial import digest
from ciosl.serve import folder as folder_mod
from ciosl.serve import ids as ids_mod
from ciosl.serve import wal
from ciosl.serve.folder import (  # noqa: F401 (the names this module always offered)
    FORMAT,
    KNOWN,
    META,
    POINTER,
    VERSION,
    ServeError,
)

MAX_SECONDS = 30 * 86400  # a time setting above this is a mistake (and overflows a wait)


@dataclass
class Options:
    snapshot_every: int = 100_000  # samples learned between two snapshots (0: never by count)
    snapshot_seconds: float = 300.0  # seconds between two snapshots when there is news (0: never)
    id_window: int = 1_000_000  # how many of the last idempotency ids are remembered
    id_window_bytes: int = 64 * 2**20  # and at most this many bytes of them (the ids file)
    max_group: int = 512  # requests in one group commit at most
    snapshot_on_close: bool = True
    # the writer thread's nice value (Linux: per thread): under load the scheduler gives the
    # CPU to the threads that answer first, so learning slows down before answers do
    writer_nice: int = 10

    def __post_init__(self) -> None:
        """Each value checked, its flag named (one line): a bad one fails at start, never in
        the writer thread later."""
        if not (isinstance(self.snapshot_every, int) and self.snapshot_every >= 0):
            raise ServeError(f"--snapshot-every must be >= 0, got {self.snapshot_every}")
        t = self.snapshot_seconds
        if not (isinstance(t, int | float) and math.isfinite(t) and 0 <= t <= MAX_SECONDS):
            raise ServeError(f"--snapshot-seconds must be a number in 0..{MAX_SECONDS}, got {t}")
        if not 1 <= self.id_window <= 100_000_000:
            raise ServeError(f"--id-window must be in 1..100000000, got {self.id_window}")
        if not 1 << 16 <= self.id_window_bytes <= ids_mod.MAX_WINDOW_BYTES:
            raise ServeError(f"--id-window-bytes must be in {1 << 16}.."
                             f"{ids_mod.MAX_WINDOW_BYTES}, got {self.id_window_bytes}")
        if not 0 <= self.writer_nice <= 19:
            raise ServeError(f"--writer-nice must be in 0..19, got {self.writer_nice}")


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
    makes the same calls), always on an aligned, C-contiguous float32 array: the live path
    and recovery feed the learner the same layout, so they give the same bits."""
    x = np.require(x, np.float32, ["C_CONTIGUOUS", "ALIGNED"])
    if len(y) == 1:
        learner.learn_one(x[0], y[0])
    else:
        learner.learn_many(x, y)


def bad_text(y: list, rid: str | None) -> str | None:
    """What is not valid Unicode text among the labels and the id (a lone surrogate such as
    ``"\\ud800"`` is valid JSON but no text: no file or answer could hold it), or None."""
    for name, v in [*((f"y[{i}]", lab) for i, lab in enumerate(y)), ("id", rid)]:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return (f"{name}: not valid Unicode text (a lone surrogate "
                        f"U+{ord(v[e.start]):04X} at character {e.start})")
    return None


class Service:
    """One learner served from ``folder``. ``open()`` recovers it and starts the writer."""

    def __init__(self, folder: str | Path, method: str | None, settings: dict | None = None,
                 *, options: Options | None = None, on_commit=None, warn=None):
        folder_mod.check_name(folder)
        self.folder = Path(folder)
        self.method, self.settings = method, settings
        self.options = options or Options()
        self.on_commit = on_commit  # (fsync seconds, requests, samples) after each group
        self.warn = warn or _stderr  # one line for the operator (a failed snapshot)
        self.learner: Learner | None = None
        self.seq = 0  # last record number applied and logged
        self.snap_seq, self.snap_time = 0, time.time()
        self.ids = ids_mod.IdWindow(self.options.id_window, self.options.id_window_bytes)
        self.broken: str | None = None
        self._digest: tuple[int, str] | None = None  # (seq, digest) of the last state asked
        self._digest_lock = threading.Lock()  # one digest computed at a time
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
        self._lock_fd = folder_mod.claim(self.folder)
        try:
            self.method, self.settings = folder_mod.check_meta(self.folder, self.method,
                                                               self.settings)
        except BaseException:
            self._release()
            raise

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
                ids = ids_mod.read_ids(f / "snapshots" / ids_file)
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
                bad = bad_text(rec.y, rec.id)
                if bad is not None:
                    raise ServeError(f"--dir {f}: record {rec.seq} of the log: {bad}; it "
                                     "was written by an older ciosl that did not refuse it")
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
        for p in log.glob(".log-*.wal.tmp"):  # a segment whose creation did not finish
            p.unlink(missing_ok=True)
        if tail and tail.get("empty"):  # its header cut by a full disk: made again
            tail["path"].unlink()
            tail.clear()
        if tail:
            self._segment = wal.Segment(tail["path"], tail["base"], create=False,
                                        good_end=tail["good_end"])
        else:
            self._segment = wal.Segment(log / wal.segment_name(self.seq), self.seq, create=True)

    def _remember(self, rid: str | None, seq: int) -> None:
        self.ids.add(rid, seq)

    # ------------------------------------------------------------------ requests
    def submit_learn(self, x: np.ndarray, y: list, rid: str | None) -> cf.Future:
        return self._submit(_Job("learn", x, y, rid))

    def submit_snapshot(self) -> cf.Future:
        return self._submit(_Job("snapshot"))

    def _submit(self, job: _Job) -> cf.Future:
        """Queue ``job``; answered 503 at once when the writer is gone (never left waiting:
        a writer that died answers what reaches it after, too)."""
        if self.dead() is not None and (self._thread is None or not self._thread.is_alive()):
            job.future.set_result(Answer(503, {"error": self.dead()}))
            return job.future
        self._queue.put(job)
        return job.future

    def dead(self) -> str | None:
        """Why learning stopped (a log that cannot be written, a writer that died), or None:
        health answers 503 with it."""
        if self.broken is not None:
            return self.broken
        for t, what in ((self._thread, "writer"), (self._syncer, "log syncer")):
            if t is not None and not t.is_alive():
                return f"the {what} thread stopped; restart the server to recover"
        return None

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
        view = learner.published()
        if view is not None:  # no wait for a learn step
            return {"method": self.method, "seen": int(view.n_seen_),
                    "classes": len(view.classes_), "dim": view.dim_}
        with lock_of(learner):
            return {"method": self.method, "seen": int(learner.n_seen_),
                    "classes": len(learner.classes_), "dim": learner.dim_}

    def state_classes(self) -> list:
        with lock_of(self.learner):
            return list(self.learner.classes_)

    def state(self) -> dict:
        """The learner's state digest with the sequence number it ends at. The lock is held
        only to take the state (its tensors, by the state rule never written again); the
        digest is computed outside it, once per sequence number, one at a time."""
        learner = self.learner
        with self._digest_lock:
            with lock_of(learner):
                seq, seen, classes = self.seq, int(learner.n_seen_), list(learner.classes_)
                cached = self._digest
                state = None if cached is not None and cached[0] == seq else \
                    learner.state_dict()
            if state is not None:
                cached = self._digest = (seq, digest(state))
        return {"seq": seq, "seen": seen, "classes": classes, "digest": cached[1]}

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
        self._in_hand: list[_Job] = []
        try:
            self._write_loop()
        except BaseException as e:  # a bug: learning stops, loudly, and nothing waits for it
            line = _one_line(e)
            if not line.startswith(type(e).__name__):
                line = f"{type(e).__name__}: {line}"
            self.broken = f"the writer stopped ({line}); restart the server to recover"
            self.warn(f"ciosl serve: {self.broken}")
            self._refuse_from_now_on()

    def _refuse_from_now_on(self) -> None:
        """A dead writer's last duty: every job in hand or still to come is answered 503."""
        busy = Answer(503, {"error": self.broken})
        for job in self._in_hand:
            _answer(job, busy)
        while True:
            job = self._queue.get()
            _answer(job, busy)
            if job.kind == "stop":
                with contextlib.suppress(Exception):
                    self._sync_queue.join()
                return

    def _write_loop(self) -> None:
        while True:
            timeout = self.options.snapshot_seconds or None
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                self._maybe_snapshot(idle=True)
                continue
            jobs = self._in_hand = [first]
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
            try:
                self._snapshot()
            except Exception as e:
                self.warn(f"ciosl serve: the snapshot at stop failed ({_one_line(e)}); the "
                          "log keeps every acknowledged learn: a restart recovers them")

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
                                               "seq": self.ids.seq_of(job.rid)})))
                continue
            bad = bad_text(job.y, job.rid)
            if bad is not None:  # before the learner or the log see it
                job.future.set_result(Answer(400, {"error": bad}))
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
                except Exception as e:
                    # applied in memory but not durable: refuse every later learn (a restart
                    # recovers the acknowledged state from the snapshot and the log)
                    why = e.strerror if isinstance(e, OSError) and e.strerror else _one_line(e)
                    self.broken = (f"cannot write the log {self._segment.path} ({why}); "
                                   "restart the server to recover")
                else:
                    if self.on_commit is not None:
                        with contextlib.suppress(Exception):  # metrics: never the syncer's end
                            self.on_commit(time.perf_counter() - t0, len(blobs),
                                           sum(g[2] for g in groups))
            seen = int(self.learner.n_seen_)
            for job, answer in acks:
                if self.broken is not None:
                    answer = Answer(503, {"error": self.broken})
                answer.body.setdefault("seen", seen)
                _answer(job, answer)
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
            try:
                self._snapshot()
            except Exception as e:  # the next one tries again; the log holds all
                self.snap_time = time.time()  # not at once: one line per interval at most
                self.warn(f"ciosl serve: a snapshot failed ({_one_line(e)}); the log keeps "
                          "every acknowledged learn")

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
        self.ids.write(snaps / ids_name)
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


def _answer(job: _Job, answer: Answer) -> None:
    """Answer ``job`` unless it is answered already (a dead writer answers what it held, and
    the syncer may be answering one of them at the same moment)."""
    with contextlib.suppress(cf.InvalidStateError):
        job.future.set_result(answer)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
        out = ids_mod.read_ids(folder / "snapshots" / p["ids"])
    return out + [(r.seq, r.id) for r in wal.iter_log(folder / "log", snap_seq, {})]
