"""A refused call leaves the learner exactly as it was (``Learner``'s all-or-nothing calls): each
row of a table is a call on a fresh or trained learner that must raise a given one-line error,
then a check that nothing changed (state, random generators, classes)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import (
    D,
    snapshot,
    trained,
)


def huge_at(n: int, pos: int, col: int = 2, value: float = 1e30) -> np.ndarray:
    Z = np.ones((n, D), np.float32)
    Z[pos, col] = value
    return Z


def diverging(learner):
    """The learner's update raises (as a diverging step does) on a sample of a new class."""
    def boom(z, yi):
        raise FloatingPointError("training diverged")
    learner._learn_one = boom
    learner._learn_batch = lambda Z, yi: boom(None, None)
    return learner


# (id, methods, call on a trained learner, error, message pattern): the state is unchanged after
LEARNER_CASES = [
    ("mixed-label-types", ["ncm", "slda", "ciosl", "tinyer"], lambda L: L.learn_one(np.ones(D), "1"),
     TypeError, "label '1' is a string but this learner's labels are integers \\(first: 0\\)"),
    ("mixed-label-types-in-a-batch", ["ncm", "finetune"],
     lambda L: L.learn_many(np.ones((3, D)), [1, "a", 0]), TypeError, "label 'a' is a string"),
    ("score-length", ["ncm", "ciosl"], lambda L: L.score(np.ones((3, D)), [0]), ValueError,
     "score: 3 samples but 1 labels"),
    ("huge-feature-ncm-slda", ["ncm", "slda"], lambda L: L.learn_one(huge_at(1, 0)[0], 0),
     ValueError, "position 0 has feature 2 = 1e\\+30, beyond \\+-1e\\+12"),
    ("huge-feature-in-a-batch", ["ncm", "slda", "ciosl"],
     lambda L: L.learn_many(huge_at(5, 3, value=-3e20), [0] * 5), ValueError,
     "position 3 has feature 2 = -3e\\+20"),
    ("huge-feature-predict", ["slda"], lambda L: L.predict_proba(huge_at(4, 1)), ValueError,
     "position 1 has feature 2"),
    ("new-class-then-raise", ["ciosl", "ncm", "tinyer"],
     lambda L: diverging(L).learn_one(np.ones(D), 9), FloatingPointError, "diverged"),
    ("batch-raises-midway", ["ciosl", "finetune"],
     lambda L: diverging(L).learn_many(np.ones((4, D)), [0, 1, 5, 5]), FloatingPointError,
     "diverged"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in LEARNER_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in LEARNER_CASES for m in c[1]])
def test_learner_refuses_and_stays_unchanged(method, call, error, pattern):
    learner = trained(method)
    before, classes = snapshot(learner), list(learner.classes_)
    with pytest.raises(error, match=pattern):
        call(learner)
    for name in ("_learn_one", "_learn_batch"):
        learner.__dict__.pop(name, None)
    assert learner.classes_ == classes
    assert snapshot(learner) == before


def test_load_state_dict_refusal_leaves_the_learner_unchanged(tmp_path):
    learner = trained("slda")
    before = snapshot(learner)
    bad = learner.state_dict()
    bad["classes"] = [0, 1, 2]  # one class more than the model has
    with pytest.raises(ValueError, match="inconsistent learner state"):
        learner.load_state_dict(bad)
    assert snapshot(learner) == before


# ---------------------------------------------------------------------------- the learners
# (id, methods, call on a FRESH learner, error, pattern): afterwards still fresh
FRESH_CASES = [
    ("zero-width-fit-base", ["ncm", "slda", "ciosl", "tinyer"],
     lambda L: L.fit_base(np.zeros((4, 0)), [0, 1, 0, 1]), ValueError,
     "fit_base: features of width 0"),
    ("zero-width-learn-one", ["ncm", "slda", "ciosl", "tinyer"],
     lambda L: L.learn_one(np.zeros(0), 0), ValueError, "learn_one: features of width 0"),
    ("finite-1e39-is-too-large", ["ncm", "slda"],
     lambda L: L.fit_base(np.array([[1.0, 2.0], [3.0, 1e39]]), [0, 1]), ValueError,
     r"position 1 has feature 1 = 1e\+39, beyond \+-1e\+12: too large"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in FRESH_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in FRESH_CASES for m in c[1]])
