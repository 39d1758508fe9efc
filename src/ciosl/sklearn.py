"""scikit-learn adapter: a ciosl learner as a scikit-learn classifier.

    from ciosl.sklearn import StreamingClassifier
    clf = StreamingClassifier(method="slda").fit(X_base, y_base)   # base initialization
    clf.partial_fit(X_new, y_new)                                  # streamed one sample at a time
    clf.predict_proba(X)                                           # columns in classes_ order

``fit`` is the learner's offline base initialization (a fresh learner each time);
``partial_fit`` streams the rows one at a time through ``learn_one``, in order. Unlike
scikit-learn's incremental estimators, a label that ``classes=`` did not announce is accepted (the
label space grows); ``classes_`` is the sorted union of the labels announced and seen, and a class
announced but not yet seen gets probability 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ciosl.learners.base import Learner, make_learner


class StreamingClassifier(ClassifierMixin, BaseEstimator):
    """A ciosl learner (``method`` with ``settings``, its seed ``random_state``) with
    scikit-learn's ``fit`` / ``partial_fit(X, y, classes=)`` / ``predict`` / ``predict_proba`` /
    ``score``. The learner itself is ``learner_``."""

    def __init__(self, method: str = "slda", settings: dict | None = None, random_state: int = 0):
        self.method = method
        self.settings = settings
        self.random_state = random_state

    def _new_learner(self) -> Learner:
        return make_learner(self.method, **(self.settings or {}), seed=self.random_state)

    def _check_y(self, y) -> np.ndarray:
        check_classification_targets(y)
        return np.asarray(y)

    def _codes(self, y: np.ndarray, classes=None) -> list[int]:
        """Labels -> integer codes the learner sees (its own labels stay integers whatever
        the user's label type), growing ``classes_``."""
        new = [v for v in (classes if classes is not None else []) if v not in self._code]
        new += [v for v in y.tolist() if v not in self._code]
        for v in new:
            if v not in self._code:
                self._code[v] = len(self._code)
        self.classes_ = np.array(sorted(self._code), dtype=y.dtype if len(y) else None)
        return [self._code[v] for v in y.tolist()]

    def fit(self, X, y) -> StreamingClassifier:
        """A fresh learner, base-initialized on (X, y)."""
        X, y = validate_data(self, X, y, dtype=np.float32)
        y = self._check_y(y)
        self._code: dict = {}
        self.learner_ = self._new_learner()
        self.learner_.fit_base(X, self._codes(y))
        return self

    def partial_fit(self, X, y, classes=None) -> StreamingClassifier:
        """Stream the rows of (X, y) one at a time, in order. ``classes``: labels to expect
        (optional: unannounced labels are accepted too)."""
        first = not hasattr(self, "learner_")
        X, y = validate_data(self, X, y, dtype=np.float32, reset=first)
        y = self._check_y(y)
        if first:
            self._code = {}
            self.learner_ = self._new_learner()
        for z, code in zip(X, self._codes(y, classes), strict=True):
            self.learner_.learn_one(z, code)
        return self

    def predict_proba(self, X) -> np.ndarray:
        """(n, len(classes_)) probabilities; 0 for classes announced but not seen yet."""
        check_is_fitted(self, "learner_")
        X = validate_data(self, X, dtype=np.float32, reset=False)
        P = self.learner_.predict_proba(X)  # columns in the learner's order of codes
        out = np.zeros((len(X), len(self.classes_)))
        column = {v: i for i, v in enumerate(self.classes_.tolist())}
        code_to_label = {c: v for v, c in self._code.items()}
        for j, code in enumerate(self.learner_.classes_):
            out[:, column[code_to_label[code]]] = P[:, j]
        return out

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "learner_")
        return self.classes_[self.predict_proba(X).argmax(axis=1)]

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags
