"""The learner conformance suite (river's ``check_estimator``, scikit-learn's
``parametrize_with_checks``): every registered learner, with its default settings and with each
extra settings dict in its optional class attribute ``conformance_settings``, passes every check
in ``CHECKS``. ``tests/learners/test_conformance.py`` parametrizes them; a learner added later is checked
automatically, and ``ciosl.check_learner(cls)`` runs them on a learner defined elsewhere. Data
are small Gaussian blobs so a learner's whole suite takes a few seconds.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from ciosl.conformance_data import (  # noqa: F401 (the suite's data, public here too)
    _BASE_ATTRS,
    DIM,
    INT_LABELS,
    N_CLASSES,
    STR_LABELS,
    _raises,
    blobs,
    class_stream,
    fitted,
    held_out,
    learn,
    revisit_stream,
)
from ciosl.conformance_faults import (  # noqa: F401
    FAULT_POINTS,
    InjectedFailure,
    InjectedFault,
    _LineFaults,
    _TorchFaults,
    check_failure_rolls_back,
    check_faults,
    check_nonfinite_step_rolls_back,
    check_threads,
    failing_after,
)
from ciosl.conformance_rules import (
    FIXES,
    check_bad_settings,
    check_keyword_only,
    check_private_randomness,
    check_published_twin,
    check_revisit_round_trip,
    check_state_snapshot,
    check_undo_record,
)
from ciosl.errors import LearnerError
from ciosl.learners.base import (
    Learner,
    available_methods,
    checked_proba,
    describe_learner,
    register,
)

PREDICT_CELLS = 2**21  # probabilities per predict_proba call of checked_predict: 16 MiB of
# float64, which the allocator reuses from chunk to chunk (2**24 was mapped and unmapped each
# time: 1.2 million page faults per 3,000 rows of 100,000 classes, 25% of the time)


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


# ---------------------------------------------------------------------------- checks
def check_constructor(cls, settings) -> None:
    """(1) The constructor stores its settings only; clone() is an unfitted twin."""
    check_keyword_only(cls, settings)
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


def check_metadata(cls, settings) -> None:
    """(10) Registry name, single-pass flag, description and one help line per setting."""
    assert cls.name and available_methods().get(cls.name, cls) is cls, (
        f"name {cls.name!r} is empty or taken by another learner")
    assert isinstance(cls.violates_single_pass, bool)
    assert cls.description
    missing = {s.name for s in cls.settings()} - set(cls.help)
    assert not missing, f"{cls.name}: no help line for {sorted(missing)}"
    assert set(cls.choices) <= {s.name for s in cls.settings()}


CHECKS = [check_constructor, check_bad_settings, check_emerging_classes, check_probabilities,
          check_predict_is_argmax, check_predict_one, check_same_seed, check_private_randomness,
          check_memory_layout, check_state_snapshot, check_state_round_trip,
          check_revisit_round_trip, check_published_twin, check_novelty_score,
          check_save_load, check_copies, check_memory_capacity, check_above_chance,
          check_bad_input,
          check_failure_rolls_back, check_nonfinite_step_rolls_back, check_faults,
          check_threads, check_metadata]
# what a built-in learner must have besides (``check_learner(..., builtin=True)``, the project's
# own tests): the tier of CONTRIBUTING's "A method" that keeps the state rule
BUILTIN_CHECKS = [check_undo_record, *CHECKS]


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


def _rule(check) -> str:
    """The rule a check enforces (its docstring's first sentence) and what to fix."""
    doc = " ".join((check.__doc__ or "").split())
    rule = doc.split(". ")[0].rstrip(".")
    fix = FIXES.get(check.__name__)
    return f"rule: {rule}" + (f"; fix: {fix}" if fix else "")


def check_learner(cls: type[Learner], settings: list[dict] | None = None, *,
                  builtin: bool = False) -> list[str]:
    """Run the conformance suite on a learner class (one defined outside ciosl included).

    Every check in ``CHECKS`` runs with the default settings and with each dict in ``settings``
    (default: the class's ``conformance_settings``); ``builtin``: ``BUILTIN_CHECKS``, what a
    method shipped with ciosl must have besides (an undo record). The class is registered under
    its ``name`` first. Raises ``AssertionError`` naming the first failing check and settings,
    the reason, the rule and the fix; returns the names of the checks passed.
    """
    if not (isinstance(cls, type) and issubclass(cls, Learner)):
        raise TypeError(f"check_learner expects a subclass of ciosl.Learner, got {cls!r}")
    available_methods()
    register(cls)
    extra = getattr(cls, "conformance_settings", []) if settings is None else settings
    passed = []
    for case in [{}, *extra]:
        for check in BUILTIN_CHECKS if builtin else CHECKS:
            try:
                check(cls, dict(case))
            except Exception as e:
                raise AssertionError(f"{cls.__qualname__} fails {check.__name__} with settings "
                                     f"{case}: {type(e).__name__}: {_reason(e)} "
                                     f"({_rule(check)})") from e
            passed.append(f"{check.__name__}{case or ''}")
    return passed
