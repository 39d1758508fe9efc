"""The conformance suite's all-or-nothing checks: a failure injected after an update
(``check_failure_rolls_back``), a non-finite step (``check_nonfinite_step_rolls_back``), faults
at every torch operation and line of ciosl's code (``check_faults``), and threads sharing a
learner (``check_threads``)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import numpy as np
import torch

from ciosl.conformance_data import INT_LABELS, _raises, class_stream, fitted, held_out, learn
from ciosl.learners.base import Learner


class InjectedFailure(RuntimeError):
    """The failure ``check_failure_rolls_back`` injects inside an update."""


@contextlib.contextmanager
def failing_after(learner: Learner, method: str, at: int = 1):
    """Make ``learner.<method>`` (an update: ``_learn_one``, ``_learn_batch``, ``_fit_base``)
    raise ``InjectedFailure`` right after its ``at``-th call has run to the end, when every
    class of the call has grown the model and the update has changed what it changes."""
    original, calls = getattr(learner, method), [0]

    def failing(*args, **kwargs):
        out = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == at:
            raise InjectedFailure(f"failure injected after {method}")
        return out

    setattr(learner, method, failing)
    try:
        yield
    finally:
        delattr(learner, method)


def check_failure_rolls_back(cls, settings) -> None:
    """(9b) All-or-nothing: a failure inside the update, after the new classes have grown the
    model, leaves the learner exactly as before -- state_dict equal bit for bit, and the same
    continued learning as a twin that never failed -- for learn_one with a new label,
    learn_many with new and known labels (a new one first, and last), and fit_base with a new
    class."""
    from ciosl.serial import digest

    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    half = int(np.flatnonzero(ys == 3)[0])  # classes 3 and 4 still to come
    lab = [INT_LABELS[k] for k in ys]

    def build() -> Learner:
        return learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                     ys[:half])

    learner, twin = build(), build()
    batch = list(range(half, half + 3)) + [0]  # a new class, then a known one
    base_Z = np.concatenate([Zb[:4], Zs[-1:]])  # a base set with the last class (new)
    base_y = [INT_LABELS[k] for k in yb[:4]] + [lab[-1]]
    many = "_learn_batch" if learner._has_batch_update() else "_learn_one"
    attempts = [("learn_one", "_learn_one", 1, lambda: learner.learn_one(Zs[half], lab[half])),
                ("learn_many", many, 1 if many == "_learn_batch" else len(batch),
                 lambda: learner.learn_many(Zs[batch], [lab[i] for i in batch])),
                ("learn_many", many, 1 if many == "_learn_batch" else len(batch),
                 lambda: learner.learn_many(Zs[batch[::-1]], [lab[i] for i in batch[::-1]])),
                ("fit_base", "_fit_base", 1, lambda: learner.fit_base(base_Z, base_y))]
    before = digest(learner.state_dict())
    for what, method, at, call in attempts:
        with failing_after(learner, method, at), _raises(InjectedFailure):
            call()
        assert learner.classes_ == twin.classes_ and learner.n_seen_ == twin.n_seen_, (
            f"{what} failed inside its update but left classes_ or n_seen_ changed")
        assert digest(learner.state_dict()) == before, (
            f"{what} failed inside its update (after growth) but left the state changed")
    np.testing.assert_array_equal(learner.predict_proba(Zt), twin.predict_proba(Zt))
    for z in (learner, twin):
        learn(z, Zs[half:], ys[half:])
        z.learn_many(Zs[batch], [lab[i] for i in batch])
    assert digest(learner.state_dict()) == digest(twin.state_dict()), (
        "after a rolled-back failure the learner continues differently from a twin")
    np.testing.assert_array_equal(learner.predict_proba(Zt), twin.predict_proba(Zt))


def check_nonfinite_step_rolls_back(cls, settings) -> None:
    """(9c) All-or-nothing for a known class: a ``learn_one`` whose step finds a non-finite
    loss (the learner's ``_check_finite`` raises, as a diverging step makes it) leaves the
    learner exactly as before, three times in a row -- what such a step changes before its
    check (a prior or anchor refresh, the counters that schedule it) is put back -- and it
    continues as a twin that never failed. A learner without ``_check_finite``, or whose
    ``learn_one`` of a known class reaches none, has no such step."""
    from ciosl.serial import digest

    if not hasattr(cls, "_check_finite"):
        return
    learner, twin = fitted(cls, settings), fitted(cls, settings)
    _, _, Zs, ys = class_stream()
    Zt, _ = held_out()
    before = digest(learner.state_dict())
    reached = [0]

    def non_finite(*args, **kwargs):
        reached[0] += 1
        raise FloatingPointError("injected: the step's loss is not finite")

    learner._check_finite = non_finite
    try:
        for i in range(3):
            try:
                learner.learn_one(Zs[i], INT_LABELS[ys[i]])
            except FloatingPointError:
                pass
            if not reached[0]:  # no finite check on this learner's path: nothing to test
                return
            assert digest(learner.state_dict()) == before, (
                f"a known-class learn_one failed at its finite check ({i + 1} time(s)) but "
                "left the state changed")
            assert learner.n_seen_ == twin.n_seen_ and learner.classes_ == twin.classes_
    finally:
        del learner._check_finite
    np.testing.assert_array_equal(learner.predict_proba(Zt), twin.predict_proba(Zt))
    for z in (learner, twin):
        learn(z, Zs[:5], ys[:5])
    assert digest(learner.state_dict()) == digest(twin.state_dict()), (
        "after a rolled-back non-finite step the learner continues differently from a twin")


class InjectedFault(RuntimeError):
    """The fault ``check_faults`` raises at a torch operation or a line of ciosl's code."""


class _TorchFaults(torch.overrides.TorchFunctionMode):
    """Counts the torch operations run under it; raises ``exc`` at the ``at``-th (1-based)."""

    def __init__(self, at: int | None, exc: type[BaseException]):
        super().__init__()
        self.n, self.at, self.exc = 0, at, exc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        if self.n == self.at:
            raise self.exc(f"fault injected at torch operation {self.n} ({func})")
        return func(*args, **(kwargs or {}))


_CIOSL = os.path.dirname(os.path.abspath(__file__)) + os.sep
_SUITE = os.path.join(_CIOSL, "conformance")  # the suite's own files are not counted


class _LineFaults:
    """Counts the lines of ciosl's own code (not this file's) run under it (``sys.settrace``);
    raises ``exc`` at the ``at``-th."""

    def __init__(self, at: int | None, exc: type[BaseException]):
        self.n, self.at, self.exc = 0, at, exc

    def _local(self, frame, event, arg):
        if event == "line":
            self.n += 1
            if self.n == self.at:
                raise self.exc(f"fault injected at line {frame.f_lineno} of "
                               f"{os.path.basename(frame.f_code.co_filename)}")
        return self._local

    def _global(self, frame, event, arg):
        f = frame.f_code.co_filename
        return self._local if f.startswith(_CIOSL) and not f.startswith(_SUITE) else None

    def __enter__(self):
        self._old = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._old)
        return False