def test_fresh_learner_refuses_and_stays_fresh(method, call, error, pattern):
    from ciosl.learners import make_learner

    learner = make_learner(method)
    with pytest.raises(error, match=pattern):
        call(learner)
    assert learner.dim_ is None and learner.classes_ == [] and learner.n_seen_ == 0


TRAINED_CASES = [
    ("finite-1e39-learn-one", ["ncm", "slda", "tinyer"],
     lambda L: L.learn_one(np.r_[np.ones(D - 1), 1e39], 0), ValueError,
     r"position 0 has feature 5 = 1e\+39, beyond \+-1e\+12: too large"),
    ("finite-1e39-predict", ["ncm"],
     lambda L: L.predict_proba(np.r_[np.ones((4, D)), [np.r_[np.ones(D - 1), -2e39]]]),
     ValueError, r"position 4 has feature 5 = -2e\+39, beyond \+-1e\+12: too large"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in TRAINED_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in TRAINED_CASES for m in c[1]])
def test_trained_learner_refuses_and_stays_unchanged(method, call, error, pattern):
    learner = trained(method)
    before, classes = snapshot(learner), list(learner.classes_)
    with pytest.raises(error, match=pattern):
        call(learner)
    assert learner.classes_ == classes and snapshot(learner) == before


@pytest.mark.parametrize("call", ["learn_one", "learn_many"])
def test_a_fault_at_any_line_of_a_new_class_call_leaves_the_classes_consistent(call):
    """A fault at every line of ciosl's code inside a call that brings new classes (the class
    list and its index are written one after the other): afterwards the index holds exactly
    the classes, the state is as before (or, for a fault past the call's commit point, as after
    it), and the learner learns as one that saw no fault."""
    from ciosl.conformance import InjectedFault, _LineFaults
    from ciosl.learners import make_learner
    from ciosl.serial import digest

    rng = np.random.default_rng(0)
    Z, y = rng.normal(size=(30, 6)).astype(np.float32), [0, 1, 2] * 10

    def fresh():
        return make_learner("ncm").fit_base(Z[:9], y[:9])

    def run(learner):
        if call == "learn_one":
            learner.learn_one(Z[9], 7)
        else:
            learner.learn_many(Z[9:12], [7, 1, 8])

    def later(learner):
        learner.learn_many(Z[12:], y[12:])
        return digest(learner.state_dict())

    counter = _LineFaults(None, InjectedFault)
    with counter:
        run(fresh())
    done = fresh()
    run(done)
    outcomes = {digest(fresh().state_dict()): later(fresh()),
                digest(done.state_dict()): later(done)}
    rolled_back = 0
    for k in range(1, counter.n + 1):
        learner = fresh()
        try:
            with _LineFaults(k, InjectedFault):
                run(learner)
        except InjectedFault:
            pass  # else a line that catches what it raises (the call then completes)
        assert learner._class_index == {c: i for i, c in enumerate(learner.classes_)}, k
        now = digest(learner.state_dict())
        assert now in outcomes, k
        assert later(learner) == outcomes[now], k
        rolled_back += len(learner.classes_) == 3
    assert counter.n > 20 and rolled_back > 20  # the calls ran through ciosl's code


class _Where:
    """Where each line fault of ``_LineFaults`` would land: (file name, line) per count."""

    def __init__(self):
        from ciosl.conformance import InjectedFault, _LineFaults

        self.at: list[tuple[str, int]] = []
        outer = self

        class Recording(_LineFaults):
            def _local(self, frame, event, arg):
                if event == "line":
                    outer.at.append((frame.f_code.co_filename.rsplit("/", 1)[-1],
                                     frame.f_lineno))
                return super()._local(frame, event, arg)

        self.injector = Recording(None, InjectedFault)


