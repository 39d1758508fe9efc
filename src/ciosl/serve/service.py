"""A served learner: one learner in a folder, a single writer thread, a write-ahead log.

The folder (``DIR``) holds ``ciosl-serve.json`` (method, settings), ``snapshot.json`` (which
snapshot is current and the sequence number it ends at), ``snapshots/`` (learner files and the
idempotency ids they cover), ``log/`` (the segments of ``wal``), ``token`` and ``.lock``.

The rule: one writer thread takes learn (and feedback) requests in arrival order and applies
each to the learner (all-or-nothing: a request that raises changes nothing and is not logged); a
syncer thread appends the records of every group waiting as one write, fsyncs once (group
commit) and only then acknowledges them, while the writer applies the next group. Recovery is
the current snapshot plus the log records after it; a snapshot is written
atomically and the log segments it covers are deleted only after it is current. A request whose
id was acknowledged before (within the last ``id_window`` ids) is answered as a duplicate and
learns nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ciosl.fileio import atomic_write_json, load_json
from ciosl.learners.base import Learner, lock_of
from ciosl.learners.registry import get_method
from ciosl.serial import digest
from ciosl.serve import folder as folder_mod
from ciosl.serve import ids as ids_mod
from ciosl.serve import wal
from ciosl.serve.answers import apply_request as _apply  # noqa: F401 (tests: sv._apply)
from ciosl.serve.answers import idle_wait, refresh_answer, seq_of, staleness
from ciosl.serve.common import (  # noqa: F401 (the names this module always offered)
    MAX_SECONDS,
    Options,
    _one_line,
    _stderr,
    bad_text,
    log_ids,
    settings_for,
)
from ciosl.serve.events import EventLog
from ciosl.serve.feedback import Kept, PredictionWindow, novelty_of
from ciosl.serve.folder import (  # noqa: F401 (the names this module always offered)
    FORMAT,
    KNOWN,
    META,
    POINTER,
    VERSION,
    ServeError,
)
from ciosl.serve.score import LiveScore, Rates, same


@dataclass
class Answer:
    """A finished learn request: HTTP ``status`` and the JSON ``body``."""

    status: int
    body: dict


@dataclass
class _Job:
    kind: str  # "learn", "feedback", "snapshot", "stop"
    x: np.ndarray | None = None
    y: list | None = None
    rid: str | None = None
    pids: list | None = None  # feedback: the prediction ids, and the rows kept for them
    kept: list | None = None
    future: cf.Future = field(default_factory=cf.Future)


class Service:
    """One learner served from ``folder``. ``open()`` recovers it and starts the writer."""

    def __init__(self, folder: str | Path, method: str | None, settings: dict | None = None,
                 *, options: Options | None = None, on_commit=None, warn=None,
                 events: EventLog | None = None):
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
        self.score = LiveScore(self.options.feedback_window)  # the live score (score.py)
        self.score_lock = threading.Lock()
        self.window: PredictionWindow | None = None  # the last predictions (feedback.py)
        self.events = events if events is not None else EventLog()
        self.rates = Rates()

    # ------------------------------------------------------------------ folder
    def open(self) -> Service:
        t0 = time.perf_counter()
        self._claim_folder()
        try:
            self._recover()
            staleness(self)  # --answer-every-ms
            self.window = PredictionWindow(self.folder, self.options.feedback_window)
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
                if "score" in p:  # written since the live score exists
                    self.score = LiveScore.from_state(load_json(
                        f / "snapshots" / str(p["score"]), "score file"),
                        self.options.feedback_window)
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
                self._account(rec.y, rec.fb, rec.seq)
                self.seq, self.recovered = rec.seq, self.recovered + 1
        except wal.LogDamaged as e:
            raise ServeError(f"--dir {f}: {e}; refusing to start (the log is never cut in the "
                             "middle)") from None
        self.snap_seq = snap_seq
        self.snap_time = pointer.stat().st_mtime if pointer.exists() else time.time()
        self._segment = wal.open_tail(f / "log", tail, self.seq)

    def _remember(self, rid: str | None, seq: int) -> None:
        self.ids.add(rid, seq)

    def _account(self, y: list, fb: list | None, seq: int) -> None:
        """A record's part in the live score (its feedback rows scored, its labels counted)
        and its prediction ids remembered: the same calls live and in recovery."""
        with self.score_lock:
            for row, lab in zip(fb or (), y, strict=False):
                self.score.scored(lab, row[1], row[2], row[3], row[4])
            self.score.learned(y)
        for row in fb or ():
            self.ids.add(f"fb:{row[0]}", seq)

    # ------------------------------------------------------------------ requests
    def submit_learn(self, x: np.ndarray, y: list, rid: str | None) -> cf.Future:
        return self._submit(_Job("learn", x, y, rid))

    def submit_feedback(self, pids: list[str], kept: list[Kept], y: list) -> cf.Future:
        x = np.stack([k.x for k in kept]).astype(np.float32)
        return self._submit(_Job("feedback", x, y, None, pids, kept))

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

    def predict(self, X: np.ndarray) -> dict:
        """The answer to ``X`` from one state of the learner: its last published state where
        it has one (no wait for a learn step), else under its lock; with a prediction id, a novelty score and a novel flag per row; the rows are kept in the
        prediction window (for feedback) before the answer is given."""
        learner = self.learner
        view = learner.published()
        if view is not None:
            seq, classes = seq_of(self, view), list(view.classes_)  # --answer-every-ms
            P = view.predict_proba(X)
            novelty = novelty_of(view, X, P)
        else:
            with lock_of(learner):
                if not learner.classes_:
                    raise LookupError("nothing learned yet: predict needs at least one class")
                seq, classes = self.seq, list(learner.classes_)
                P = learner.predict_proba(X)
                novelty = novelty_of(learner, X, P)
        labels = [classes[i] for i in P.argmax(axis=1)]
        with self.score_lock:
            threshold = self.score.threshold()
        novel = [threshold is not None and float(v) > threshold for v in novelty]
        pids = self.window.add(X, labels, novelty, len(classes), novel)
        return {"classes": classes, "proba": P.tolist(), "label": labels,
                "prediction_id": pids, "novelty": novelty.tolist(), "novel": novel, "seq": seq}

    def live(self) -> dict:
        """The live score (``score.py``) with the rates, the samples seen and the classes."""
        with self.score_lock:
            out = self.score.figures()
        st = self.status()
        return {**out, "rates": self.rates.figures(), "seen": st["seen"], "seq": self.seq,
                "classes": self.state_classes()}

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
        if self.window is not None:
            self.window.close()
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
            timeout, stale = idle_wait(self)  # a stale answer: brought current when idle
            try:
                first = self._queue.get(timeout=timeout)
            except queue.Empty:
                if stale:
                    refresh_answer(self)
                self._maybe_snapshot(idle=True)
                continue
            jobs = self._in_hand = [first]
            while len(jobs) < self.options.max_group:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._learn_group([j for j in jobs if j.kind in WRITES])
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
        self._learn_group([j for j in rest if j.kind in WRITES])
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
        events: list[tuple[str, dict]] = []
        samples = 0
        for job in jobs:
            if self.broken is not None:
                job.future.set_result(Answer(503, {"error": self.broken}))
                continue
            if job.kind == "feedback":
                x, y, fb, extra = self._fresh_rows(job)
                if not y:  # every prediction id corrected before
                    acks.append((job, Answer(200, {"learned": 0, **extra, "seq": self.seq})))
                    continue
            elif job.rid is not None and job.rid in self.ids:  # acknowledged, or about to be
                acks.append((job, Answer(200, {"learned": 0, "duplicate": True,
                                               "seq": self.ids.seq_of(job.rid)})))
                continue
            else:
                x, y, fb, extra = job.x, job.y, None, {"duplicate": False}
            bad = bad_text(y, job.rid)
            if bad is not None:  # before the learner or the log see it
                job.future.set_result(Answer(400, {"error": bad}))
                continue
            before = len(learner.classes_)
            try:
                _apply(learner, x, y, self.seq + 1)
            except (ValueError, TypeError) as e:
                job.future.set_result(Answer(422, {"error": _one_line(e)}))
                continue
            except Exception as e:  # a learner's failure: all-or-nothing left it unchanged
                job.future.set_result(Answer(500, {"error": _one_line(e)}))
                continue
            self.seq += 1
            blobs.append(wal.encode(self.seq, x, y, job.rid, fb))
            self._remember(job.rid, self.seq)  # a retry queued behind it is its duplicate
            self._account(y, fb, self.seq)
            samples += len(y)
            seen = int(learner.n_seen_)
            acks.append((job, Answer(200, {"learned": len(y), **extra, "seq": self.seq,
                                           "seen": seen})))
            events.append(("learn", {"learned": len(y), "seen": seen, "seq": self.seq}))
            events.extend(("class", {"label": lab}) for lab in learner.classes_[before:])
            events.extend(("feedback", {"prediction_id": row[0], "y": lab, "answered": row[1],
                                        "correct": same(row[1], lab)})
                          for row, lab in zip(fb or (), y, strict=False))
        self._since_snapshot += samples
        if acks:
            self._sync_queue.put((blobs, acks, samples, events))

    def _fresh_rows(self, job: _Job) -> tuple:
        """A feedback request's rows whose prediction id was never corrected (x, y, the
        record's ``fb`` rows) and its answer's ``duplicate`` and ``correct`` lists."""
        classes, taken = self.learner.classes_, set()
        keep, dup = [], []
        for i, pid in enumerate(job.pids):
            dup.append(f"fb:{pid}" in self.ids or pid in taken)
            taken.add(pid)
            if not dup[-1]:
                keep.append(i)
        fb = [[job.pids[i], job.kept[i].answered, job.kept[i].novelty,
               job.y[i] not in classes[:job.kept[i].known], job.kept[i].novel] for i in keep]
        correct = [same(k.answered, lab) for k, lab in zip(job.kept, job.y, strict=True)]
        return (job.x[keep], [job.y[i] for i in keep], fb,
                {"duplicate": dup, "correct": correct})

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
                    for g in groups:
                        for name, data in g[3]:
                            self.events.add(name, data)
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
        score_name = f"score-{s:012d}.json"
        with self.score_lock:
            atomic_write_json(snaps / score_name, self.score.state())
            figures = self.score.figures()
        wal.fsync_dir(snaps)
        self.window.sync()
        atomic_write_json(f / POINTER, {
            "seq": s, "file": name, "ids": ids_name, "score": score_name,
            "seen": int(self.learner.n_seen_), "time": time.time(),
            "classes": len(self.learner.classes_), "feedback": figures["feedback"],
            "accuracy": figures["accuracy"]})
        wal.fsync_dir(f)
        for p in snaps.iterdir():
            if p.name not in (name, ids_name, score_name):
                p.unlink(missing_ok=True)
        for base, p in wal.segments(f / "log"):
            if base < s:
                p.unlink(missing_ok=True)
        self.snap_seq, self.snap_time, self._since_snapshot = s, time.time(), 0
        return {"seq": s, "seen": int(self.learner.n_seen_),
                "seconds": round(time.perf_counter() - t0, 6)}


WRITES = ("learn", "feedback")  # the jobs that write a record


def _answer(job: _Job, answer: Answer) -> None:
    """Answer ``job`` unless it is answered already (a dead writer answers what it held, and
    the syncer may be answering one of them at the same moment)."""
    with contextlib.suppress(cf.InvalidStateError):
        job.future.set_result(answer)


