"""The learner conformance suite (river's ``check_estimator``, scikit-learn's
``parametrize_with_checks``): every registered learner, with its default settings and with each
extra settings dict in its optional class attribute ``conformance_settings``, passes every check
in ``CHECKS``. ``tests/learners/test_conformance.py`` parametrizes them; a learner added later is checked
automatically, and ``ciosl.check_learner(cls)`` runs them on a learner defined elsewhere. Data
are small Gaussian blobs so a learner's whole suite takes a few seconds.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable

import numpy as np
import torch

from ciosl.errors import LearnerError
from ciosl.learners.base import (
    Learner,
    available_methods,
    checked_proba,
    describe_learner,
    register,
)

DIM, N_CLASSES = 20, 5
PREDICT_CELLS = 2**21  # probabilities per predict_proba call of checked_predict: 16 MiB of
# float64, which the allocator reuses from chunk to chunk (2**24 was mapped and unmapped each
# time: 1.2 million page faults per 3,000 rows of 100,000 classes, 25% of the time)
INT_LABELS = [7, 3, 11, 0, 5]  # not 0..K-1, so a learner cannot confuse labels and indices
STR_LABELS = ["cat", "dog", "emu", "fox", "gnu"]
_CENTERS = np.random.default_rng(1234).normal(0.0, 3.0, (N_CLASSES, DIM))  # well separated
_BASE_ATTRS = {"classes_", "_class_index", "dim_", "n_seen_", "rng", "torch_rng", "_asked"}


def cases() -> list[tuple[type[Learner], dict]]:
    """(learner class, settings) for every registered method and its extra settings."""
    out = []
    for cls in available_methods().values():
        for settings in [{}, *getattr(cls, "conformance_settings", [])]:
            out.append((cls, dict(settings)))
    return out


def case_id(case: tuple[type[Learner], dict]) -> str:
    cls, settings = case
    return "-".join([cls.name, *(f"{k}={v}" for k, v in settings.items())])


class _Raised:
    value: BaseException | None = None


@contextlib.contextmanager
def _raises(kind: type[BaseException], match: str | None = None):
    """The block must raise ``kind`` with a message matching ``match`` (as pytest.raises)."""
    raised = _Raised()
    try:
        yield raised
    except kind as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__} {str(e)!r} does not match {match!r}") from e
        raised.value = e
    else:
        raise AssertionError(f"expected {kind.__name__} (matching {match!r}), nothing raised")


# ---------------------------------------------------------------------------- during a run
def checked_predict(learner: Learner, Z: np.ndarray) -> np.ndarray:
    """``learner.predict(Z)``, checked as the suite checks a learner: probabilities finite, in
    [0, 1], summing to 1, one row per sample and one column per class in ``classes_`` (a
    learner that keeps ``Learner.predict`` answers from them, so they are checked first), one
    answer per sample, every answer a label in ``classes_``. The run loop scores only checked
    answers: a learner of the user's own that breaks the protocol fails the run with
    ``LearnerError`` naming the method and the problem, instead of writing an Omega."""
    n = len(Z)
    if type(learner).predict is Learner.predict:  # checks whatever predict_proba is
        # in row chunks of at most PREDICT_CELLS probabilities: 100,000 test rows of 100,000
        # classes would be 80 GB at once
        rows = max(1, PREDICT_CELLS // max(len(learner.classes_), 1))
        return np.concatenate([
            learner._labels_of(checked_proba(learner, learner.predict_proba(Z[i:i + rows]),
                                             len(Z[i:i + rows])))
            for i in range(0, n, rows)]) if n else learner._labels_of(
                checked_proba(learner, learner.predict_proba(Z), n))
    pred = learner.predict(Z)
    problem = labels_problem(pred, n, list(learner.classes_))
    if problem is not None:
        raise LearnerError(f"{describe_learner(learner)}: predict {problem}")
    return np.asarray(pred)


def labels_problem(pred, n: int, classes: list) -> str | None:
    """What is wrong with ``pred`` as the answers for ``n`` samples over ``classes``, or None."""
    try:
        pred = np.asarray(pred)
    except Exception as e:
        return f"did not answer an array ({type(e).__name__}: {e})"
    if pred.shape != (n,):
        return f"answered shape {pred.shape} for {n} sample(s) (expected ({n},): one label each)"
    if not classes:
        return "answered before learning any class (classes_ is empty)"
    try:
        known = np.isin(pred, np.asarray(classes))
    except (TypeError, ValueError):
        known = np.asarray([v in set(classes) for v in pred.tolist()], dtype=bool)
    if not known.all():
        first = pred[int(np.argmin(known))]
        first = first.item() if isinstance(first, np.generic) else first
        return (f"answered label {first!r}, which it never learned (classes_: "
                f"{_preview(classes)})")
    return None


def _preview(items: list, k: int = 8) -> str:
    return ", ".join(map(repr, items[:k])) + (f", ... ({len(items)} in all)" if len(items) > k
                                               else "")


# ---------------------------------------------------------------------------- data
def blobs(classes: list[int], n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled samples of the given class indices: Z (n, DIM) float32, yi (n,) int64."""
    rng = np.random.default_rng(seed)
    yi = rng.permutation(np.repeat(np.asarray(classes), n_per_class))
    Z = _CENTERS[yi] + rng.normal(0.0, 1.0, (len(yi), DIM))
    return Z.astype(np.float32), yi


