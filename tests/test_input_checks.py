"""Bad input gets a clear error and loses nothing: one table of cases, each a call that must
raise a given error with a given message, and a check that the learner's state did not change."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from ciosl.learners import make_learner
from helpers import (
    D,
    snapshot,
)


def trained(method: str = "ciosl", **settings):
    rng = np.random.default_rng(0)
    learner = make_learner(method, **settings)
    Z = rng.normal(size=(40, D)).astype(np.float32) + np.repeat(np.eye(2, D) * 4, 20, axis=0)
    learner.fit_base(Z, [0] * 20 + [1] * 20)
    for i in range(10):
        learner.learn_one(rng.normal(size=D) + 4 * (i % 2), i % 2)
    return learner


def nan_at(n: int, pos: int, value=np.nan) -> np.ndarray:
    Z = np.zeros((n, D), np.float32)
    Z[pos, 1] = value
    return Z


# (id, call on a trained learner, expected error, message pattern)
LEARNER_CASES = [
    ("nan-feature-learn_one", lambda L: L.learn_one(nan_at(1, 0)[0], 0), ValueError,
     "position 0 has NaN or infinite"),
    ("inf-feature-learn_many", lambda L: L.learn_many(nan_at(5, 3, np.inf), [0] * 5),
     ValueError, "position 3 has NaN or infinite"),
    ("nan-feature-fit_base-of-new-class", lambda L: L.fit_base(nan_at(4, 2), [0, 1, 2, 2]),
     ValueError, "position 2"),
    ("nan-feature-predict", lambda L: L.predict_proba(nan_at(7, 6)), ValueError, "position 6"),
    ("wider-sample", lambda L: L.learn_one(np.zeros(D + 3), 0), ValueError,
     f"width {D + 3} differs from the width seen first \\({D}\\)"),
    ("narrower-test-set", lambda L: L.predict(np.zeros((2, D - 1))), ValueError, "width"),
    ("float-label", lambda L: L.learn_one(np.zeros(D), 1.5), TypeError,
     "integers or strings, got float"),
    ("none-label", lambda L: L.learn_one(np.zeros(D), None), TypeError, "got NoneType"),
    ("tuple-label", lambda L: L.learn_many(np.zeros((2, D)), [(1, 2), (3, 4)]), TypeError,
     "integers or strings, got tuple"),
    ("bool-label", lambda L: L.learn_one(np.zeros(D), True), TypeError, "got bool"),
    ("label-count", lambda L: L.learn_many(np.zeros((3, D)), [0, 1]), ValueError,
     "3 samples but 2 labels"),
    ("empty-stream", lambda L: L.learn_many(np.zeros((0, D)), []), ValueError, "empty input"),
    ("empty-test-set", lambda L: L.score(np.zeros((0, D)), []), ValueError, "empty"),
    ("string-features", lambda L: L.learn_one(np.array(["a"] * D), 0), ValueError,
     "real numbers"),
    ("two-samples-to-learn_one", lambda L: L.learn_one(np.zeros((2, D)), 0), ValueError,
     "one sample"),
    # odd arrays (docs/refused.md, "Odd arrays"): refused in one line naming the call
    ("timedelta-features-learn_one", lambda L: L.learn_one(np.arange(D).astype("m8[s]"), 0),
     ValueError, r"learn_one: features must be real numbers, got dtype timedelta64\[s\]; "
                 r"durations and dates are no features: convert them to numbers first"),
    ("timedelta-features-predict", lambda L: L.predict(np.zeros((2, D), "m8[ms]")),
     ValueError, r"predict_proba: features must be real numbers, got dtype timedelta64"),
    ("datetime-features-learn_many",
     lambda L: L.learn_many(np.zeros((2, D), "M8[D]"), [0, 1]), ValueError,
     r"learn_many: features must be real numbers, got dtype datetime64\[D\]; durations"),
    ("masked-feature-learn_one",
     lambda L: L.learn_one(np.ma.masked_array(np.ones(D), mask=np.eye(1, D, 2)[0]), 0),
     ValueError, r"learn_one: features are a masked array with 1 masked value\(s\) \(the "
                 r"first at position 0\); ciosl would learn the values under the mask: fill"),
    ("masked-features-learn_many",
     lambda L: L.learn_many(np.ma.masked_greater(np.eye(3, D) * [[1], [2], [3]], 1.5),
                            [0, 1, 7]),
     ValueError, r"learn_many: features are a masked array with 2 masked value\(s\) \(the "
                 r"first at position 1\)"),
    ("masked-features-predict",
     lambda L: L.predict_proba(np.ma.masked_invalid(nan_at(3, 2))), ValueError,
     r"predict_proba: features are a masked array with 1 masked value"),
    ("masked-labels-learn_many",
     lambda L: L.learn_many(np.zeros((3, D)), np.ma.masked_equal([0, 5, 1], 5)), ValueError,
     r"learn_many: labels are a masked array with 1 masked value\(s\) \(the first at "
     r"position 1\)"),
    ("masked-labels-fit_base",
     lambda L: L.fit_base(np.zeros((2, D)), np.ma.masked_array([0, 1], mask=[1, 0])),
     ValueError, r"fit_base: labels are a masked array with 1 masked value"),
    ("sparse-tensor-learn_many",
     lambda L: L.learn_many(__import__("torch").eye(2, D).to_sparse(), [0, 1]), ValueError,
     r"learn_many: features are a sparse torch tensor \(torch.sparse_coo\); pass "
     r"x.to_dense\(\)"),
    ("bfloat16-labels-learn_many",
     lambda L: L.learn_many(np.zeros((2, D)),
                            __import__("torch").tensor([0, 1], dtype=__import__("torch").bfloat16)),
     TypeError, r"learn_many: labels must be integers or strings, got float 0.0"),
]


@pytest.mark.parametrize("method", ["ciosl", "tinyer", "slda"])
@pytest.mark.parametrize(("call", "error", "pattern"), [c[1:] for c in LEARNER_CASES],
                         ids=[c[0] for c in LEARNER_CASES])
def test_bad_input_is_refused_and_changes_nothing(method, call, error, pattern):
    learner = trained(method)
    before = snapshot(learner)
    with pytest.raises(error, match=pattern):
        call(learner)
    assert snapshot(learner) == before  # nothing learned, no class added, no generator drawn


def test_unseen_test_classes_are_scored_as_wrong_not_a_crash():
    learner = trained("ncm")
    Z = np.repeat(np.eye(2, D) * 4, 5, axis=0).astype(np.float32)
    y = np.array([0] * 5 + [7] * 5)  # class 7 was never seen: those five are wrong
    assert learner.score(Z, y) == pytest.approx(0.5)


def test_empty_training_set_is_refused(tmp_path):
    path = tmp_path / "empty.npz"
    np.savez(path, train_z=np.zeros((0, 3)), train_y=np.zeros(0, np.int64),
             test_z=np.zeros((2, 3)), test_y=np.arange(2))
    with pytest.raises(ValueError, match="no training samples"):
        run_experiment(ExperimentSpec(dataset=f"features:{path}", ordering="iid", method="ncm",
                                      seeds=[0], cache_dir=tmp_path))


def _torch(dtype_name: str, grad: bool = False):
    import torch

    def make(a: np.ndarray):
        t = torch.tensor(np.asarray(a, np.float32), dtype=getattr(torch, dtype_name))
        return t.requires_grad_(True) if grad else t
    return make


def _values(dtype_name: str):
    """The float32 values a tensor of ``dtype_name`` holds (bfloat16 rounds them)."""
    return lambda a: _torch(dtype_name)(a).float().numpy()


# (id, odd form of an array, the plain float32 array it stands for): the stated rule is that a
# learner reads the values (docs/refused.md, "Odd arrays")
ODD_HANDLED = [
    ("torch-requires-grad", _torch("float32", grad=True), _values("float32")),
    ("torch-bfloat16", _torch("bfloat16"), _values("bfloat16")),
    ("torch-float16-requires-grad", _torch("float16", grad=True), _values("float16")),
    ("torch-float64", _torch("float64"), _values("float64")),
    ("masked-array-nothing-masked", lambda a: np.ma.masked_array(a, mask=False),
     lambda a: np.asarray(a, np.float32)),
    ("masked-array-nomask", lambda a: np.ma.masked_array(a),
     lambda a: np.asarray(a, np.float32)),
]


@pytest.mark.parametrize("method", ["ciosl", "slda"])
@pytest.mark.parametrize(("odd", "plain"), [c[1:] for c in ODD_HANDLED],
                         ids=[c[0] for c in ODD_HANDLED])
def test_odd_arrays_are_learned_as_the_values_they_hold(method, odd, plain):
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = (X[:120] / 16.0).astype(np.float32)
    y = y[:120]
    given, reference = make_learner(method, seed=0), make_learner(method, seed=0)
    for learner, form in ((given, odd), (reference, plain)):
        learner.fit_base(form(X[:60]), y[:60])
        learner.learn_many(form(X[60:90]), y[60:90])
        for i in range(90, 100):
            learner.learn_one(form(X[i]), int(y[i]))
    assert snapshot(given) == snapshot(reference)
    np.testing.assert_array_equal(given.predict_proba(odd(X[100:])),
                                  reference.predict_proba(plain(X[100:])))
    assert given.score(odd(X[100:]), y[100:]) == reference.score(plain(X[100:]), y[100:])
