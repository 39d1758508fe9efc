"""Every learner shared by threads: one thread learns a stream of new classes while others
predict and save. No call raises, every answer's shape agrees with the classes it came with, and
every saved file loads into a state the learner really passed through (the learner's lock
serialises its public calls)."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from ciosl import available_methods, make_learner
from ciosl.learners.base import Learner, lock_of
from ciosl.serial import digest

N, D = 90, 6


@pytest.fixture(autouse=True)
def _switch_often():
    """Threads switch every microsecond (not every 5 ms): a race the lock did not prevent would
    show within these few calls."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _stream():
    rng = np.random.default_rng(0)
    y = np.arange(N) // 3  # a new class every third sample
    x = rng.normal(size=(N, D)).astype(np.float32) + 0.3 * y[:, None]
    return x, [int(v) for v in y]


@pytest.mark.parametrize("method", sorted(available_methods()))
def test_one_thread_learns_while_others_predict_and_save(method, tmp_path):
    x, y = _stream()
    learner = make_learner(method)
    learner.fit_base(x[:12], y[:12])  # REMIND trains its quantizer there
    passed: set[str] = set()
    errors: list[str] = []
    saved: list = []
    done = threading.Event()

    def learn():
        try:
            for i in range(12, N):
                with lock_of(learner):  # the states it passes through, each recorded
                    learner.learn_one(x[i], y[i])  # before another thread can save it
                    passed.add(digest(learner.state_dict()))
        except Exception as e:  # noqa: BLE001 (asserted below)
            errors.append(f"learn: {e!r}")
        finally:
            done.set()

    def predict():
        while not done.is_set():
            try:
                with lock_of(learner):
                    classes = list(learner.classes_)
                    P = learner.predict_proba(x[:4])
                    passed.add(digest(learner.state_dict()))  # a retraining learner's moves
                if P.shape != (4, len(classes)):
                    errors.append(f"predict: shape {P.shape} for {len(classes)} classes")
                if learner.violates_single_pass:  # it retrains to answer: record where to
                    with lock_of(learner):
                        learner.predict(x[:4])
                        passed.add(digest(learner.state_dict()))
                else:  # a call of its own, racing the learning thread but for the lock
                    learner.predict(x[:4])
            except Exception as e:  # noqa: BLE001
                errors.append(f"predict: {e!r}")

    def save():
        k = 0
        while not done.is_set() and k < 5:
            path = tmp_path / f"s{k}.ciosl"
            try:
                learner.save(path)
                saved.append(path)
            except Exception as e:  # noqa: BLE001
                errors.append(f"save: {e!r}")
            k += 1

    with lock_of(learner):
        passed.add(digest(learner.state_dict()))
    threads = [threading.Thread(target=f) for f in (learn, predict, predict, save)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert saved
    for path in saved:
        assert digest(Learner.load(path).state_dict()) in passed


def test_the_lock_is_per_learner_and_outside_its_state():
    a, b = make_learner("ncm"), make_learner("ncm")
    assert lock_of(a) is lock_of(a) and lock_of(a) is not lock_of(b)
    import copy
    import pickle

    a.learn_one(np.ones(3, np.float32), 1)
    for twin in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert lock_of(twin) is not lock_of(a)
        assert digest(twin.state_dict()) == digest(a.state_dict())
