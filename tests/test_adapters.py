"""The river and scikit-learn adapters: a ciosl learner inside river's progressive validation
and scikit-learn's estimator checks."""

import numpy as np
import pytest
from river import evaluate, metrics, preprocessing, stream
from sklearn.datasets import load_digits
from sklearn.utils.estimator_checks import check_estimator

from ciosl import make_learner
from ciosl.river import RiverClassifier
from ciosl.sklearn import StreamingClassifier


def digits_stream(n=600):
    """Digits, class by class (class-incremental): 0s first, then 1s, ... (river dicts)."""
    X, y = load_digits(return_X_y=True)
    order = np.argsort(y, kind="stable")
    keep = np.sort(np.random.default_rng(0).choice(len(y), n, replace=False))
    order = order[np.isin(order, keep)]
    return stream.iter_array(X[order], y[order].tolist())


@pytest.mark.parametrize("method", ["slda", "ciosl"])
def test_river_progressive_val_score(method):
    """In river's progressive validation (predict, then learn, each sample once) on a
    class-incremental digits stream, the learner predicts the classes it has met well above
    chance (a class's first sample is always wrong there, 10 of 600)."""
    model = preprocessing.StandardScaler() | RiverClassifier(make_learner(method))
    score = evaluate.progressive_val_score(digits_stream(), model, metrics.Accuracy())
    assert score.get() > 0.7, score
    learner = model["RiverClassifier"].learner
    assert learner.classes_ == list(range(10)) and learner.n_seen_ == 600


def test_river_classifier_api():
    clf = RiverClassifier(make_learner("ncm"))
    assert clf.predict_proba_one({"a": 1.0}) == {} and clf.predict_one({"a": 1.0}) is None
    clf.learn_one({"a": 1.0, "b": 0.0}, "x")
    clf.learn_one({"a": -1.0, "b": 0.0}, "y")
    proba = clf.predict_proba_one({"a": 0.9})  # a feature left out counts as 0
    assert set(proba) == {"x", "y"} and abs(sum(proba.values()) - 1) < 1e-6
    assert clf.predict_one({"a": 0.9, "b": 0.0}) == "x"
    assert clf.predict_one({"b": 0.0, "a": -0.9}) == "y"  # by name, not position
    with pytest.raises(ValueError, match="'c'"):
        clf.learn_one({"a": 1.0, "c": 2.0}, "x")
    twin = clf.clone()
    assert twin.learner.classes_ == [] and twin.learner.get_params() == clf.learner.get_params()
    with pytest.raises(TypeError, match="Learner"):
        RiverClassifier("ncm")


# scikit-learn skips these itself when an optional package (pandas, array-api support) is absent
OPTIONAL = {"check_array_api_input", "check_classifier_data_not_an_array"}


@pytest.mark.parametrize("method", ["slda", "ncm"])
def test_sklearn_check_estimator(method):
    """Every check of scikit-learn's ``check_estimator`` applies and passes: none is declared an
    expected failure (the label-space checks pass because ``classes_`` is the sorted union of
    the labels announced and seen)."""
    results = check_estimator(StreamingClassifier(method=method), on_fail=None)
    assert len(results) > 40
    for r in results:
        if r["check_name"] in OPTIONAL and r["status"] == "skipped":
            continue
        assert r["status"] == "passed", (r["check_name"], r["exception"])


def test_sklearn_streaming_classifier():
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    base = np.isin(y, [0, 1])
    clf = StreamingClassifier(method="slda").fit(X[base][:100], y[base][:100])
    assert clf.classes_.tolist() == [0, 1]
    new = np.flatnonzero(np.isin(y, [2, 3]))[:100]
    clf.partial_fit(X[new], y[new], classes=[0, 1, 2, 3, 4])  # 4 announced, never seen
    assert clf.classes_.tolist() == [0, 1, 2, 3, 4]
    P = clf.predict_proba(X[:50])
    assert P.shape == (50, 5) and np.allclose(P.sum(axis=1), 1) and (P[:, 4] == 0).all()
    seen = np.isin(y, [0, 1, 2, 3])
    assert clf.score(X[seen][-200:], y[seen][-200:]) > 0.8
    clf.partial_fit(X[y == 7][:5], y[y == 7][:5])  # unannounced: the label space grows
    assert clf.classes_.tolist() == [0, 1, 2, 3, 4, 7]
    assert clf.learner_.n_seen_ == 100 + 100 + 5
    names = StreamingClassifier(method="ncm").partial_fit(X[:20], np.array(["a", "b"] * 10))
    assert names.predict(X[:3]).dtype.kind == "U"
