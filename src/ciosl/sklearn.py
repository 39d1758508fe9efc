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
import math
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ciosl.checks import as_values
from ciosl.errors import echo
from ciosl.learners.base import Learner, make_learner, plain_label


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
        """``y`` as an array scikit-learn takes for a classifier. An object array of integers
        (``[2**63, 0]``: no int64 holds them) is not "a regression target": it becomes int64
        or uint64 if one holds it, else the label table refuses it, naming the label."""
        y = np.asarray(y)
        if y.dtype == object:
            values = [_item(v) for v in y.reshape(-1).tolist()]
            if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                for dtype in (np.dtype(np.int64), np.dtype(np.uint64)):
                    if _holds(dtype, values):
                        return np.array(values, dtype=dtype).reshape(y.shape)
                return y
        check_classification_targets(y)
        return y

    @contextlib.contextmanager
    def _unchanged_on_error(self):
        """All or nothing: if the block raises, the attributes are put back as they were
        (``validate_data`` sets ``n_features_in_`` before anything else is checked). The
        learner itself is replaced only at the end, or restores itself (``partial_fit``)."""
        saved = dict(self.__dict__)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _codes(self, known: dict, y: np.ndarray, classes=None, where: str = "partial_fit"
               ) -> tuple[dict, list[int], np.ndarray]:
        """(label -> integer code table, codes of ``y``, the new ``classes_``): the learner's
        own labels stay integers whatever the user's label type. Nothing is changed here: the
        caller commits them once the learner has accepted the data, and everything that can
        be refused is refused here. Announced and given labels must be of one kind with the
        labels known so far (numbers or strings: ``classes_`` is sorted); numbers are converted
        to the type of ``y`` (or of the labels known so far, if wider: bool < int < float),
        and an announced label that the conversion would change, or that is announced twice,
        is refused."""
        name = f"{type(self).__name__}.{where}"
        announced = [] if classes is None else [
            _item(v) for v in np.asarray(classes, dtype=object).reshape(-1).tolist()]
        for v in announced:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{name}: classes= value {v!r} is not a finite number")
            if not isinstance(v, int | float | str | bytes):
                raise TypeError(f"{name}: classes= value {_show(v)} is a {type(v).__name__}, "
                                "not a label (a number or a string)")
        labels = [_item(v) for v in y.tolist()]
        kinds = {_kind(v) for v in [*known, *announced, *labels]}
        if len(kinds) > 1:
            def show(vals: list) -> str:
                return ", ".join(map(_show, vals[:5])) + (", ..." if len(vals) > 5 else "")

            parts = [f"{what} {show(vals)}" for what, vals in
                     (("known labels", list(known)), ("classes=", announced),
                      ("y", labels)) if vals]
            raise ValueError(f"{type(self).__name__}: labels must be all numbers or all "
                             f"strings, got {'; '.join(parts)}")
        dtype, given_as = None, announced  # as given, to name a label announced twice
        if kinds <= {"number"}:
            previous = self.classes_.dtype if known else None
            cat, dtypes = _number_type(y.dtype if len(labels) else None, labels, previous,
                                       announced)
            known = {_convert(k, cat, name, "known label"): c for k, c in known.items()}
            labels = [_convert(v, cat, name, "y value") for v in labels]
            announced = [_convert(v, cat, name, "classes= value") for v in announced]
        first_as: dict = {}
        for v, given in zip(announced, given_as, strict=True):
            if v in first_as:
                was = first_as[v]
                both = "" if repr(was) == repr(given) else f" (as {_show(was)} and {_show(given)})"
                raise ValueError(f"{name}: classes= lists the label {_show(v)} twice{both}")
            first_as[v] = given
        code = dict(known)
        for v in [*announced, *labels]:
            if v not in code:
                code[v] = len(code)
        values = sorted(code)
        if kinds <= {"number"}:
            dtype = next((d for d in dtypes if _holds(d, values)), None)
            if dtype is None:
                types = " or ".join(str(np.dtype(d)) for d in dtypes)
                alone = next((v for v in values if not any(_holds(d, [v]) for d in dtypes)),
                             None)
                if alone is not None:
                    what = "classes= value" if alone in first_as else "label"
                    raise ValueError(f"{name}: {what} {_show(alone)} does not fit the labels' "
                                     f"type ({types})")
                raise ValueError(f"{name}: labels {_show(values[0])} and {_show(values[-1])} "
                                 f"do not fit one type ({types})")
        return code, [code[v] for v in labels], np.array(values, dtype=dtype)

    def _commit(self, learner: Learner, code: dict, classes: np.ndarray) -> None:
        """Replace the fitted state (nothing here can fail)."""
        self.learner_ = learner
        self._code = code
        self.classes_ = classes

    def fit(self, X, y) -> StreamingClassifier:
        """A fresh learner, base-initialized on (X, y). All or nothing: the new learner is
        built on the side; if anything is refused, a fitted classifier stays as it was."""
        with self._unchanged_on_error():
            X, y = as_values(X, "fit"), as_values(y, "fit", "labels")  # the learner's rules
            X, y = validate_data(self, X, y, dtype=np.float32)
            y = self._check_y(y)
            code, codes, classes = self._codes({}, y, where="fit")
            learner = self._new_learner().fit_base(X, codes)
            self._commit(learner, code, classes)
        return self

    def partial_fit(self, X, y, classes=None) -> StreamingClassifier:
        """Stream the rows of (X, y) one at a time, in order. ``classes``: labels to expect
        (optional: unannounced labels are accepted too). All or nothing: every row and label
        is checked before any is learned, and if learning fails midway the learner,
        ``classes_`` and the label table are left as they were."""
        first = not hasattr(self, "learner_")
        with self._unchanged_on_error():
            X, y = as_values(X, "partial_fit"), as_values(y, "partial_fit", "labels")
            X, y = validate_data(self, X, y, dtype=np.float32, reset=first)
            y = self._check_y(y)
            code, codes, new_classes = self._codes({} if first else self._code, y, classes)
            learner = self._new_learner() if first else self.learner_
            learner._check_Z(X, where="partial_fit")  # every row, before any is learned
            # a new learner is dropped if it fails; a fitted one is restored (one row:
            # learn_one is all-or-nothing itself)
            with (learner._all_or_nothing() if not first and len(codes) > 1
                  else contextlib.nullcontext()):
                for z, c in zip(X, codes, strict=True):
                    learner.learn_one(z, c)
            self._commit(learner, code, new_classes)
        return self

    def predict_proba(self, X) -> np.ndarray:
        """(n, len(classes_)) probabilities; 0 for classes announced but not seen yet."""
        check_is_fitted(self, "learner_")
        X = validate_data(self, as_values(X, "predict_proba"), dtype=np.float32, reset=False)
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
    """"number", "string" or "bytes": the kinds of labels that cannot be sorted together."""
    return "string" if isinstance(label, str) else "bytes" if isinstance(label, bytes) \
        else "number"


