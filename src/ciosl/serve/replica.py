"""A served learner whose log is a JetStream stream (``ciosl serve --log nats://...``): the
same public surface as ``service.Service``, for any number of replicas on any machines.

The rule: a learn is validated here as the folder log validates it (labels and id as text,
its width against this learner) and only then published to the learner's stream, with the
request's id as ``Nats-Msg-Id`` (a fresh uuid4 when it has none); it is answered once
JetStream acknowledged it AND this replica applied that sequence (bounded wait). Every replica
applies the stream in order, from its snapshot's seq + 1, in one applier thread: a record whose
id is in the id window is a duplicate (learns nothing); a record that raises in the learner is
skipped and counted (``skipped``), never retried: the learner's all-or-nothing rule left it
unchanged, so every replica stays identical. Two replicas at equal ``seq`` hold equal digests.

Snapshots go to JetStream's object store (``snapshots.py``); a replica starts from the newest
that passes its checksum and applies the stream after it. Prediction ids (for feedback) are
this replica's own (its ``--dir``): feedback sent to another replica is 404 there.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import hashlib
import json
import queue
import secrets
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from ciosl.learners.base import Learner, lock_of
from ciosl.learners.registry import get_method
from ciosl.serve import ids as ids_mod
from ciosl.serve import snapshots, wal
from ciosl.serve.answers import apply_request, idle_wait, refresh_answer, staleness
from ciosl.serve.common import Options, _one_line, _stderr, bad_text
from ciosl.serve.events import EventLog
from ciosl.serve.feedback import Gone, Kept, PredictionWindow, parse_pid
from ciosl.serve.folder import ServeError
from ciosl.serve.jetstream import Log
from ciosl.serve.score import LiveScore, Rates, same
from ciosl.serve.service import Answer, Service

PUBLISH_SECONDS = 5.0  # JetStream's acknowledgement, at most
APPLY_SECONDS = 30.0  # then this replica's applying that seq, at most
STALL_SECONDS = 60.0  # a replica opening, catching up, waits this long for its next record
OUTCOMES = 65536  # the answers of the last records applied, for their waiting requests
TAG = "replica"  # the file of --dir/streams/STREAM naming this replica's prediction ids


class _Job:
    def __init__(self, kind: str):
        self.kind, self.future = kind, cf.Future()


class StreamService:
    """The learner ``name`` (its KV entry ``entry``) applied from its stream; ``folder``:
    this replica's own things for it (prediction window, replica tag)."""

    def __init__(self, log: Log, name: str, entry: dict, folder: str | Path, *,
                 options: Options | None = None, on_commit=None, warn=None,
                 events: EventLog | None = None):
        self.log, self.name = log, name
        self.stream, self.subject = str(entry["stream"]), str(entry["subject"])
        self.method, self.settings = str(entry["method"]), dict(entry["settings"])
        self.folder = Path(folder)
        self.options = options or Options()
        self.on_commit = on_commit
        self.warn = warn or _stderr
        self.learner: Learner | None = None
        self.seq = 0  # the last stream sequence applied (or skipped)
        self.skipped = 0  # records that failed to apply
        self.snap_seq, self.snap_time, self._since_snapshot = 0, time.time(), 0
        self.ids = ids_mod.IdWindow(self.options.id_window, self.options.id_window_bytes)
        self.broken: str | None = None
        self._digest: tuple[int, str] | None = None
        self._digest_lock = threading.Lock()
        self.recovered, self.recovery_seconds = 0, 0.0
        self.score = LiveScore(self.options.feedback_window)
        self.score_lock = threading.Lock()
        self.window: PredictionWindow | None = None
        self.events = events if events is not None else EventLog()
        self.rates = Rates()
        self.tag = ""
        self._queue: queue.Queue = queue.Queue()  # (seq, payload, msg id) records, or jobs
        self._cond = threading.Condition()  # self.seq's progress, waiters, outcomes
        self._waiters: dict[int, list] = {}
        self._outcomes: collections.OrderedDict[int, Answer] = collections.OrderedDict()
        self._delivery = None
        self._thread: threading.Thread | None = None
        self.snapshot_on_close = self.options.snapshot_on_close  # (not for a deleted one)

    # ------------------------------------------------------------------ opening
    def open(self) -> StreamService:
        t0 = time.perf_counter()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tag = _claim(self.log, self.stream, self.folder, _tag(self.folder))
        self._recover()
        staleness(self)
        self.window = _Window(PredictionWindow(self.folder, self.options.feedback_window),
                              self.tag)
        start = self.seq
        last = self.log.stream_info(self.stream)["last_seq"]
        self._thread = threading.Thread(target=self._applier, name="ciosl-applier",
                                        daemon=True)
        self._thread.start()
        self._delivery = self.log.deliver(self.stream, self.subject, self.seq + 1, self._queue)
        seen, since = self.seq, time.monotonic()
        with self._cond:  # caught up with the stream as it was at open before answering
            while self.seq < last and self.dead() is None:
                self._cond.wait(1.0)
                if self.seq != seen:
                    seen, since = self.seq, time.monotonic()
                elif time.monotonic() - since > STALL_SECONDS:
                    self.broken = (f"no record of {self.stream} after seq {self.seq} came "
                                   f"within {STALL_SECONDS:g} s (it ends at {last})")
        if self.dead() is not None:
            self.close()
            raise ServeError(f"learner {self.name!r}: {self.dead()}")
        self.recovered = self.seq - start
        self.recovery_seconds = time.perf_counter() - t0
        return self

    def _recover(self) -> None:
        found = snapshots.newest(self.log, self.stream, self.folder, self.warn)
        if found is not None:
            self._load(*found)
        else:
            self.learner = get_method(self.method)(**self.settings)
        info = self.log.stream_info(self.stream)
        if info["first_seq"] > self.seq + 1 and info["last_seq"] > self.seq:
            raise ServeError(f"learner {self.name!r}: the stream {self.stream} starts at seq "
                             f"{info['first_seq']} and no readable snapshot ends at or after "
                             f"seq {info['first_seq'] - 1} (the newest ends at {self.seq})")

    def _load(self, learner: Learner, header: dict) -> None:
        if learner.name != self.method:
            raise ServeError(f"snapshot of {self.stream}: holds a {learner.name!r} learner, "
                             f"the learner {self.name!r} is {self.method!r}")
        ids = ids_mod.IdWindow(self.options.id_window, self.options.id_window_bytes)
        for seq, rid in header.get("ids", []):
            ids.add(rid, int(seq))
        score = LiveScore.from_state(header["score"], self.options.feedback_window)
        with lock_of(learner):
            self.learner, self.ids, self.score = learner, ids, score
            self.seq = self.snap_seq = int(header["seq"])
            self.skipped = int(header.get("skipped", 0))
        self.snap_time = time.time()

    # ------------------------------------------------------------------ requests
    def submit_learn(self, x: np.ndarray, y: list, rid: str | None) -> cf.Future:
        fut: cf.Future = cf.Future()
        if self.dead() is not None:
            fut.set_result(Answer(503, {"error": self.dead()}))
            return fut
        bad = bad_text(y, rid)
        if bad is not None:  # refused input never enters the stream
            fut.set_result(Answer(400, {"error": bad}))
            return fut
        if rid is not None:
            with contextlib.suppress(KeyError):  # applied here before: no publish
                _answer(fut, Answer(200, {"learned": 0, "duplicate": True,
                                          "seq": self.ids.seq_of(rid)}), self._seen())
                return fut
        payload = wal.payload_of(x, y, rid)
        self.log.submit(self._publish(payload, rid or uuid.uuid4().hex, fut, len(y)))
        return fut

    def submit_feedback(self, pids: list[str], kept: list[Kept], y: list) -> cf.Future:
        """A feedback record (its rows' prediction ids made this replica's own: ``tag/p-N``),
        published and applied like a learn; every replica scores it the same way."""
        fut: cf.Future = cf.Future()
        if self.dead() is not None:
            fut.set_result(Answer(503, {"error": self.dead()}))
            return fut
        bad = bad_text(y, None)
        if bad is not None:
            fut.set_result(Answer(400, {"error": bad}))
            return fut
        x = np.stack([k.x for k in kept]).astype(np.float32)
        classes = list(self.learner.classes_)
        fb = [[f"{self.tag}/{pid}", k.answered, k.novelty, lab not in classes[:k.known],
               k.novel] for pid, k, lab in zip(pids, kept, y, strict=True)]
        mid = "fb:" + hashlib.sha256(json.dumps([fb, y], default=str).encode()).hexdigest()[:40]
        self.log.submit(self._publish(wal.payload_of(x, y, None, fb), mid, fut, -len(y)))
        return fut

    def submit_snapshot(self) -> cf.Future:
        job = _Job("snapshot")
        if self.dead() is not None:
            job.future.set_result(Answer(503, {"error": self.dead()}))
        else:
            self._queue.put(job)
        return job.future

    async def _publish(self, payload: bytes, mid: str, fut: cf.Future, samples: int) -> None:
        """(on the log's loop) Publish, then answer once this replica applied that seq
        (``samples`` < 0: a feedback record of ``-samples`` rows)."""
        t0 = time.perf_counter()
        try:
            seq, dup = await self.log.publish(self.subject, self.stream, payload, mid,
                                              PUBLISH_SECONDS)
        except Exception as e:
            _answer(fut, Answer(503, {"error": f"the log {self.log.text} did not acknowledge "
                                      f"({_one_line(e)}); retry with the same id"}))
            return
        if self.on_commit is not None and not dup:
            with contextlib.suppress(Exception):
                self.on_commit(time.perf_counter() - t0, 1, abs(samples))
        with self._cond:
            if self.seq < seq:
                self._waiters.setdefault(seq, []).append((fut, dup, samples))
                self.log.loop.call_later(APPLY_SECONDS, self._expire, seq, fut)
                return
            answer = self._outcomes.get(seq)
        _answer(fut, _outcome(answer, seq, dup, samples), self._seen())

    def _seen(self) -> int:
        return int(self.learner.n_seen_)

    def _expire(self, seq: int, fut: cf.Future) -> None:
        _answer(fut, Answer(503, {"error": f"the log acknowledged seq {seq}, this replica has "
                                  f"applied up to seq {self.seq} within {APPLY_SECONDS:g} s; "
                                  "retry with the same id"}))

    def wait_applied(self, seq: int, timeout: float) -> bool:
        """Whether this replica has applied ``seq``, waiting up to ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self.seq >= seq or self.broken is not None,
                                       timeout) and self.seq >= seq

    def dead(self) -> str | None:
        if self.broken is not None:
            return self.broken
        if self._thread is not None and not self._thread.is_alive():
            return "the applier thread stopped; restart the server to recover"
        return None

    # the reads are the folder service's own (they read the same attributes)
    predict = Service.predict
    live = Service.live
    status = Service.status
    state_classes = Service.state_classes
    _remember = Service._remember
    _account = Service._account

    def state(self) -> dict:
        return {**Service.state(self), "skipped": self.skipped}

    def close(self) -> None:
        if self._delivery is not None:
            self._delivery.stop()
            self._delivery = None
        if self._thread is not None and self._thread.is_alive():
            if self.snapshot_on_close and self.broken is None and self.seq > self.snap_seq:
                self._queue.put(_Job("snapshot"))  # a reload (or another replica) starts there
            self._queue.put(_Job("stop"))
            self._thread.join()
        with self._cond:
            waiting, self._waiters = self._waiters, {}
        for seq, futs in waiting.items():
            for fut, *_ in futs:
                _answer(fut, Answer(503, {"error": f"the learner {self.name!r} was closed "
                                          f"before applying seq {seq}; retry with the same id"}))
        if self.window is not None:
            self.window.close()
            self.window = None

    # ------------------------------------------------------------------ the applier
    def _applier(self) -> None:
        try:
            while True:
                timeout, stale = idle_wait(self)
                try:
                    item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    if stale:
                        refresh_answer(self)
                    self._maybe_snapshot()
                    continue
                if isinstance(item, tuple):
                    self._record(*item)
                    self._maybe_snapshot()
                elif item.kind == "snapshot":
                    try:
                        item.future.set_result(Answer(200, self._snapshot()))
                    except Exception as e:
                        item.future.set_result(Answer(500, {"error": _one_line(e)}))
                else:
                    return
        except BaseException as e:  # a bug: applying stops, loudly
            self.broken = f"the applier stopped ({_one_line(e)}); restart the server to recover"
            self.warn(f"ciosl serve: learner {self.name!r}: {self.broken}")
            with self._cond:
                self._cond.notify_all()

    def _record(self, seq: int, payload: bytes, mid: str | None) -> None:
        if seq <= self.seq:  # delivered again (the ordered consumer reset)
            return
        if seq != self.seq + 1 and not self._gap(seq):
            return
        try:
            rec = wal.decode_payload(seq, bytes(payload), f"{self.stream} seq {seq}")
            bad = bad_text(rec.y, rec.id)
            if bad is not None:
                raise ValueError(bad)
        except ValueError as e:  # written by no ciosl replica: skipped like a failure
            self._skip(seq, Answer(422, {"error": _one_line(e), "seq": seq, "skipped": True}))
            return
        self._apply(rec)

    def _apply(self, rec: wal.Record) -> None:
        seq, learner = rec.seq, self.learner
        x, y, fb, extra = rec.x, rec.y, rec.fb, {"duplicate": False}
        if fb is not None:  # feedback: the rows whose prediction id was never corrected
            taken, keep, dup = set(), [], []
            for i, row in enumerate(fb):
                dup.append(f"fb:{row[0]}" in self.ids or row[0] in taken)
                taken.add(row[0])
                if not dup[-1]:
                    keep.append(i)
            extra = {"duplicate": dup, "correct": [same(r[1], lab) for r, lab in zip(
                fb, y, strict=True)]}
            x, y, fb = x[keep], [y[i] for i in keep], [fb[i] for i in keep]
            if not y:
                return self._done(seq, Answer(200, {"learned": 0, **extra, "seq": seq}))
        elif rec.id is not None and rec.id in self.ids:  # outside JetStream's window
            return self._done(seq, Answer(200, {"learned": 0, "duplicate": True,
                                                "seq": self.ids.seq_of(rec.id)}))
        before = len(learner.classes_)
        with lock_of(learner):
            try:
                apply_request(learner, x, y, seq)
            except Exception as e:  # all-or-nothing: unchanged, on every replica alike
                status = 422 if isinstance(e, ValueError | TypeError) else 500
                return self._skip(seq, Answer(status, {"error": _one_line(e), "seq": seq,
                                                       "skipped": True}))
            self.seq = seq
        self._remember(rec.id, seq)
        self._account(y, fb, seq)
        self._since_snapshot += len(y)
        seen = int(learner.n_seen_)
        self.events.add("learn", {"learned": len(y), "seen": seen, "seq": seq})
        for lab in learner.classes_[before:]:
            self.events.add("class", {"label": lab})
        for row, lab in zip(fb or (), y, strict=False):
            self.events.add("feedback", {"prediction_id": row[0], "y": lab, "answered": row[1],
                                         "correct": same(row[1], lab)})
        self._done(seq, Answer(200, {"learned": len(y), **extra, "seq": seq, "seen": seen}))

    def _skip(self, seq: int, answer: Answer) -> None:
        with lock_of(self.learner):
            self.skipped += 1
            self.seq = seq
        self.warn(f"ciosl serve: learner {self.name!r}: record {seq} of {self.stream} "
                  f"skipped ({answer.body['error'][:200]})")
        self._done(seq, answer)

    def _done(self, seq: int, answer: Answer) -> None:
        with lock_of(self.learner):
            self.seq = seq
        with self._cond:
            self._outcomes[seq] = answer
            while len(self._outcomes) > OUTCOMES:
                self._outcomes.popitem(last=False)
            waiting = self._waiters.pop(seq, ())
            self._cond.notify_all()
        for fut, dup, samples in waiting:
            _answer(fut, _outcome(answer, seq, dup, samples), self._seen())

    def _gap(self, seq: int) -> bool:
        """Records before ``seq`` were purged (a snapshot covers them): the newest snapshot
        is loaded when it reaches ``seq - 1``; whether ``seq`` is to be applied now."""
        found = snapshots.newest(self.log, self.stream, self.folder, self.warn)
        if found is None or int(found[1]["seq"]) < seq - 1:
            raise RuntimeError(f"records {self.seq + 1}..{seq - 1} of {self.stream} are gone "
                               "and no snapshot covers them")
        self._load(*found)
        self._digest = None
        with self._cond:
            self._cond.notify_all()
        return seq == self.seq + 1

    # ------------------------------------------------------------------ snapshots
    def _maybe_snapshot(self) -> None:
        o = self.options
        if self.broken is not None or self.seq == self.snap_seq:
            return
        due = (o.snapshot_every and self._since_snapshot >= o.snapshot_every) or (
            o.snapshot_seconds and time.time() - self.snap_time >= o.snapshot_seconds)
        if due:
            try:
                self._snapshot()
            except Exception as e:  # the next one tries again; the stream holds all
                self.snap_time = time.time()
                self.warn(f"ciosl serve: learner {self.name!r}: a snapshot failed "
                          f"({_one_line(e)}); the stream keeps every acknowledged learn")

    def _snapshot(self) -> dict:
        """Store this replica's state at ``self.seq`` (the applier thread: no record is
        being applied), unless the store holds one as new already."""
        t0 = time.perf_counter()
        s, learner = self.seq, self.learner
        newest = max((snapshots.seq_of_name(n) or 0 for n in self.log.obj_list(
            self.stream + "/")), default=0)
        if newest < s:
            with self.score_lock:
                score = self.score.state()
            header = {"seq": s, "method": self.method, "settings": self.settings,
                      "skipped": self.skipped, "ids": self.ids.items(), "score": score,
                      "seen": int(learner.n_seen_), "classes": len(learner.classes_),
                      "time": time.time()}
            blob = snapshots.pack(learner, header, self.folder)
            snapshots.store(self.log, self.stream, s, blob)
            self.window.sync()
        self.snap_seq, self.snap_time, self._since_snapshot = max(s, newest), time.time(), 0
        return {"seq": s, "seen": int(learner.n_seen_),
                "seconds": round(time.perf_counter() - t0, 6)}


SPAN = 10**12  # prediction ids of one replica: p-<its number * SPAN + n>


class _Window:
    """This replica's prediction window (``feedback.PredictionWindow``) whose ids are
    numbered from the replica's own offset: an id another replica issued is 404 here, never
    taken for one of this replica's predictions."""

    def __init__(self, inner: PredictionWindow, tag: str):
        self.inner, self.offset = inner, (int(tag, 16) % 99_999 + 1) * SPAN

    def add(self, X, answered, novelty, known, novel) -> list[str]:
        return [f"p-{self.offset + int(p[2:])}" for p in self.inner.add(
            X, answered, novelty, known, novel)]

    def get(self, pid: str, field: str = "prediction_id") -> Kept:
        local = parse_pid(pid, field) - self.offset
        if not 0 <= local < SPAN:
            raise Gone(404, f"{field} {pid}: not issued by this replica (a prediction's "
                       "features are kept by the replica that answered it: send its feedback "
                       "there)")
        try:
            return self.inner.get(f"p-{local}", field)
        except Gone as e:
            raise Gone(e.status, str(e).replace(f"p-{local}:", f"{pid}:", 1)) from None

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


