"""Predictions asked together answered in one call of the learner (``ciosl.serve.coalesce``):
what waits while a call runs is answered by the next one, each request gets its own rows in
order, a request alone is answered at once, a failure fails only the requests of its call, and
a bad width only its own group. Counted, never timed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ciosl.serve.coalesce import MAX_ROWS, Coalescer

GUARD = 60  # seconds: a hang guard only


class Gate:
    """A learner's predict (each row's label is its first feature) that holds its first call
    until released; refuses a width other than 3, and a row whose first feature is -1."""

    def __init__(self):
        self.release, self.entered = threading.Event(), threading.Event()
        self.calls: list[list[float]] = []

    def __call__(self, X: np.ndarray) -> dict:
        self.calls.append(X[:, 0].tolist())
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(GUARD)
        if X.shape[1] != 3:
            raise ValueError(f"x: expected width 3, got {X.shape[1]}")
        if (X[:, 0] == -1).any():
            raise RuntimeError("the learner failed")
        n = len(X)
        return {"classes": ["a"], "seq": 7, "proba": X[:, :1].tolist(),
                "label": X[:, 0].tolist(), "prediction_id": [f"p{v:g}" for v in X[:, 0]],
                "novelty": (X[:, 0] * 2).tolist(), "novel": [False] * n}


def _rows(first, n=1, width=3):
    return np.arange(first, first + n, dtype=np.float32)[:, None].repeat(width, 1)


def _wait_for(c: Coalescer, n: int) -> None:
    while len(c._waiting) < n:
        threading.Event().wait(0.005)


def test_requests_waiting_together_are_answered_in_one_call():
    gate = Gate()
    c = Coalescer(gate)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(c, _rows(0))
        assert gate.entered.wait(GUARD)
        rest = [pool.submit(c, _rows(10 * i, n=i)) for i in range(1, 9)]
        _wait_for(c, 8)
        gate.release.set()
        out = [f.result(GUARD) for f in rest]
    assert first.result(GUARD)["label"] == [0.0]
    assert len(gate.calls) == 2 and len(gate.calls[1]) == sum(range(1, 9))  # one call, 36 rows
    for i, answer in enumerate(out, start=1):
        want = [float(v) for v in range(10 * i, 10 * i + i)]
        assert answer["label"] == want and [p[0] for p in answer["proba"]] == want
        assert answer["prediction_id"] == [f"p{v:g}" for v in want]
        assert answer["novelty"] == [v * 2 for v in want] and answer["novel"] == [False] * i
        assert answer["classes"] == ["a"] and answer["seq"] == 7
    assert (c.calls, c.requests) == (2, 9)


def test_a_request_alone_is_answered_at_once_by_its_own_call():
    calls = []

    def predict(X):
        calls.append(len(X))
        return {"classes": ["a"], "label": ["a"] * len(X), "seq": 1}

    c = Coalescer(predict)
    for n in (1, 5, 2):
        assert c(_rows(0, n))["label"] == ["a"] * n
    assert calls == [1, 5, 2] and not c._answering and not c._waiting


def test_a_failed_call_fails_only_its_requests_and_a_bad_width_only_its_group():
    gate = Gate()
    c = Coalescer(gate)
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(c, _rows(0))
        assert gate.entered.wait(GUARD)
        good = pool.submit(c, _rows(5, 2))
        wide = pool.submit(c, _rows(8, 1, width=4))  # the wrong width: its own group
        _wait_for(c, 2)
        gate.release.set()
        assert good.result(GUARD)["label"] == [5.0, 6.0]
        with pytest.raises(ValueError, match="expected width 3, got 4"):
            wide.result(GUARD)
        assert first.result(GUARD)["label"] == [0.0]
    gate2 = Gate()
    gate2.release.set()
    c2 = Coalescer(gate2)
    with pytest.raises(RuntimeError, match="the learner failed"):
        c2(_rows(-1))
    assert c2(_rows(3))["label"] == [3.0]  # the next call is answered as usual
    assert not c2._answering


def test_a_call_takes_at_most_max_rows_and_the_rest_is_answered_next():
    gate = Gate()
    c = Coalescer(gate)
    big = MAX_ROWS // 2 + 1
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(c, _rows(0))
        assert gate.entered.wait(GUARD)
        a = pool.submit(c, _rows(1000, big))
        _wait_for(c, 1)
        b = pool.submit(c, _rows(5000, big))
        _wait_for(c, 2)
        gate.release.set()
        assert a.result(GUARD)["label"][0] == 1000.0
        assert b.result(GUARD)["label"][-1] == 5000.0 + big - 1
        first.result(GUARD)
    assert [len(k) for k in gate.calls] == [1, big, big]  # two rounds: over MAX_ROWS together


def test_many_threads_each_get_their_own_rows():
    """16 threads asking 200 times each, the calls answering whatever waits: every answer is
    its own request's rows, and the calls are fewer than the requests."""
    seen = []

    def predict(X):
        seen.append(len(X))
        threading.Event().wait(0.0005)  # a call takes a while: others queue meanwhile
        return {"classes": ["a"], "label": X[:, 0].tolist(), "seq": 0}

    c = Coalescer(predict)

    def client(i):
        for k in range(200):
            v = float(i * 1000 + k)
            assert c(np.full((1, 3), v, np.float32))["label"] == [v]

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(client, i) for i in range(16)]:
            f.result(GUARD)
    assert c.requests == 16 * 200 and sum(seen) == 16 * 200
    assert c.calls == len(seen) < 16 * 200 and not c._answering and not c._waiting