FAULT_POINTS = 4  # injection points per call and kind (evenly spaced, the first and the last)


def check_faults(cls, settings) -> None:
    """(9d) All-or-nothing under real faults: a ``RuntimeError`` or a ``KeyboardInterrupt``
    raised at a torch operation, or at a line of ciosl's code, inside ``learn_one`` (a known
    and a new class), ``learn_many`` (a new class among known ones) and ``fit_base`` (on a
    fresh learner) leaves the state digest as before the call -- or, for a fault past the
    call's commit point, as after the complete call -- and the learner then learns exactly as a
    twin that never saw the fault. ``FAULT_POINTS`` points per call and kind."""
    import copy

    from ciosl.serial import digest

    Zb, yb, Zs, ys = class_stream()
    half = int(np.flatnonzero(ys == 3)[0])  # classes 3 and 4 still to come
    lab = [INT_LABELS[k] for k in ys]
    base_y = [INT_LABELS[k] for k in yb]
    state = learn(cls(**settings).fit_base(Zb, base_y), Zs[:half], ys[:half]).state_dict()

    def fresh(fitted_: bool) -> Learner:
        learner = cls(**settings)
        if fitted_:
            learner.load_state_dict(copy.deepcopy(state))
        return learner

    calls = {"learn_one (known class)": (True, lambda L: L.learn_one(Zs[0], lab[0])),
             "learn_one (new class)": (True, lambda L: L.learn_one(Zs[half], lab[half])),
             "learn_many": (True, lambda L: L.learn_many(Zs[[0, half, 1]],
                                                         [lab[0], lab[half], lab[1]])),
             "fit_base": (False, lambda L: L.fit_base(Zb, base_y))}

    def later(learner: Learner) -> str:
        if learner.dim_ is None:
            learner.fit_base(Zb, base_y)
        learn(learner, Zs[half + 1:half + 6], ys[half + 1:half + 6])
        return digest(learner.state_dict())

    def digest_of(learner: Learner) -> str | None:
        return None if learner.dim_ is None else digest(learner.state_dict())

    def run(fitted_: bool, call: Callable, injector) -> tuple[Learner, bool]:
        learner = fresh(fitted_)
        grad = torch.is_grad_enabled()
        try:
            with injector:
                call(learner)
        except (Exception, KeyboardInterrupt):  # the fault, or an error the learner made of it
            return learner, True
        finally:  # torch's global grad mode is the process's, not the learner's
            torch.set_grad_enabled(grad)
        return learner, False

    for what, (fitted_, call) in calls.items():
        before_learner = fresh(fitted_)
        before = digest_of(before_learner)
        done_learner = fresh(fitted_)
        call(done_learner)
        done = digest_of(done_learner)
        outcomes = {before: later(before_learner), done: later(done_learner)}
        for kind, injector in (("torch operation", _TorchFaults), ("line", _LineFaults)):
            counter = injector(None, InjectedFault)
            run(fitted_, call, counter)
            ks = sorted({int(round(v)) for v in np.linspace(1, counter.n, FAULT_POINTS)})
            for i, k in enumerate(ks):
                exc = KeyboardInterrupt if i % 2 else InjectedFault
                learner, raised = run(fitted_, call, injector(k, exc))
                if not raised:  # the learner caught the fault itself and went on
                    continue
                now = digest_of(learner)
                where = f"{what}: {exc.__name__} at {kind} {k} of {counter.n}"
                assert now in outcomes, f"{where} left the state changed (neither before " \
                    "nor after the call)"
                assert later(learner) == outcomes[now], (
                    f"{where}: the state digest is unchanged, but the learner then learns "
                    "differently from a twin that never saw the fault (state kept outside "
                    "state_dict?)")