def _outcome(answer: Answer | None, seq: int, dup: bool, samples: int) -> Answer:
    """The answer to a request published as ``seq`` (a JetStream duplicate of ``seq``: it
    learned nothing; ``samples`` < 0: feedback rows, whose duplicates are one per row)."""
    if dup and answer is not None and answer.status != 200:  # the original failed: so did it
        return Answer(answer.status, dict(answer.body))
    if dup and samples < 0:
        correct = answer.body.get("correct") if answer is not None else None
        return Answer(200, {"learned": 0, "duplicate": [True] * -samples, "seq": seq,
                            **({"correct": correct} if correct is not None else {})})
    if dup:
        return Answer(200, {"learned": 0, "duplicate": True, "seq": seq})
    if answer is None:  # applied long ago (its outcome forgotten): it was learned
        return Answer(200, {"learned": abs(samples), "duplicate": False, "seq": seq})
    return Answer(answer.status, dict(answer.body))


def _answer(fut: cf.Future, answer: Answer, seen: int | None = None) -> None:
    if seen is not None and answer.status == 200:
        answer.body.setdefault("seen", seen)
    with contextlib.suppress(cf.InvalidStateError):
        fut.set_result(answer)


def _claim(log: Log, stream: str, folder: Path, tag: str) -> str:
    """``tag``, once its offset (``_Window``) is this replica's alone for ``stream``: claimed
    by a KV ``create`` of ``replica.<stream>.<offset>`` (a key no learner's name can be); a
    tag whose offset another replica holds is drawn again, so that two replicas never issue
    the same prediction id (feedback sent to the wrong one would correct another answer)."""
    for _ in range(32):
        key = f"replica.{stream}.{int(tag, 16) % 99_999 + 1}"
        if log.kv_create(key, tag.encode()) or log.kv_get(key) == tag.encode():
            return tag
        tag = secrets.token_hex(6)
        (folder / TAG).write_text(tag + "\n")
    raise ServeError(f"learner stream {stream}: no free prediction-id offset after 32 draws")


def _tag(folder: Path) -> str:
    """This replica's name for its prediction ids (``--dir``'s own, kept in a file)."""
    path = folder / TAG
    if path.exists():
        tag = path.read_text().strip()
        with contextlib.suppress(ValueError):
            int(tag, 16)
            return tag
    tag = secrets.token_hex(6)
    path.write_text(tag + "\n")
    return tag