def class_stream(seed: int = 0, n_base: int = 15, n_step: int = 10):
    """Base init on classes 0, 1; the stream then brings classes 2, 3, 4, one after another."""
    Zb, yb = blobs([0, 1], n_base, seed)
    steps = [blobs([k], n_step, seed + 1 + k) for k in (2, 3, 4)]
    return Zb, yb, np.concatenate([s[0] for s in steps]), np.concatenate([s[1] for s in steps])


def revisit_stream(seed: int = 0, n_base: int = 15, n_new: int = 12, n_old: int = 4):
    """As ``class_stream``, but each step also revisits the classes seen before it."""
    Zb, yb = blobs([0, 1], n_base, seed)
    Zs, ys = [], []
    for k in (2, 3, 4):
        Zn, yn = blobs([k], n_new, seed + 1 + k)
        Zo, yo = blobs(list(range(k)), n_old, seed + 10 + k)
        order = np.random.default_rng(seed + k).permutation(len(yn) + len(yo))
        Zs.append(np.concatenate([Zn, Zo])[order])
        ys.append(np.concatenate([yn, yo])[order])
    return Zb, yb, np.concatenate(Zs), np.concatenate(ys)


def held_out(seed: int = 99, n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    return blobs(list(range(N_CLASSES)), n, seed)


def learn(learner: Learner, Z: np.ndarray, yi: np.ndarray, labels=INT_LABELS,
          after: Callable[[], None] | None = None) -> Learner:
    for z, k in zip(Z, yi, strict=True):
        learner.learn_one(z, labels[k])
        if after is not None:
            after()
    return learner


def fitted(cls, settings, labels=INT_LABELS, stream=class_stream) -> Learner:
    Zb, yb, Zs, ys = stream()
    learner = cls(**settings).fit_base(Zb, [labels[k] for k in yb])
    return learn(learner, Zs, ys, labels)


# ---------------------------------------------------------------------------- checks
def check_constructor(cls, settings) -> None:
    """(1) The constructor stores its settings only; clone() is an unfitted twin."""
    learner = cls(**settings)
    params = learner.get_params()
    assert list(params) == [s.name for s in cls.settings()]
    assert {k: params[k] for k in settings} == settings
    assert cls(**params).get_params() == params
    extra = set(vars(learner)) - set(params) - _BASE_ATTRS
    assert not extra, f"the constructor of {cls.name} builds state: {sorted(extra)}"
    for twin in (learner.clone(), fitted(cls, settings).clone()):
        assert type(twin) is cls and twin.get_params() == params
        assert twin.classes_ == [] and twin.dim_ is None and twin.n_seen_ == 0
        with _raises(RuntimeError):
            twin.predict_proba(np.zeros((1, DIM)))


def check_emerging_classes(cls, settings) -> None:
    """(2) New labels are accepted at any time; the output grows; classes_ in order seen."""
    Zb, yb, Zs, ys = class_stream()
    Zt, yt = held_out()
    for labels in (INT_LABELS, STR_LABELS):
        learner = cls(**settings).fit_base(Zb, [labels[k] for k in yb])
        assert learner.classes_ == labels[:2]
        assert learner.predict_proba(Zt).shape == (len(Zt), 2)
        for z, k in zip(Zs, ys, strict=True):
            learner.learn_one(z, labels[k])
            assert learner.classes_ == labels[:k + 1]
            assert learner.predict_proba(Zt[:3]).shape == (3, k + 1)
        pred = learner.predict(Zt)
        assert set(pred.tolist()) <= set(labels)
        assert isinstance(pred[0].item(), type(labels[0]))
        newest = yt == N_CLASSES - 1  # every learner must at least learn the newest class
        assert np.mean(pred[newest] == labels[-1]) > 0.6
        assert learner.n_seen_ == len(yb) + len(ys)


def check_probabilities(cls, settings) -> None:
    """(3) Probabilities are finite, >= 0 and sum to 1, also for far-away inputs."""
    learner = fitted(cls, settings)
    Zt, _ = held_out()
    for Z in (Zt, Zt * 1e3, np.zeros((2, DIM))):
        P = learner.predict_proba(Z)
        assert P.shape == (len(Z), N_CLASSES) and P.dtype == np.float64, (
            f"predict_proba answered {P.dtype} {P.shape} for {len(Z)} samples and {N_CLASSES} "
            "classes (expected float64 of that shape)")
        assert np.isfinite(P).all(), "predict_proba answered NaN or infinite probabilities"
        assert (P >= 0).all(), "predict_proba answered negative probabilities"
        np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-5,
                                   err_msg="predict_proba rows do not sum to 1")


