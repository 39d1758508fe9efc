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


def _label_keys(labels: np.ndarray) -> list[str]:
    """Labels as JSON keys, as ``str(label)`` writes them (without a loop over the labels in
    Python for integer and string labels)."""
    if labels.dtype.kind in "iuU":
        return labels.astype(str).tolist()
    return [str(c) for c in labels.tolist()]


def class_counts(pred: np.ndarray, y: np.ndarray) -> dict[str, list[int]]:
    """``{label: [correct, n]}`` over the test samples of each label present in ``y`` (labels
    as text: JSON keys). Vectorised: one pass over the samples, whatever the number of
    classes."""
    pred, y = np.asarray(pred), np.asarray(y)
    labels, inverse = np.unique(y, return_inverse=True)
    inverse = inverse.reshape(-1)
    n = np.bincount(inverse, minlength=len(labels))
    correct = np.bincount(inverse, weights=(pred == y).reshape(-1), minlength=len(labels))
    pairs = np.stack([correct.astype(np.int64), n.astype(np.int64)], axis=1).tolist()
    return dict(zip(_label_keys(labels), pairs, strict=True))


def matrix_columns(event_classes: Sequence[Sequence[int]] | None,
                   classes: Sequence[int]) -> list[list[int]]:
    """The accuracy matrix's columns: the classes each testing event adds to the ones tested
    before (class orderings), or one column per class (``event_classes`` None: every event
    tests every class)."""
    if event_classes is None:
        return np.asarray(classes, dtype=np.int64).reshape(-1, 1).tolist()
    out = []
    seen = np.zeros(0, dtype=np.int64)  # sorted classes tested so far
    for tested in event_classes:
        tested = np.asarray(tested, dtype=np.int64).reshape(-1)
        # the classes not tested before, in the order listed, each once
        fresh = ~np.isin(tested, seen)
        _, first = np.unique(tested, return_index=True)
        once = np.zeros(len(tested), dtype=bool)
        once[first] = True
        out.append(tested[fresh & once].tolist())
        seen = np.union1d(seen, tested)
    return out


def accuracy_matrix(counts: Sequence[dict[str, Sequence[int]]],
                    columns: Sequence[Sequence[int]]) -> list[list[float | None]]:
    """R[t][j] from each event's ``class_counts``: correct / n pooled over column j's classes;
    None if none of them was tested at event t. Vectorised over the classes."""
    keys = np.array([str(c) for col in columns for c in col], dtype=str)
    owner = np.repeat(np.arange(len(columns)), [len(col) for col in columns])
    order = np.argsort(keys, kind="stable")
    keys, owner = keys[order], owner[order]  # sorted, for searchsorted
    R = []
    for at_t in counts:
        names = np.array(list(at_t), dtype=str)
        hits = np.array(list(at_t.values()), dtype=np.int64).reshape(-1, 2)
        lo = np.searchsorted(keys, names, side="left")
        hi = np.searchsorted(keys, names, side="right")
        # every (label, column) pair: a label listed in several columns counts in each
        reps = hi - lo
        sample = np.repeat(np.arange(len(names)), reps)
        slot = (np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
                + np.repeat(lo, reps))
        col = owner[slot]
        correct = np.bincount(col, weights=hits[sample, 0], minlength=len(columns))
        total = np.bincount(col, weights=hits[sample, 1], minlength=len(columns))
        row = np.empty(len(columns), dtype=object)
        tested = total > 0
        row[tested] = (correct[tested] / total[tested]).tolist()
        row[~tested] = None
        R.append(row.tolist())
    return R


def _as_array(R: Sequence[Sequence[float | None]]) -> np.ndarray:
    """R as floats, None as NaN, shape (T, J)."""
    T = len(R)
    J = len(R[0]) if T else 0
    return np.array(R, dtype=np.float64).reshape(T, J)


def _learned(R: Sequence[Sequence[float | None]]) -> tuple[np.ndarray, np.ndarray]:
    """(columns, event each was first tested) for the columns first tested before the last
    event (and tested at it)."""
    A = _as_array(R)
    T = A.shape[0]
    if T == 0:
        return np.zeros(0, int), np.zeros(0, int)
    tested = ~np.isnan(A)
    first = np.where(tested.any(axis=0), tested.argmax(axis=0), T)
    cols = np.flatnonzero((first < T - 1) & tested[-1])
    return cols, first[cols]