def _exact_under_line_faults(method: str, settings: dict, call: str, files=None, head=0,
                             tail=0) -> int:
    """Raise a RuntimeError and a KeyboardInterrupt at lines of ciosl's code inside ``call``
    (those in ``files``, the first ``head`` and the last ``tail`` lines of the call; every
    line without any): afterwards the state is as before the call (or as after it, for a
    fault past its commit point), and the learner then answers and learns exactly as a twin
    that never saw the fault (5 more learns, predicting after each; the learner predicted
    before the call, so a kept answer is in play). Returns the faults injected."""
    import copy

    from ciosl.conformance import INT_LABELS, InjectedFault, _LineFaults, class_stream, learn
    from ciosl.learners import available_methods
    from ciosl.serial import digest

    cls = available_methods()[method]
    Zb, yb, Zs, ys = class_stream()
    half = int(np.flatnonzero(ys == 3)[0])
    lab = [INT_LABELS[k] for k in ys]
    state = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                  ys[:half]).state_dict()
    Zt = np.concatenate([Zb[::7], Zs[::7]])
    fn = {"learn_one known": lambda L: L.learn_one(Zs[0], lab[0]),
          "learn_one new": lambda L: L.learn_one(Zs[half], lab[half]),
          "learn_many new": lambda L: L.learn_many(Zs[[0, half, 1]],
                                                   [lab[0], lab[half], lab[1]])}[call]

    def fresh():
        learner = cls(**settings)
        learner.load_state_dict(copy.deepcopy(state))
        learner.predict_proba(Zt)
        return learner

    def later(learner):
        answers = []
        for i in range(half + 1, half + 6):
            learner.learn_one(Zs[i], lab[i])
            answers.append(learner.predict_proba(Zt))
        return digest(learner.state_dict()), np.concatenate(answers).tobytes()

    done = fresh()
    fn(done)  # first: a first call may run more (a class's caches filled)
    where, learner = _Where(), fresh()
    with where.injector:
        fn(learner)
    outcomes = {digest(fresh().state_dict()): later(fresh()),
                digest(done.state_dict()): later(done)}
    n = len(where.at)
    ks = [k for k in range(1, n + 1) if (files is None and not head and not tail)
          or k <= head or k > n - tail or (files and where.at[k - 1][0] in files)]
    tried = 0
    for k in ks:
        for exc in (InjectedFault, KeyboardInterrupt):
            learner = fresh()
            try:
                with _LineFaults(k, exc):
                    fn(learner)
            except (InjectedFault, KeyboardInterrupt):
                tried += 1
            at = f"{exc.__name__} at line {where.at[k - 1]}"
            now = digest(learner.state_dict())
            assert now in outcomes, f"{at} left the state changed"
            assert later(learner) == outcomes[now], f"{at}: later learning differs from a twin's"
    return tried


@pytest.mark.parametrize(("method", "call"), [
    ("ncm", "learn_one known"), ("ncm", "learn_one new"), ("tinyer", "learn_one new"),
    ("agem", "learn_one known"), ("remind", "learn_many new"), ("ciosl", "learn_one new")])
def test_a_fault_opening_or_closing_a_call_leaves_it_before_or_done(method, call):
    """Faults at the first and the last lines of a call: where it opens its record and marks
    itself running, and where it ends the record and publishes. A fault at the try's own line
    once left the call marked running, so every later call skipped its record (and its
    publish); a fault in the publish rolled back a record already ended."""
    settings = {"buffer": 16, "pq_subvectors": 8, "pq_nbits": 3} if method == "remind" else {}
    assert _exact_under_line_faults(method, settings, call, head=12, tail=40) > 40


@pytest.mark.parametrize(("method", "settings", "call"), [
    ("gdumb", {"buffer": 12, "retrain_epochs": 10}, "learn_one new")])
def test_a_fault_inside_the_replay_memory_is_rolled_back_whole(method, settings, call):
    """Faults at every line of the replay memory's code in a step that replaces an item of a
    full memory: a fault between a row's write and its class count once left the counts off
    (the next victim then came from another class)."""
    assert _exact_under_line_faults(method, settings, call, files={"memory.py"}) > 20


@pytest.mark.parametrize(("method", "settings", "call"), [
    ("slda", {}, "learn_one known"), ("slda", {}, "learn_many new"), ("ncm", {}, "learn_one new"),
    ("ranpac", {"proj_dim": 32}, "learn_one known")])
def test_a_rolled_back_call_leaves_the_kept_answer_as_it_was(method, settings, call):
    """Faults at every line of a call of a learner that keeps its answer between predictions
    (catching up on the rows learned since): a rolled-back call once dropped the kept answer,
    and a publish cut short once skipped bringing it current, so the next answers were taken
    afresh where a twin's caught up, and differed in the last bits."""
    assert _exact_under_line_faults(method, settings, call) > 200