def check_predict_is_argmax(cls, settings) -> None:
    """(4) predict == classes_[argmax predict_proba]."""
    learner = fitted(cls, settings, STR_LABELS)
    Zt, _ = held_out()
    expected = np.asarray(learner.classes_)[learner.predict_proba(Zt).argmax(axis=1)]
    np.testing.assert_array_equal(learner.predict(Zt), expected)


def check_same_seed(cls, settings) -> None:
    """(5) The same seed and stream give identical probabilities."""
    Zt, _ = held_out()
    a, b = fitted(cls, settings), fitted(cls, settings)
    np.testing.assert_array_equal(a.predict_proba(Zt), b.predict_proba(Zt))


def _strided(Z: np.ndarray) -> np.ndarray:
    """The values of ``Z`` (float32) in a view with a negative stride, not contiguous."""
    return np.asarray(Z, np.float32)[:, ::-1].copy()[:, ::-1]


def check_memory_layout(cls, settings) -> None:
    """(5b) Features given as strided views (a negative stride, not contiguous: a slice
    ``z[::-1]`` of the caller's data) are learned and scored exactly as contiguous ones."""
    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    a = fitted(cls, settings)
    b = learn(cls(**settings).fit_base(_strided(Zb), [INT_LABELS[k] for k in yb]),
              _strided(Zs), ys)
    np.testing.assert_array_equal(a.predict_proba(Zt), b.predict_proba(_strided(Zt)))
    a.learn_many(Zs[:3], [INT_LABELS[k] for k in ys[:3]])
    b.learn_many(_strided(Zs[:3]), [INT_LABELS[k] for k in ys[:3]])
    np.testing.assert_array_equal(a.predict_proba(Zt), b.predict_proba(_strided(Zt)))


def check_state_round_trip(cls, settings) -> None:
    """(6) state_dict -> torch.save -> torch.load(weights_only=True) -> load_state_dict gives
    identical predictions and identical continued learning; state_dict is a snapshot."""
    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    half = int(np.flatnonzero(ys == 3)[0])  # snapshot before classes 3 and 4 appear
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    assert isinstance(learner.memory_bytes(), int) and learner.memory_bytes() > 0
    sd = learner.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)  # no numpy arrays or custom objects in a state
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    P_snap = learner.predict_proba(Zt)
    learn(learner, Zs[half:], ys[half:])  # the original goes on; sd must not follow it
    restored = learner.clone().load_state_dict(loaded)
    from_memory = learner.clone().load_state_dict(sd)
    assert restored.classes_ == from_memory.classes_ == INT_LABELS[:3]
    np.testing.assert_array_equal(restored.predict_proba(Zt), P_snap)
    np.testing.assert_array_equal(from_memory.predict_proba(Zt), P_snap)
    learn(restored, Zs[half:], ys[half:])
    assert restored.classes_ == learner.classes_
    np.testing.assert_array_equal(restored.predict_proba(Zt), learner.predict_proba(Zt))