def average_forgetting(R: Sequence[Sequence[float | None]]) -> float | None:
    """Average forgetting at the end (Chaudhry et al. 2018): over the columns learned before the
    last event, the mean of max_{l < T-1} R[l][j] - R[T-1][j] (the best accuracy the column had
    before the last event minus its last). None with a single event."""
    cols, _ = _learned(R)
    if not len(cols):
        return None
    A = _as_array(R)
    drops = np.nanmax(A[:-1, cols], axis=0) - A[-1, cols]
    return float(np.mean(drops.tolist()))


def backward_transfer(R: Sequence[Sequence[float | None]]) -> float | None:
    """Backward transfer (Lopez-Paz & Ranzato 2017): over the columns learned before the last
    event, the mean of R[T-1][j] - R[j'][j], j' the event the column was first tested at (its
    class step's own event; the base event for iid and instance orderings). Negative:
    forgetting. None with a single event."""
    cols, first = _learned(R)
    if not len(cols):
        return None
    A = _as_array(R)
    diffs = A[-1, cols] - A[first, cols]
    return float(np.mean(diffs.tolist()))


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
    # runs on the last axis: its sum is numpy's pairwise sum, as np.mean of the values gives
    A = np.stack([_as_array(m) for m in matrices], axis=-1).reshape(T, J, len(matrices))
    valid = ~np.isnan(A)
    count = valid.sum(axis=-1)
    full = count == len(matrices)
    out = np.empty((T, J), dtype=object)
    out[full] = (A[full].sum(axis=-1) / len(matrices)).tolist()
    out[count == 0] = None
    for t, j in zip(*np.nonzero((count > 0) & ~full), strict=True):  # some runs not tested
        out[t, j] = float(np.mean(A[t, j][valid[t, j]].tolist()))
    return out.tolist()


def summary(values: Sequence[float | None]) -> dict | None:
    """``{"mean", "std"}`` over runs (``mean_std``), or None if a run has no value."""
    if not values or any(v is None for v in values):
        return None
    mean, std = mean_std(values)
    return {"mean": mean, "std": std}


# ---------------------------------------------------------------------------- open set
# The open-set protocol (Stream-51's): at a testing event, the test samples of the classes
# learned so far are "known", those of any other class "novel"; a learner's ``novelty_score``
# (higher: more novel) separates them. Both scores below count ties as half, so that they are
# exact (no threshold grid) and do not depend on the order of the samples.


def _rank_counts(known: np.ndarray, novel: np.ndarray) -> np.ndarray:
    """For each known score, the number of novel scores above it plus half of those equal."""
    s = np.sort(novel)
    above = len(s) - np.searchsorted(s, known, side="right")
    equal = np.searchsorted(s, known, side="right") - np.searchsorted(s, known, side="left")
    return above + 0.5 * equal


def _open_set_scores(known: Sequence[float], novel: Sequence[float]
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    k = np.asarray(known, dtype=np.float64).reshape(-1)
    n = np.asarray(novel, dtype=np.float64).reshape(-1)
    if not (np.isfinite(k).all() and np.isfinite(n).all()):
        raise ValueError("open-set scores must be finite")
    return None if len(k) == 0 or len(n) == 0 else (k, n)


def auroc(known: Sequence[float], novel: Sequence[float]) -> float | None:
    """Area under the ROC curve of telling novel test samples from known ones by a novelty
    score (higher: more novel): the probability that a novel sample scores above a known one,
    ties counting half (the Mann-Whitney statistic; equal to scikit-learn's ``roc_auc_score``
    with novel as the positive class). 0.5 is chance. None without a known or a novel sample."""
    pair = _open_set_scores(known, novel)
    if pair is None:
        return None
    k, n = pair
    return float(_rank_counts(k, n).sum() / (len(k) * len(n)))


def auosc(known: Sequence[float], novel: Sequence[float],
          correct: Sequence[bool]) -> float | None:
    """Area under the open-set classification curve (Dhamija et al. 2018; Stream-51's AUOSC):
    sweeping a threshold on the novelty score, the fraction of known samples accepted (score
    below the threshold) and correctly classified, against the fraction of novel samples
    accepted, integrated over the latter from 0 to 1 (trapezoids across ties). Equals the mean,
    over known samples, of [classified correctly] x P(a novel sample scores above it, ties
    half): at most the accuracy on the known samples, and ``auroc`` when every one is right.
    None without a known or a novel sample."""
    pair = _open_set_scores(known, novel)
    if pair is None:
        return None
    k, n = pair
    c = np.asarray(correct, dtype=bool).reshape(-1)
    if len(c) != len(k):
        raise ValueError(f"auosc: {len(k)} known scores but {len(c)} correctness flags")
    return float((_rank_counts(k, n) * c).sum() / (len(k) * len(n)))
