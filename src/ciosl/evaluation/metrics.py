"""Metrics of the streaming protocol, as pure functions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    """Fraction of correct predictions; a label the learner never saw is simply wrong."""
    y = np.asarray(y)
    if len(y) == 0:
        raise ValueError("accuracy of an empty test set")
    return float(np.mean(np.asarray(pred) == y))


OMEGA_EVENTS = ("after_base", "all")
OMEGA_EVENTS_TEXT = {
    "after_base": "mean over the testing events after base init of acc_t / acc_offline_t "
                  "(Kemker et al. 2018)",
    "all": "mean over every testing event, the one right after base init included, of "
           "acc_t / acc_offline_t",
}


def check_omega_events(events: str) -> str:
    if events not in OMEGA_EVENTS:
        raise ValueError(f"unknown Omega_all events {events!r}; valid choices: "
                         f"{', '.join(OMEGA_EVENTS)}")
    return events


def omega_all(acc: Sequence[float], acc_offline: Sequence[float], *,
              events: str = "after_base") -> float:
    """Omega_all = (1/T) sum_t acc_t / acc_offline_t over the testing events t (Kemker et al.
    2018; paper Sec. 5.2).

    ``acc[0]`` / ``acc_offline[0]`` are the testing event right after base initialisation
    (every ordering tests there first). ``events="after_base"`` (the default, Kemker et al.'s
    definition, which starts at the second session) averages the events after it, t = 1..T-1;
    at the base event every method has just been trained offline on the same data and scores
    about as well as the offline learner, so counting it lifts every method towards 1 (the
    paper's Fine-Tune CIFAR-10 class-iid 0.3447 matches the version without it).
    ``events="all"`` averages every event, the base event included."""
    check_omega_events(events)
    a, o = np.asarray(acc, dtype=np.float64), np.asarray(acc_offline, dtype=np.float64)
    if a.shape != o.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"omega_all needs two equal-length 1-d sequences, got {a.shape}, {o.shape}")
    if events == "after_base":
        if len(a) < 2:
            raise ValueError("omega_all: no testing event after base init (only the base event)")
        a, o = a[1:], o[1:]
    if np.any(o <= 0):
        raise ValueError("omega_all: an offline accuracy is 0, the ratio is undefined")
    return float(np.mean(a / o))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) over runs."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        raise ValueError("mean_std of no values")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


# ---------------------------------------------------------------------------- continual learning
# The accuracy matrix R[t][j]: accuracy at testing event t on the test samples of column j, a
# class step's classes (class orderings: the classes first tested at event j) or one class (iid
# and instance orderings, where every event tests every class); None where column j was not
# tested at event t (a step not yet reached).


def class_counts(pred: np.ndarray, y: np.ndarray) -> dict[str, list[int]]:
    """``{label: [correct, n]}`` over the test samples of each label present in ``y`` (labels
    as text: JSON keys)."""
    pred, y = np.asarray(pred), np.asarray(y)
    out = {}
    for c in np.unique(y):
        at = y == c
        out[str(c.item() if isinstance(c, np.generic) else c)] = [int((pred[at] == c).sum()),
                                                                   int(at.sum())]
    return out


def matrix_columns(event_classes: Sequence[Sequence[int]] | None,
                   classes: Sequence[int]) -> list[list[int]]:
    """The accuracy matrix's columns: the classes each testing event adds to the ones tested
    before (class orderings), or one column per class (``event_classes`` None: every event
    tests every class)."""
    if event_classes is None:
        return [[int(c)] for c in classes]
    out, before = [], set()
    for tested in event_classes:
        new = [int(c) for c in tested if c not in before]
        before |= set(tested)
        out.append(new)
    return out


def accuracy_matrix(counts: Sequence[dict[str, Sequence[int]]],
                    columns: Sequence[Sequence[int]]) -> list[list[float | None]]:
    """R[t][j] from each event's ``class_counts``: correct / n pooled over column j's classes;
    None if none of them was tested at event t."""
    R = []
    for at_t in counts:
        row = []
        for col in columns:
            hits = [at_t[str(c)] for c in col if str(c) in at_t]
            n = sum(h[1] for h in hits)
            row.append(sum(h[0] for h in hits) / n if n else None)
        R.append(row)
    return R


def _learned(R: Sequence[Sequence[float | None]]) -> list[tuple[int, int]]:
    """(column, event it was first tested) for the columns first tested before the last event."""
    T = len(R)
    out = []
    for j in range(len(R[0]) if T else 0):
        first = next((t for t in range(T) if R[t][j] is not None), None)
        if first is not None and first < T - 1 and R[-1][j] is not None:
            out.append((j, first))
    return out


def average_forgetting(R: Sequence[Sequence[float | None]]) -> float | None:
    """Average forgetting at the end (Chaudhry et al. 2018): over the columns learned before the
    last event, the mean of max_{l < T-1} R[l][j] - R[T-1][j] (the best accuracy the column had
    before the last event minus its last). None with a single event."""
    drops = [max(R[t][j] for t in range(first, len(R) - 1) if R[t][j] is not None) - R[-1][j]
             for j, first in _learned(R)]
    return float(np.mean(drops)) if drops else None


def backward_transfer(R: Sequence[Sequence[float | None]]) -> float | None:
    """Backward transfer (Lopez-Paz & Ranzato 2017): over the columns learned before the last
    event, the mean of R[T-1][j] - R[j'][j], j' the event the column was first tested at (its
    class step's own event; the base event for iid and instance orderings). Negative:
    forgetting. None with a single event."""
    diffs = [R[-1][j] - R[first][j] for j, first in _learned(R)]
    return float(np.mean(diffs)) if diffs else None


def final_class_accuracy(counts: Sequence[dict[str, Sequence[int]]]) -> dict[str, float]:
    """Per-class accuracy at the last testing event, ``{label: accuracy}``."""
    return {c: k / n for c, (k, n) in counts[-1].items()} if counts else {}


def continual_metrics(counts: Sequence[dict[str, Sequence[int]]] | None,
                      columns: Sequence[Sequence[int]] | None) -> dict:
    """The accuracy matrix, average forgetting, backward transfer and final per-class accuracy
    of one run (all None for a run recorded without per-class counts)."""
    if not counts or not columns:
        return {"accuracy_matrix": None, "forgetting": None, "backward_transfer": None,
                "final_class_accuracy": None}
    R = accuracy_matrix(counts, columns)
    return {"accuracy_matrix": R, "forgetting": average_forgetting(R),
            "backward_transfer": backward_transfer(R),
            "final_class_accuracy": final_class_accuracy(counts)}


def mean_matrix(matrices: Sequence[Sequence[Sequence[float | None]] | None]
                ) -> list[list[float | None]] | None:
    """Entry-wise mean over runs of accuracy matrices of one shape (None entries skipped; None
    if any run has no matrix or the shapes differ)."""
    if not matrices or any(m is None for m in matrices):
        return None
    shapes = {(len(m), len(m[0]) if m else 0) for m in matrices}
    if len(shapes) != 1:
        return None
    T, J = shapes.pop()
    out = []
    for t in range(T):
        row = []
        for j in range(J):
            vals = [m[t][j] for m in matrices if m[t][j] is not None]
            row.append(float(np.mean(vals)) if vals else None)
        out.append(row)
    return out


def summary(values: Sequence[float | None]) -> dict | None:
    """``{"mean", "std"}`` over runs (``mean_std``), or None if a run has no value."""
    if not values or any(v is None for v in values):
        return None
    mean, std = mean_std(values)
    return {"mean": mean, "std": std}
