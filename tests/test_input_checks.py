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
