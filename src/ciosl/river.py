"""river adapter: a ciosl learner as a river ``Classifier`` (``pip install river``).

    from river import evaluate, metrics, preprocessing, stream
    from ciosl.river import RiverClassifier
    model = preprocessing.StandardScaler() | RiverClassifier(make_learner("slda"))
    evaluate.progressive_val_score(stream.iter_sklearn_dataset(load_digits()), model,
                                   metrics.Accuracy())

river passes each sample as a dict of features. The features of the first sample fix the
vector's layout (their order); a later sample may leave features out (they count as 0), but a
feature never seen before is refused, since the learner's width is fixed once it has started.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from river import base

from ciosl.learners.base import Learner


class RiverClassifier(base.Classifier):
    """A ciosl ``Learner`` behind river's ``learn_one(x: dict, y)`` / ``predict_proba_one(x)`` /
    ``predict_one(x)``. The learner is updated in place; before it has learned anything,
    ``predict_proba_one`` answers ``{}`` and ``predict_one`` ``None`` (river's convention)."""

    def __init__(self, learner: Learner):
        if not isinstance(learner, Learner):
            raise TypeError(f"RiverClassifier wraps a ciosl Learner, got {type(learner).__name__}")
        self.learner = learner
        self.features_: list | None = None

    @property
    def _multiclass(self) -> bool:
        return True

    @classmethod
    def _unit_test_params(cls):
        from ciosl.learners.base import make_learner

        yield {"learner": make_learner("ncm")}

    def clone(self, new_params: dict | None = None, include_attributes: bool = False):
        """An untrained twin: the learner's ``clone()`` (river would deep-copy its state)."""
        params = {"learner": self.learner.clone(), **(new_params or {})}
        return type(self)(**params)

    def _vector(self, x: dict) -> np.ndarray:  # (d,)
        if self.features_ is None:
            self.features_ = list(x)
            self._index = {k: i for i, k in enumerate(self.features_)}
        z = np.zeros(len(self.features_), dtype=np.float32)
        for k, v in x.items():
            i = self._index.get(k)
            if i is None:
                raise ValueError(f"RiverClassifier: feature {k!r} was not in the first sample "
                                 f"({len(self.features_)} features); the width is fixed")
            z[i] = v
        return z

    def learn_one(self, x: dict, y: Any) -> None:
        self.learner.learn_one(self._vector(x), y)

    def predict_proba_one(self, x: dict) -> dict:
        if not self.learner.classes_:
            return {}
        return self.learner.predict_proba_one(self._vector(x))

    def predict_one(self, x: dict) -> Any:
        if not self.learner.classes_:
            return None
        return self.learner.predict_one(self._vector(x))