def check_threads(cls, settings) -> None:
    """(9e) Shared by threads: one thread learns a stream whose every third sample brings a new
    class while two threads predict and one saves state dicts (threads switching every
    microsecond). No call raises, every answer's shape agrees with the classes it came with,
    and every file saved meanwhile loads into a state the learner really passed through."""
    import tempfile
    import threading
    from pathlib import Path

    from ciosl.learners.base import lock_of
    from ciosl.serial import digest

    Zb, yb, Zs, _ = class_stream()
    learner = cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb])
    n = min(len(Zs), 30)
    labels = [1000 + i // 3 for i in range(n)]  # a new class every third sample
    passed: set[str] = set()
    errors: list[str] = []
    saved: list[Path] = []
    done = threading.Event()
    folder = tempfile.TemporaryDirectory()

    def learn() -> None:
        try:
            for i in range(n):
                with lock_of(learner):  # each state it passes through, recorded before another
                    learner.learn_one(Zs[i], labels[i])  # thread can save it
                    passed.add(digest(learner.state_dict()))
        except Exception as e:  # noqa: BLE001 (asserted below)
            errors.append(f"learn_one: {type(e).__name__}: {e}")
        finally:
            done.set()

    def predict() -> None:
        while not done.is_set():
            try:
                if learner.violates_single_pass:  # it retrains to answer: record where to
                    with lock_of(learner):
                        P, classes = learner.predict_proba(Zs[:3]), list(learner.classes_)
                        passed.add(digest(learner.state_dict()))
                else:
                    view = learner.published()
                    if view is not None:  # the published state: its answer and its classes
                        P, classes = view.predict_proba(Zs[:3]), list(view.classes_)
                    else:
                        with lock_of(learner):
                            P, classes = learner.predict_proba(Zs[:3]), list(learner.classes_)
                    learner.predict(Zs[:3])  # a call of its own, racing the learning thread
                if P.shape != (3, len(classes)):
                    errors.append(f"predict_proba: shape {P.shape} for {len(classes)} classes")
            except Exception as e:  # noqa: BLE001
                errors.append(f"predict: {type(e).__name__}: {e}")

    def save() -> None:
        while not done.is_set() and len(saved) < 5:
            try:
                saved.append(learner.save(Path(folder.name) / f"s{len(saved)}.ciosl"))
            except Exception as e:  # noqa: BLE001
                errors.append(f"save: {type(e).__name__}: {e}")

    with lock_of(learner):
        passed.add(digest(learner.state_dict()))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=f) for f in (learn, predict, predict, save)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    with folder:
        assert not errors, errors[:3]
        for path in saved:
            assert digest(Learner.load(path).state_dict()) in passed, (
                "a file saved while another thread learned is not a state the learner passed "
                "through")
