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


def omega_all(acc: Sequence[float], acc_offline: Sequence[float]) -> float:
    """Omega_all = (1/T) sum_t acc_t / acc_offline_t (Kemker et al. 2018; paper Sec. 5.2)."""
    a, o = np.asarray(acc, dtype=np.float64), np.asarray(acc_offline, dtype=np.float64)
    if a.shape != o.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"omega_all needs two equal-length 1-d sequences, got {a.shape}, {o.shape}")
    if np.any(o <= 0):
        raise ValueError("omega_all: an offline accuracy is 0, the ratio is undefined")
    return float(np.mean(a / o))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) over runs."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        raise ValueError("mean_std of no values")
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0
