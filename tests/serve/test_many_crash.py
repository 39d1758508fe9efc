"""SIGKILL of a server of three learners, 20 times, while each is taught, asked and corrected at
once: each recovers exactly its acknowledged learns and feedback (none twice, none lost), its
state is the replay of its log, bit for bit, and its live score is the replay of its log too
(and agrees with what the clients saw: how many answers were corrected, how many were right)."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
from server_helpers import Server

from ciosl import make_learner
from ciosl.serial import digest
from ciosl.serve import wal
from ciosl.serve.score import LiveScore

KILLS = 20
NAMES = ("default", "l1", "l2")


def _script(seed, d=5):
    """A learner's operations: learns (id -> features, labels) and questions (rows, true
    labels); labels 8 and 9 only ever come as feedback (classes new at the time)."""
    rng = np.random.default_rng(seed)
    learns, questions = {}, {}
    for i in range(400):
        y = [int(v) for v in rng.integers(0, 8, size=int(rng.integers(1, 4)))]
        learns[f"s{seed}-r{i}"] = (rng.normal(size=(len(y), d)).astype(np.float32)
                                   + np.asarray(y, np.float32)[:, None], y)
    for i in range(260):
        y = [int(v) for v in rng.integers(0, 10, size=int(rng.integers(1, 3)))]
        questions[f"q{i}"] = (rng.normal(size=(len(y), d)).astype(np.float32)
                              + np.asarray(y, np.float32)[:, None], y)
    ops = collections.deque()
    qs = iter(questions)
    for i, rid in enumerate(learns):
        ops.append(("learn", rid))
        if i % 3 == 2:
            ops.append(("ask", next(qs)))
    ops.extend(("ask", q) for q in qs)
    return learns, questions, ops


class Learner:
    def __init__(self, name, seed):
        self.name = name
        self.learns, self.questions, self.ops = _script(seed)
        self.acked: set[str] = set()
        self.answers: dict[str, tuple] = {}  # pid -> (features, true y, the answer)
        self.corrected: dict[str, dict] = {}  # pid -> its first acknowledged feedback answer
        self.done = 0  # operations answered (a kill waits for a number of them, not a time)

    def run(self, server, stop):
        with server.client(learner=self.name, retries=0, timeout=10) as c:
            while self.ops and not stop.is_set():
                op = self.ops.popleft()
                try:
                    self._do(c, op)
                except Exception:  # noqa: BLE001 (killed: its fate is unknown, send it again)
                    self.ops.appendleft(op)
                    return
                self.done += 1

    def _do(self, c, op):
        kind, key = op
        if kind == "learn":
            x, y = self.learns[key]
            c.learn_many(x, y, id=key)
            self.acked.add(key)
        elif kind == "ask":
            x, y = self.questions[key]
            a = c.predict_ids(x)
            for i, pid in enumerate(a["prediction_id"]):
                self.answers[pid] = (x[i], y[i], a["label"][i], y[i] not in a["classes"])
                self.ops.appendleft(("correct", pid))
        else:
            answer = c.feedback(key, self.answers[key][1])
            if not answer["duplicate"][0]:
                assert key not in self.corrected, f"{key} learned twice"
                self.corrected[key] = answer
            self.corrected.setdefault(key, answer)


def _records(folder):
    return list(wal.iter_log(folder / "log", 0, {}))  # no snapshot: the whole log


def test_sigkill_while_three_learners_are_taught_asked_and_corrected(tmp_path):
    learners = [Learner(n, i) for i, n in enumerate(NAMES)]
    rng = np.random.default_rng(7)
    flags = ["--snapshot-every", "0", "--snapshot-seconds", "0"]
    finals = {}
    busy, cycle = 0, -1  # kills while some script still had work: at least KILLS of them
    while True:
        cycle += 1
        last = busy >= KILLS or not any(lr.ops for lr in learners)
        with Server(tmp_path, *(["--method", "ncm"] if cycle == 0 else []), *flags) as s:
            if cycle == 0:
                with s.http() as h:
                    for name in NAMES[1:]:
                        assert h.post("/v1/learners", json={"name": name, "method": "ncm"}
                                      ).status_code == 201
            stop = threading.Event()
            threads = [threading.Thread(target=lr.run, args=(s, stop)) for lr in learners]
            for t in threads:
                t.start()
            if not last:  # SIGKILL mid-load, after 5-40 answered operations of this life
                # (counted, not timed: on a quick machine a timed kill came after the scripts'
                # end; 20 lives of at most 40 leave most of the ~3,000 operations to go)
                start, target = sum(lr.done for lr in learners), int(rng.integers(5, 41))
                deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
                while (sum(lr.done for lr in learners) - start < target
                       and any(t.is_alive() for t in threads)):
                    assert time.monotonic() < deadline, "no progress within 300 s"
                    time.sleep(0.005)
                s.kill()
                stop.set()
                for t in threads:
                    t.join()
                busy += any(lr.ops for lr in learners)
            else:  # the last life: finish every script, then read each state and score
                for t in threads:
                    t.join()
                for lr in learners:
                    with s.client(learner=lr.name) as c:
                        finals[lr.name] = (c.state(), c.live())
                s.kill()  # the log stays whole (a clean stop would snapshot and drop it)
                break
    assert busy >= KILLS, f"only {busy} kills under load"
    for lr in learners:
        assert not lr.ops, f"{lr.name}: unfinished"
        folder = tmp_path if lr.name == "default" else tmp_path / "learners" / lr.name
        records = _records(folder)
        learned = [r.id for r in records if r.fb is None]
        fed = [row[0] for r in records if r.fb is not None for row in r.fb]
        assert len(learned) == len(set(learned)) and set(learned) == set(lr.learns) \
            == lr.acked
        assert len(fed) == len(set(fed)) and set(fed) == set(lr.corrected) == set(lr.answers)
        ref, score = make_learner("ncm"), LiveScore(10_000)
        for r in records:  # the log replayed: the state, and the score, as the server holds
            x = lr.learns[r.id][0] if r.fb is None else np.stack(
                [lr.answers[row[0]][0] for row in r.fb])
            assert np.array_equal(x, r.x)
            (ref.learn_one(x[0], r.y[0]) if len(r.y) == 1 else ref.learn_many(x, r.y))
            for row, lab in zip(r.fb or (), r.y, strict=False):
                score.scored(lab, row[1], row[2], row[3], row[4])
            score.learned(r.y)
        state, live = finals[lr.name]
        assert digest(ref.state_dict()) == state["digest"]
        expected = score.figures()
        for key in ("feedback", "accuracy", "accuracy_last", "recall", "counts", "confusion",
                    "new_class", "threshold"):
            assert live[key] == expected[key], (lr.name, key)
        right = sum(lr.answers[p][2] == lr.answers[p][1] for p in lr.corrected)
        assert live["feedback"] == len(lr.answers) and live["accuracy"] == right / len(
            lr.answers)  # what the clients saw
        assert live["new_class"]["n"] >= 1
