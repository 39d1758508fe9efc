"""The scikit-learn adapter (``ciosl.sklearn``): every call is all or nothing (when it raises, the
classifier is exactly as before), refusals are one line, labels of another width widen the
classes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from ciosl.sklearn import StreamingClassifier
from helpers import (
    one_line,
    snapshot,
)


# ---------------------------------------------------------------------------- scikit-learn
def streaming():
    from ciosl.sklearn import StreamingClassifier

    X = np.random.default_rng(0).normal(size=(8, 3))
    return StreamingClassifier(method="ncm").fit(X, [0, 1] * 4), X


def test_partial_fit_checks_every_row_before_learning_any():
    clf, X = streaming()
    before, classes = snapshot(clf.learner_), clf.classes_.tolist()
    Xb = X[:5].copy()
    Xb[3, 1] = 1e30
    with pytest.raises(ValueError, match="position 3 has feature 1 = 1e\\+30"):
        clf.partial_fit(Xb, [2, 2, 3, 4, 5])
    assert snapshot(clf.learner_) == before and clf.classes_.tolist() == classes


def test_partial_fit_failing_midway_leaves_everything_as_it_was(monkeypatch):
    clf, X = streaming()
    before, classes = snapshot(clf.learner_), clf.classes_.tolist()
    real, calls = clf.learner_._learn_one, []

    def third_fails(z, yi):
        calls.append(1)
        if len(calls) == 3:
            raise FloatingPointError("training diverged")
        real(z, yi)

    monkeypatch.setattr(clf.learner_, "_learn_one", third_fails)
    with pytest.raises(FloatingPointError):
        clf.partial_fit(X[:4], [0, 1, 7, 8])
    monkeypatch.undo()
    assert snapshot(clf.learner_) == before
    assert clf.classes_.tolist() == classes  # 7 and 8 were never learned


def test_partial_fit_with_classes_of_another_kind_is_refused_and_later_calls_work():
    clf, X = streaming()
    before = snapshot(clf.learner_)
    with pytest.raises(ValueError, match="labels must be all numbers or all strings, got known "
                                         "labels 0, 1; classes= 'a', 'b'; y 2, 3"):
        clf.partial_fit(X[:2], [2, 3], classes=["a", "b"])
    assert snapshot(clf.learner_) == before and clf.classes_.tolist() == [0, 1]
    clf.partial_fit(X[:2], [2, 3], classes=[4])
    assert clf.classes_.tolist() == [0, 1, 2, 3, 4]
    fresh = type(clf)(method="ncm")
    with pytest.raises(ValueError, match="all numbers or all strings"):
        fresh.partial_fit(X[:2], [0, 1], classes=["a"])
    fresh.partial_fit(X[:2], [0, 1])
    assert fresh.classes_.tolist() == [0, 1]


X = np.random.default_rng(0).normal(size=(8, 3))


def fitted(labels: tuple = (0, 1)) -> StreamingClassifier:
    return StreamingClassifier(method="ncm").fit(X, list(labels) * 4)


def with_feature(width: int, value: float) -> np.ndarray:
    """(8, width) features with ``value`` at row 2, last column."""
    Z = np.random.default_rng(1).normal(size=(8, width))
    Z[2, -1] = value
    return Z


def state(clf: StreamingClassifier) -> tuple:
    """Everything of the classifier: its attributes byte for byte, and its learner (the same
    object, the same state). ``pickle.dumps`` of the whole would hold a torch generator's
    storage address, which changes when nothing else does."""
    attrs = {k: v for k, v in vars(clf).items() if k != "learner_"}
    learner = getattr(clf, "learner_", None)
    return (pickle.dumps(attrs), id(learner),
            None if learner is None else snapshot(learner))


# (id, labels of the fitted classifier, call, error, fragment of the message); each is tried on
# a classifier fitted on those labels and on a fresh one
INT, STR = (0, 1), ("a", "b")


SKLEARN_REFUSALS = [
    ("fit-feature-too-large", INT, lambda c: c.fit(with_feature(3, 1e13), [0, 1] * 4),
     ValueError, "feature 2 = 1e+13"),
    ("fit-feature-too-large-other-width", INT,
     lambda c: c.fit(with_feature(5, 1e13), [0, 1] * 4), ValueError, "feature 4 = 1e+13"),
    ("fit-continuous-y-other-width", INT,
     lambda c: c.fit(with_feature(5, 0.0), np.linspace(0, 1, 8)), ValueError, "continuous"),
    ("partial-fit-feature-too-large", INT,
     lambda c: c.partial_fit(with_feature(3, 1e13), [0, 1] * 4), ValueError, "feature 2 = 1e+13"),
    ("classes-truncated", INT, lambda c: c.partial_fit(X[:2], [0, 1], classes=[0.5, 0, 1]),
     ValueError, "classes= value 0.5 would become 0"),
    ("classes-duplicate-after-conversion", INT,
     lambda c: c.partial_fit(X[:2], [0, 1], classes=[1, 2, 1.0]),
     ValueError, "classes= lists the label 1 twice (as 1 and 1.0)"),
    ("classes-duplicate", INT, lambda c: c.partial_fit(X[:2], [0, 1], classes=[3, 3]),
     ValueError, "classes= lists the label 3 twice"),
    ("classes-duplicate-strings", STR,
     lambda c: c.partial_fit(X[:2], ["a", "b"], classes=["c", "c"]),
     ValueError, "classes= lists the label 'c' twice"),
    ("classes-none", INT, lambda c: c.partial_fit(X[:2], [0, 1], classes=[0, None]),
     TypeError, "classes= value None is a NoneType, not a label"),
    ("classes-nan", INT, lambda c: c.partial_fit(X[:2], [0.0, 1.0], classes=[float("nan")]),
     ValueError, "classes= value nan is not a finite number"),
    ("classes-int-beyond-64-bits", INT,
     lambda c: c.partial_fit(X[:2], [0, 1], classes=[2**70]),
     ValueError, "classes= value 1180591620717411303424 does not fit"),
    ("classes-mixed-kinds-with-strings", STR,
     lambda c: c.partial_fit(X[:2], ["a", "b"], classes=[1, "a"]),
     ValueError, "labels must be all numbers or all strings"),
    ("classes-bool-y", (False, True),
     lambda c: c.partial_fit(X[:2], np.array([True, False]), classes=[2]),
     ValueError, "classes= value 2 would become True"),
    ("classes-needing-more-than-64-bits", INT,
     lambda c: c.partial_fit(X[:2], np.uint64([0, 1]), classes=[-1, 2**64 - 1]),
     ValueError, "labels -1 and 18446744073709551615 do not fit one type (uint64 or int64)"),
    ("classes-float-precision", INT,
     lambda c: c.partial_fit(X[:2], [0.0, 1.0], classes=[2**60 + 1]),
     ValueError, "classes= value 1152921504606846977 would become"),
    # odd arrays: the learner's rules (docs/refused.md, "Odd arrays")
    ("fit-masked-feature", INT,
     lambda c: c.fit(np.ma.masked_greater(with_feature(3, 9.0), 5), [0, 1] * 4),
     ValueError, "fit: features are a masked array with 1 masked value(s) (the first at "
                 "position 2)"),
    ("partial-fit-masked-label", INT,
     lambda c: c.partial_fit(X[:2], np.ma.masked_array([0, 1], mask=[0, 1])),
     ValueError, "partial_fit: labels are a masked array with 1 masked value(s)"),
    ("fit-sparse-tensor", INT,
     lambda c: c.fit(__import__("torch").tensor(X).to_sparse(), [0, 1] * 4),
     ValueError, "fit: features are a sparse torch tensor"),
]


def test_sklearn_reads_torch_tensors_as_their_values():
    import torch

    clf = StreamingClassifier(method="ncm").fit(torch.tensor(X, requires_grad=True), [0, 1] * 4)
    ref = StreamingClassifier(method="ncm").fit(X, [0, 1] * 4)
    half = torch.tensor(X, dtype=torch.bfloat16)
    assert np.array_equal(clf.predict_proba(half), ref.predict_proba(half.float().numpy()))
    assert np.array_equal(clf.predict_proba(X), ref.predict_proba(X))


@pytest.mark.parametrize("start", ["fitted", "fresh"])
@pytest.mark.parametrize(("labels", "call", "error", "fragment"),
                         [c[1:] for c in SKLEARN_REFUSALS], ids=[c[0] for c in SKLEARN_REFUSALS])
def test_sklearn_refusals_are_one_line_and_change_nothing(start, labels, call, error, fragment):
    clf = fitted(labels) if start == "fitted" else StreamingClassifier(method="ncm")
    before = state(clf)
    with pytest.raises(error) as err:
        call(clf)
    assert fragment in one_line(err.value)
    assert state(clf) == before
    if start == "fitted":  # still the fitted classifier
        assert clf.n_features_in_ == 3 and clf.classes_.tolist() == list(labels)
        assert clf.predict(X).tolist() == fitted(labels).predict(X).tolist()
    else:
        assert not hasattr(clf, "learner_") and not hasattr(clf, "classes_")
        assert not hasattr(clf, "n_features_in_")


# (id, start, call, classes_ after, its dtype kind)
SKLEARN_WIDENING = [
    ("int8-y-announces-300", "fitted",
     lambda c: c.partial_fit(X[2:3], np.int8([1]), classes=[300]), [0, 1, 300], "i"),
    ("int8-y-announces-300-fresh", "fresh",
     lambda c: c.partial_fit(X[2:3], np.int8([1]), classes=[300]), [1, 300], "i"),
    ("int8-y-after-300-known", "fitted",
     lambda c: (c.partial_fit(X[:1], [300]), c.partial_fit(X[2:3], np.int8([1]))),
     [0, 1, 300], "i"),
    ("uint64-y-announces-negative", "fresh",
     lambda c: c.partial_fit(X[:2], np.uint64([0, 1]), classes=[-1]), [-1, 0, 1], "i"),
]


@pytest.mark.parametrize(("start", "call", "classes", "kind"), [c[1:] for c in SKLEARN_WIDENING],
                         ids=[c[0] for c in SKLEARN_WIDENING])
def test_sklearn_labels_of_another_width_widen_classes(start, call, classes, kind):
    clf = fitted() if start == "fitted" else StreamingClassifier(method="ncm")
    seen = 0 if start == "fresh" else clf.learner_.n_seen_
    call(clf)
    assert clf.classes_.tolist() == classes and clf.classes_.dtype.kind == kind
    assert clf.learner_.n_seen_ > seen
    assert set(clf.predict(X).tolist()) <= set(classes)
    assert clf.predict_proba(X).shape == (len(X), len(classes))


def test_sklearn_refit_after_a_refused_fit_still_works():
    clf = fitted()
    with pytest.raises(ValueError):
        clf.fit(with_feature(5, 1e13), [0, 1] * 4)
    assert clf.predict(X).tolist() == fitted().predict(X).tolist()
    clf.fit(with_feature(5, 0.0), [2, 3] * 4)
    assert clf.n_features_in_ == 5 and clf.classes_.tolist() == [2, 3]
