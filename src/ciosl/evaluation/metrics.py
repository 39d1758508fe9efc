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
