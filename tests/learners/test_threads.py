"""Learners shared by threads: the lock is per learner and outside its state, and a prediction
never waits for a learn step (a published state). One thread learning new classes while others
predict and save is the conformance suite's ``check_threads``, for every learner."""

from __future__ import annotations

import copy
import sys
import threading

import numpy as np
import pytest
import torch

from ciosl import make_learner
from ciosl.learners.base import lock_of
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


def test_the_lock_is_per_learner_and_outside_its_state():
    a, b = make_learner("ncm"), make_learner("ncm")
    assert lock_of(a) is lock_of(a) and lock_of(a) is not lock_of(b)
    import copy
    import pickle

    a.learn_one(np.ones(3, np.float32), 1)
    for twin in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert lock_of(twin) is not lock_of(a)
        assert digest(twin.state_dict()) == digest(a.state_dict())


@pytest.mark.parametrize("method, settings", [
    ("tinyer", {}), ("ciosl", {}), ("ewc", {}), ("ncm", {}), ("slda", {}),
    ("rp_lda", {"proj_dim": 32}), ("ranpac", {"proj_dim": 32}), ("acil", {"proj_dim": 32})])
def test_a_prediction_never_waits_for_a_learn_step(method, settings):
    """While a learn step is held inside its update (holding the learner's lock), another
    thread's predictions answer at once, from the last published state: the classes and
    probabilities from before the step. After the step they include its new class. (The
    closed forms publish their kept answer once a prediction was asked: ``keeps_answer``.)"""
    x, y = _stream()
    learner = make_learner(method, **settings)
    learner.fit_base(x[:12], y[:12])
    before = learner.predict_proba(x[:4])
    inside, release = threading.Event(), threading.Event()
    step = learner._learn_one

    def held(z, yi):
        inside.set()
        assert release.wait(60)
        step(z, yi)

    learner._learn_one = held
    learning = threading.Thread(target=learner.learn_one, args=(x[20], 99))
    learning.start()
    try:
        assert inside.wait(60)
        answers = []
        reader = threading.Thread(target=lambda: answers.append(
            (list(learner.published().classes_), learner.predict_proba(x[:4]),
             learner.predict(x[:4]))))
        reader.start()
        reader.join(60)
        assert not reader.is_alive() and learning.is_alive()  # answered while the step waits
        classes, P, labels = answers[0]
        assert classes == list(range(4)) and 99 not in classes
        np.testing.assert_array_equal(P, before)
        assert set(labels.tolist()) <= set(classes)
    finally:
        release.set()
        learning.join(60)
    del learner._learn_one
    assert learner.classes_[-1] == 99 and learner.predict_proba(x[:4]).shape == (4, 5)


def test_a_published_state_is_read_only():
    x, y = _stream()
    learner = make_learner("tinyer")
    learner.fit_base(x[:12], y[:12])
    view = learner.published()
    learner.learn_one(x[20], 99)
    assert view.classes_ == list(range(4)) and learner.published().classes_[-1] == 99
    with pytest.raises(TypeError, match="published state"):
        view.learn_one(x[0], 0)
    assert make_learner("slda").fit_base(x[:12], y[:12]).published() is None


@pytest.mark.parametrize("method", ["ncm", "finetune"])
def test_a_fault_anywhere_in_a_call_leaves_the_learners_lock_free(method):
    """A KeyboardInterrupt at any line of ciosl's code inside ``learn_one`` and
    ``predict_proba`` (a trace function raises it) never leaves the learner's lock held:
    another thread takes it at once. A ``with lock:`` did, when the fault came at its exit:
    every other thread then waited for good. Nor torch's grad mode off (finetune's step
    runs parts under ``torch.no_grad()``)."""
    from ciosl.conformance_faults import _LineFaults

    rng = np.random.default_rng(0)
    Z = rng.normal(size=(12, D)).astype(np.float32)
    y = [i % 3 for i in range(12)]

    base = make_learner(method)
    base.fit_base(Z[:6], y[:6])
    state = base.state_dict()

    def fresh():
        learner = make_learner(method)
        learner.load_state_dict(copy.deepcopy(state))
        return learner

    def free(learner) -> bool:
        out = []
        t = threading.Thread(target=lambda: out.append(lock_of(learner).acquire(blocking=False)))
        t.start()
        t.join()
        return out == [True]

    calls = {"learn_one": lambda L: L.learn_one(Z[7], y[7]),
             "learn_one (new class)": lambda L: L.learn_one(Z[8], 9),
             "predict_proba": lambda L: L.predict_proba(Z[:2])}
    for what, call in calls.items():
        counter = _LineFaults(None, KeyboardInterrupt)
        with counter:
            call(fresh())
        held, grad_off = [], []
        for k in range(1, counter.n + 1):
            learner = fresh()
            try:
                with _LineFaults(k, KeyboardInterrupt):
                    call(learner)
            except KeyboardInterrupt:
                pass
            if not torch.is_grad_enabled():  # the thread's grad mode, as it was too
                grad_off.append(k)
                torch.set_grad_enabled(True)
            if not free(learner):
                held.append(k)
        assert held == [], f"{method} {what}: the lock stayed held after a fault at lines {held}"
        assert grad_off == [], f"{method} {what}: grad mode left off by a fault at {grad_off}"
