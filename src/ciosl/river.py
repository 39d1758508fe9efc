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

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from river import base

from ciosl.errors import echo
from ciosl.learners.base import MAX_FEATURE, Learner


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

    def _vector(self, x: dict, where: str) -> tuple[np.ndarray, list]:
        """(vector (d,), layout): the layout is ``features_``, or the order of ``x``'s keys
        before the first sample has been learned (``learn_one`` keeps it only once the
        learner has accepted that sample: a refused first sample fixes nothing)."""
        if not isinstance(x, Mapping):
            raise TypeError(f"RiverClassifier.{where}: x must be a dict of features "
                            f"{{name: number}}, got {type(x).__name__}")
        layout = self.features_ if self.features_ is not None else list(x)
        index = self._index if self.features_ is not None else {k: i for i, k in
                                                                 enumerate(layout)}
        z = np.zeros(len(layout), dtype=np.float64)
        for k, v in x.items():
            i = index.get(k)
            if i is None:
                raise ValueError(f"RiverClassifier.{where}: feature {echo(k)} was not in the first "
                                 f"sample ({len(layout)} features); the width is fixed")
            z[i] = _number(k, v, where)
        return z, layout

    def learn_one(self, x: dict, y: Any) -> None:
        z, layout = self._vector(x, "learn_one")
        self.learner.learn_one(z, y)  # unchanged if it raises: so is the layout
        if self.features_ is None:
            self.features_ = layout
            self._index = {k: i for i, k in enumerate(layout)}

    def predict_proba_one(self, x: dict) -> dict:
        if not self.learner.classes_:
            self._vector(x, "predict_proba_one")  # bad input is refused even then
            return {}
        return self.learner.predict_proba_one(self._vector(x, "predict_proba_one")[0])

    def predict_one(self, x: dict) -> Any:
        if not self.learner.classes_:
            self._vector(x, "predict_one")
            return None
        return self.learner.predict_one(self._vector(x, "predict_one")[0])


def _number(key: Any, value: Any, where: str) -> float:
    """``value`` as a float if it is one real, finite number (a bool counts as 0 / 1); the
    string "3.5", None, a complex number or an array are refused, naming the feature."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.floating):  # a longdouble beyond float's range: item() keeps it
        finite = bool(np.isfinite(value))
        if not finite or abs(value) > MAX_FEATURE:
            shown = np.format_float_scientific(value, precision=3, trim='-')
            raise ValueError(f"RiverClassifier.{where}: feature {echo(key)} = {shown} (a "
                             f"{type(value).__name__}) is {'not finite' if not finite else 'too large'}"
                             f" (features must be finite numbers within +-{MAX_FEATURE:.0e})")
        value = float(value)
    if not isinstance(value, int | float) or isinstance(value, complex):
        raise TypeError(f"RiverClassifier.{where}: feature {echo(key)} must be a real number, got "
                        f"{type(value).__name__} {echo(value)}")
    # an int is compared as it is: float() of 10**400 would raise a bare OverflowError
    finite = isinstance(value, int) or math.isfinite(value)
    if not finite or abs(value) > MAX_FEATURE:
        raise ValueError(f"RiverClassifier.{where}: feature {echo(key)} = {echo(value)} is "
                         f"{'not finite' if not finite else 'too large'} (features "
                         f"must be finite numbers within +-{MAX_FEATURE:.0e})")
    return float(value)