def check_novelty_score(cls, settings) -> None:
    """(6b) ``novelty_score`` answers one finite score per row, the same twice, and only reads:
    predictions and continued learning are those of a twin that never called it (how well it
    finds novel classes is a measurement, not a check: 1 - max probability may well rank a far
    class as less novel)."""
    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    upto = int(np.flatnonzero(ys == 4)[0])  # class 4 not learned yet
    a = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:upto], ys[:upto])
    b = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:upto], ys[:upto])
    s = a.novelty_score(Zt)
    assert isinstance(s, np.ndarray) and s.shape == (len(Zt),), f"shape {np.shape(s)}"
    assert np.isfinite(s).all()
    np.testing.assert_array_equal(a.novelty_score(Zt), s)
    assert a.novelty_score(Zt[0]).shape == (1,)  # one sample, as (d,)
    assert isinstance(cls.novelty, str) and cls.novelty
    np.testing.assert_array_equal(a.predict_proba(Zt), b.predict_proba(Zt))
    learn(a, Zs[upto:], ys[upto:])
    learn(b, Zs[upto:], ys[upto:])
    np.testing.assert_array_equal(a.predict_proba(Zt), b.predict_proba(Zt))


def check_save_load(cls, settings) -> None:
    """(6b) Learner.save -> Learner.load (a fresh object of the saved class, read with
    weights_only=True) predicts identically and continues learning identically."""
    import tempfile
    from pathlib import Path

    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    half = len(ys) // 2
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    with tempfile.TemporaryDirectory() as d:
        path = learner.save(Path(d) / "learner.ciosl")
        loaded = Learner.load(path)
        same_class = cls.load(path)
    assert type(loaded) is cls and type(same_class) is cls
    assert loaded.get_params() == learner.get_params()
    np.testing.assert_array_equal(loaded.predict_proba(Zt), learner.predict_proba(Zt))
    learn(learner, Zs[half:], ys[half:])
    learn(loaded, Zs[half:], ys[half:])
    assert loaded.classes_ == learner.classes_
    np.testing.assert_array_equal(loaded.predict_proba(Zt), learner.predict_proba(Zt))


def check_copies(cls, settings) -> None:
    """(6c) ``copy.deepcopy``, ``pickle`` and ``clone()`` + ``load_state_dict`` give a learner
    that predicts and continues learning identically, as save and load do."""
    import copy
    import pickle

    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    half = len(ys) // 2
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    cloned = learner.clone()
    cloned.load_state_dict(learner.state_dict())
    twins = [copy.deepcopy(learner), pickle.loads(pickle.dumps(learner)), cloned]
    learn(learner, Zs[half:], ys[half:])
    for twin in twins:
        assert type(twin) is cls and twin.get_params() == learner.get_params()
        learn(twin, Zs[half:], ys[half:])
        assert twin.classes_ == learner.classes_
        np.testing.assert_array_equal(twin.predict_proba(Zt), learner.predict_proba(Zt))


def check_predict_one(cls, settings) -> None:
    """(4b) predict_proba_one / predict_one answer for one sample as predict_proba / predict."""
    learner = fitted(cls, settings, STR_LABELS)
    Zt, _ = held_out()
    for z in Zt[:5]:
        proba = learner.predict_proba_one(z)
        assert list(proba) == learner.classes_
        np.testing.assert_allclose(list(proba.values()), learner.predict_proba(z[None])[0],
                                   rtol=1e-6, atol=1e-9)
        assert learner.predict_one(z) == learner.predict(z[None])[0]
    with _raises(ValueError, match="one sample"):
        learner.predict_proba_one(Zt[:2])


def check_memory_capacity(cls, settings) -> None:
    """(7) A learner with a replay ``buffer`` never holds more than ``buffer`` samples.
    Learners without a ``buffer`` setting have nothing to check."""
    probe = cls(**settings)
    if not hasattr(probe, "buffer"):
        return
    assert callable(getattr(probe, "memory_size", None)), "a buffer needs memory_size()"
    if "buffer" not in settings:  # small enough that the stream overflows it
        settings = {**settings, "buffer": max(getattr(probe, "n_replay", 1), 10)}
    learner = cls(**settings)
    capacity = learner.buffer
    Zb, yb, Zs, ys = class_stream()
    learner.fit_base(Zb, [INT_LABELS[k] for k in yb])
    assert learner.memory_size() <= capacity

    def within() -> None:
        assert 0 <= learner.memory_size() <= capacity

    learn(learner, Zs, ys, after=within)


def check_above_chance(cls, settings) -> None:
    """(8) Well above chance (0.2) on separable blobs: classes emerge one after another and
    the stream keeps revisiting earlier ones (forgetting is measured by the benchmarks, not
    here: plain fine-tuning forgets a strictly class-incremental stream by design)."""
    learner = fitted(cls, settings, stream=revisit_stream)
    Zt, yt = held_out()
    assert learner.score(Zt, np.asarray(INT_LABELS)[yt]) > 0.6


