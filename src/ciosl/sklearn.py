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

import contextlib
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

    def _codes(self, known: dict, y: np.ndarray, classes=None) -> tuple[dict, list[int]]:
        """(new label -> integer code table, codes of ``y``): the learner's own labels stay
        integers whatever the user's label type. Nothing is changed here: the caller commits
        the table (and ``classes_``) once the learner has accepted the data. Announced and
        given labels must be of one kind with the labels known so far (numbers or strings:
        ``classes_`` is sorted)."""
        announced = [] if classes is None else np.asarray(classes).reshape(-1).tolist()
        labels = y.tolist()
        kinds = {_kind(v) for v in [*known, *announced, *labels]}
        if len(kinds) > 1:
            def show(vals: list) -> str:
                return ", ".join(map(repr, vals[:5])) + (", ..." if len(vals) > 5 else "")

            parts = [f"{what} {show(vals)}" for what, vals in
                     (("known labels", list(known)), ("classes=", announced),
                      ("y", labels)) if vals]
            raise ValueError(f"{type(self).__name__}: labels must be all numbers or all "
                             f"strings, got {'; '.join(parts)}")
        code = dict(known)
        for v in [*announced, *labels]:
            if v not in code:
                code[v] = len(code)
        return code, [code[v] for v in labels]

    def _commit(self, code: dict, dtype) -> None:
        self._code = code
        if dtype is not None and dtype.kind in "USO":  # '<U1' would cut an announced 'abc'
            dtype = None
        self.classes_ = np.array(sorted(code), dtype=dtype)

    def fit(self, X, y) -> StreamingClassifier:
        """A fresh learner, base-initialized on (X, y)."""
        X, y = validate_data(self, X, y, dtype=np.float32)
        y = self._check_y(y)
        code, codes = self._codes({}, y)
        self.learner_ = self._new_learner()
        self.learner_.fit_base(X, codes)
        self._commit(code, y.dtype if len(y) else None)
        return self

    def partial_fit(self, X, y, classes=None) -> StreamingClassifier:
        """Stream the rows of (X, y) one at a time, in order. ``classes``: labels to expect
        (optional: unannounced labels are accepted too). All or nothing: every row is checked
        before any is learned, and if learning fails midway the learner, ``classes_`` and the
        label table are left as they were."""
        first = not hasattr(self, "learner_")
        X, y = validate_data(self, X, y, dtype=np.float32, reset=first)
        y = self._check_y(y)
        code, codes = self._codes({} if first else self._code, y, classes)
        learner = self._new_learner() if first else self.learner_
        learner._check_Z(X, where="partial_fit")  # every row, before any is learned
        # a new learner is dropped if it fails; a fitted one is restored (one row: learn_one is
        # all-or-nothing itself)
        with (learner._all_or_nothing(full=True) if not first and len(codes) > 1
              else contextlib.nullcontext()):
            for z, c in zip(X, codes, strict=True):
                learner.learn_one(z, c)
        if first:
            self.learner_ = learner
        self._commit(code, y.dtype if len(y) else None)
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


def _kind(label: Any) -> str:
    """"number" or "string": the two kinds of labels that cannot be sorted together."""
    return "string" if isinstance(label, str | bytes) else "number"
