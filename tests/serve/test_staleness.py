"""Bounded staleness of the closed forms' answers (``ciosl serve --answer-every-ms T``, issue
56): a prediction may read an answer published up to T ms before, says the ``seq`` it reflects,
and answers exactly what a learner that learned the records up to that seq answers; when
learning pauses, the answer is brought current; T = 0 (the default) stays exact."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from server_helpers import Server

from ciosl.learners.registry import get_method

GUARD = 60  # seconds: a hang guard only


def _data(seed=0, n=40, d=8):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype(np.float32), [int(v) for v in rng.integers(0, 3, n)]


@pytest.mark.parametrize("method", ["slda", "ncm", "rp_lda", "ranpac"])
def test_a_learner_publishes_at_most_every_answer_every(method):
    Z, y = _data()
    learner = get_method(method)()
    learner._answer_every = 3600.0  # what the server sets from --answer-every-ms
    learner.learn_many(Z[:20], y[:20])
    first = learner.predict_proba(Z[:5])  # catches up and publishes
    view = learner.published()
    learner.learn_many(Z[20:30], y[20:30])
    assert learner.published() is view  # within the bound: the answer stands
    np.testing.assert_array_equal(learner.predict_proba(Z[:5]), first)
    learner._pub_until = 0.0  # the bound has passed: the next learn brings it current
    learner.learn_many(Z[30:], y[30:])
    exact = get_method(method)()
    exact.learn_many(Z[:20], y[:20])
    exact.learn_many(Z[20:30], y[20:30])
    exact.learn_many(Z[30:], y[30:])
    assert learner.published() is not view
    np.testing.assert_allclose(learner.predict_proba(Z[:5]), exact.predict_proba(Z[:5]),
                               rtol=1e-6, atol=1e-9)


def test_a_served_answer_says_the_seq_it_reflects_and_catches_up_when_learning_pauses(
        tmp_path):
    Z, y = _data(1)
    with Server(tmp_path / "stale", "--method", "slda", "--answer-every-ms", "60000") as s, \
            s.client() as c:
        c.learn_many(Z[:20], y[:20])
        first = c.predict_ids(Z[:5])
        assert first["seq"] == 1
        c.learn_many(Z[20:30], y[20:30])
        c.learn_many(Z[30:], y[30:])
        stale = c.predict_ids(Z[:5])
        assert stale["seq"] == 1 and stale["proba"] == first["proba"]  # reflects record 1
    twin = get_method("slda")()
    twin.learn_many(Z[:20], y[:20])
    np.testing.assert_allclose(np.asarray(stale["proba"]), twin.predict_proba(Z[:5]),
                               rtol=1e-6, atol=1e-9)
    with Server(tmp_path / "quick", "--method", "slda", "--answer-every-ms", "50") as s, \
            s.client() as c:
        c.learn_many(Z[:20], y[:20])
        c.predict_ids(Z[:5])
        for a, b in ((20, 25), (25, 30), (30, 40)):
            c.learn_many(Z[a:b], y[a:b])
        deadline = time.monotonic() + GUARD
        seq = c.predict_ids(Z[:5])["seq"]
        while seq != 4 and time.monotonic() < deadline:  # the idle writer brings it current
            time.sleep(0.05)
            seq = c.predict_ids(Z[:5])["seq"]
        assert seq == 4
        twin.learn_many(Z[20:25], y[20:25])
        twin.learn_many(Z[25:30], y[25:30])
        twin.learn_many(Z[30:], y[30:])
        np.testing.assert_allclose(np.asarray(c.predict_ids(Z[:5])["proba"]),
                                   twin.predict_proba(Z[:5]), rtol=1e-6, atol=1e-9)


def test_the_default_is_exact(tmp_path):
    Z, y = _data(2)
    with Server(tmp_path, "--method", "slda") as s, s.client() as c:
        for k, (a, b) in enumerate(((0, 20), (20, 30), (30, 40)), start=1):
            c.learn_many(Z[a:b], y[a:b])
            assert c.predict_ids(Z[:5])["seq"] == k


@pytest.mark.parametrize("value", ["-1", "nan", "60001"])
def test_a_bad_answer_every_is_refused_in_one_line(tmp_path, value):
    r = subprocess.run([sys.executable, "-m", "ciosl", "serve", "--port", "0", "--dir",
                        str(tmp_path / "d"), "--method", "slda", "--answer-every-ms", value],
                       capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "CIOSL_TOKEN": "t" * 20})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1
    assert "--answer-every-ms must be a number in 0..60000" in r.stderr
    assert not (tmp_path / "d").exists()
