"""What a learner is given and what it answers, checked: labels as plain values
(``plain_label``, ``label_array``) and probabilities (``proba_problem``, ``checked_proba``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ciosl.errors import LearnerError, describe_learner, echo


def plain_label(label: Any, *, where: str) -> int | str:
    """``label`` as a plain ``int`` or ``str``, else ``TypeError`` naming it (shortened).
    NumPy scalars give their Python value; a subclass of int or str (an ``IntEnum``,
    ``class MyInt(int)``) gives the plain value it holds: ``int.__int__`` and ``str.__str__``
    read the value itself, whatever the subclass's own ``__int__`` / ``__str__`` say."""
    if isinstance(label, np.generic):
        label = label.item()
    if isinstance(label, bool) or not isinstance(label, int | str):
        raise TypeError(f"{where}: labels must be integers or strings, got "
                        f"{type(label).__name__} {echo(label)}")
    if type(label) is int or type(label) is str:
        return label
    return int.__int__(label) if isinstance(label, int) else str.__str__(label)


def label_array(labels: list) -> np.ndarray:
    """``labels`` (plain ints, or plain strs) as an array holding exactly those values:
    int64 when every integer fits it, else an object array of Python ints; strings as a NumPy
    string array."""
    try:
        arr = np.asarray(labels)
    except OverflowError:
        arr = None
    if arr is not None and arr.dtype.kind in "iU":  # NumPy's own choice holds them exactly
        return arr
    out = np.empty(len(labels), dtype=object)  # it would make 2**64 - 1 a float
    out[:] = labels
    return out


PROBA_TOLERANCE = 1e-3  # how far a row of probabilities may sum from 1


def proba_problem(P: Any, n: int, k: int) -> str | None:
    """What is wrong with ``P`` as the probabilities of ``n`` samples over ``k`` classes (the
    conformance suite's check (3)), or None."""
    try:
        P = np.asarray(P, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return f"is not an array of numbers ({type(e).__name__}: {e})"
    if P.shape != (n, k):
        return (f"has shape {P.shape} for {n} sample(s) and {k} class(es) seen (expected "
                f"({n}, {k}): one row per sample, one column per class in classes_)")
    # each row's extremes (NaN propagates through both): two reductions, no (n, k) temporary
    low, high = (P.min(axis=1), P.max(axis=1)) if k else (np.zeros(n), np.zeros(n))
    finite = np.isfinite(low) & np.isfinite(high)
    if not finite.all():
        return f"holds NaN or infinite probabilities (row {int(np.argmin(finite))})"
    outside = (low < -PROBA_TOLERANCE) | (high > 1 + PROBA_TOLERANCE)
    if outside.any():
        return f"holds probabilities outside [0, 1] (row {int(np.argmax(outside))})"
    sums = P.sum(axis=1)
    off = np.abs(sums - 1) > PROBA_TOLERANCE
    if off.any():
        row = int(np.argmax(off))
        return f"has a row that sums to {sums[row]:.6g}, not 1 (row {row})"
    return None


def checked_proba(learner: Any, P: Any, n: int) -> np.ndarray:
    """``P`` as float64 if it is a valid answer of ``learner`` for ``n`` samples, else
    ``LearnerError`` naming the method and the problem."""
    problem = proba_problem(P, n, len(learner.classes_))
    if problem is not None:
        raise LearnerError(f"{describe_learner(learner)}: predict_proba {problem}")
    return np.asarray(P, dtype=np.float64)