def _item(value: Any) -> Any:
    """A numpy scalar as the Python value it holds; a subclass of int or str (an ``IntEnum``,
    ``class MyStr(str)``) as the plain value it holds (``plain_label``), so that the label
    table and ``classes_`` hold only plain values."""
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, int | str) and not isinstance(value, bool) and type(value) not in (
            int, str):
        return plain_label(value, where="labels")
    return value


def _show(value: Any) -> str:
    """``repr``, cut short (a label may be a long string or a huge integer)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    return echo(value, 60)


_CATEGORIES = "bif"  # bool < int < float: numeric labels convert to the widest of y and known


def _category(kind: str) -> str | None:
    return {"b": "b", "i": "i", "u": "i", "f": "f"}.get(kind)


def _number_type(y_dtype, labels: list, previous, announced: list
                 ) -> tuple[str, list[np.dtype]]:
    """(category "b" / "i" / "f" of the labels, the dtypes to try for ``classes_``, in order):
    y's dtype first, then the widest of its category. The category is y's (or the labels known
    so far, if wider); an announced label never widens it (0.5 announced for integer labels
    would be truncated: it is refused)."""
    def of_values(vals: list) -> str:
        return max((("b" if isinstance(v, bool) else "i" if isinstance(v, int) else "f")
                    for v in vals), key=_CATEGORIES.index, default="i")

    cats = []
    if y_dtype is not None:
        cats.append(_category(y_dtype.kind) or of_values(labels))
    if previous is not None:
        cats.append(_category(previous.kind) or "i")
    cat = max(cats, key=_CATEGORIES.index) if cats else of_values(announced)
    wide = {"b": [np.dtype(bool)], "i": [np.dtype(np.int64), np.dtype(np.uint64)],
            "f": [np.dtype(np.float64)]}[cat]
    first = [y_dtype] if y_dtype is not None and _category(y_dtype.kind) == cat else []
    return cat, list(dict.fromkeys([*first, *wide]))


def _convert(value: Any, cat: str, name: str, what: str) -> Any:
    """``value`` as a Python label of the category ``cat``; refused if that changes it."""
    if cat == "b":
        new = bool(value)
    elif cat == "i":
        new = int(value) if not isinstance(value, float) or value.is_integer() else None
        if new is None:
            raise ValueError(f"{name}: {what} {_show(value)} would become {int(value)} as an "
                             "integer label (the labels are integers)")
    else:
        try:
            new = float(value)
        except OverflowError:
            raise ValueError(f"{name}: {what} {_show(value)} does not fit a float label (the "
                             "labels are floats)") from None
    if new != value:
        raise ValueError(f"{name}: {what} {_show(value)} would become {new!r} as a "
                         f"{type(new).__name__} label (the labels are {type(new).__name__}s)")
    return new


def _holds(dtype: np.dtype, values: list) -> bool:
    """True if the array of ``values`` with ``dtype`` holds them exactly."""
    if not values:
        return True
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return all(info.min <= v <= info.max for v in values)
    with contextlib.suppress(OverflowError, ValueError):
        return np.array(values, dtype=dtype).tolist() == values
    return False