def check_bad_input(cls, settings) -> None:
    """(9) Bad input raises a clear error and leaves the learner unchanged."""
    learner = fitted(cls, settings)
    Zt, _ = held_out()
    P0, classes, n_seen = learner.predict_proba(Zt), list(learner.classes_), learner.n_seen_
    Z_nan = Zt[:6].copy()
    Z_nan[4, 2] = np.nan
    with _raises(ValueError, match="position 4"):
        learner.predict_proba(Z_nan)
    with _raises(ValueError, match="position 0"):
        learner.learn_one(Z_nan[4], "new")
    with _raises(ValueError, match="width"):
        learner.learn_one(np.zeros(DIM + 1), INT_LABELS[0])
    with _raises(ValueError, match="width"):
        learner.predict_proba(np.zeros((2, DIM - 1)))
    with _raises(TypeError, match="labels"):
        learner.learn_one(Zt[0], 1.5)
    with _raises(ValueError, match="one sample"):
        learner.learn_one(Zt[:2], INT_LABELS[0])
    np.testing.assert_array_equal(learner.predict_proba(Zt), P0)
    assert learner.classes_ == classes and learner.n_seen_ == n_seen
    fresh = cls(**settings)
    with _raises(ValueError, match="position 4"):
        fresh.fit_base(Z_nan, [0, 1, 0, 1, 0, 1])
    assert fresh.classes_ == [] and fresh.dim_ is None
    with _raises(TypeError) as err:
        cls(**settings, no_such_setting=1)
    for s in cls.settings():
        assert s.name in str(err.value)


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
        return self._local if f.startswith(_CIOSL) and f != __file__ else None

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


def check_metadata(cls, settings) -> None:
    """(10) Registry name, single-pass flag, description and one help line per setting."""
    assert cls.name and available_methods().get(cls.name, cls) is cls, (
        f"name {cls.name!r} is empty or taken by another learner")
    assert isinstance(cls.violates_single_pass, bool)
    assert cls.description
    missing = {s.name for s in cls.settings()} - set(cls.help)
    assert not missing, f"{cls.name}: no help line for {sorted(missing)}"
    assert set(cls.choices) <= {s.name for s in cls.settings()}


CHECKS = [check_constructor, check_emerging_classes, check_probabilities,
          check_predict_is_argmax, check_predict_one, check_same_seed, check_memory_layout,
          check_state_round_trip, check_novelty_score,
          check_save_load, check_copies, check_memory_capacity, check_above_chance,
          check_bad_input,
          check_failure_rolls_back, check_nonfinite_step_rolls_back, check_faults,
          check_threads, check_metadata]


def _reason(e: BaseException) -> str:
    """The message of ``e``; for a bare ``assert`` (no message), the failing line of the check
    and its location, so the reason is never empty."""
    text = str(e).strip()
    if text:
        return text
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == __file__]
    frame = frames[-1] if frames else (traceback.extract_tb(e.__traceback__) or [None])[-1]
    if frame is None:
        return "no details"
    return f"{frame.line or '?'} (conformance.py line {frame.lineno}, in {frame.name})"


def check_learner(cls: type[Learner], settings: list[dict] | None = None) -> list[str]:
    """Run the conformance suite on a learner class (one defined outside ciosl included).

    Every check in ``CHECKS`` runs with the default settings and with each dict in ``settings``
    (default: the class's ``conformance_settings``). The class is registered under its ``name``
    first (``Learner.load`` finds a saved learner's class by name). Raises ``AssertionError``
    naming the first failing check and settings; returns the names of the checks passed.
    """
    if not (isinstance(cls, type) and issubclass(cls, Learner)):
        raise TypeError(f"check_learner expects a subclass of ciosl.Learner, got {cls!r}")
    available_methods()
    register(cls)
    extra = getattr(cls, "conformance_settings", []) if settings is None else settings
    passed = []
    for case in [{}, *extra]:
        for check in CHECKS:
            try:
                check(cls, dict(case))
            except Exception as e:
                raise AssertionError(f"{cls.__qualname__} fails {check.__name__} with settings "
                                     f"{case}: {type(e).__name__}: {_reason(e)}") from e
            passed.append(f"{check.__name__}{case or ''}")
    return passed
