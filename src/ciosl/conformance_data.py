"""The conformance suite's data and helpers: small Gaussian blobs (``blobs``), the class
streams the checks learn (``class_stream``, ``revisit_stream``), ``learn`` / ``fitted`` and
``_raises`` (as pytest.raises)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

import numpy as np

from ciosl.learners.base import Learner

DIM, N_CLASSES = 20, 5
INT_LABELS = [7, 3, 11, 0, 5]  # not 0..K-1, so a learner cannot confuse labels and indices
STR_LABELS = ["cat", "dog", "emu", "fox", "gnu"]
_CENTERS = np.random.default_rng(1234).normal(0.0, 3.0, (N_CLASSES, DIM))  # well separated
_BASE_ATTRS = {"classes_", "_class_index", "dim_", "n_seen_", "rng", "torch_rng", "_asked"}


class _Raised:
    value: BaseException | None = None


@contextlib.contextmanager
def _raises(kind: type[BaseException], match: str | None = None):
    """The block must raise ``kind`` with a message matching ``match`` (as pytest.raises)."""
    raised = _Raised()
    try:
        yield raised
    except kind as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__} {str(e)!r} does not match {match!r}") from e
        raised.value = e
    else:
        raise AssertionError(f"expected {kind.__name__} (matching {match!r}), nothing raised")


# ---------------------------------------------------------------------------- data
def blobs(classes: list[int], n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled samples of the given class indices: Z (n, DIM) float32, yi (n,) int64."""
    rng = np.random.default_rng(seed)
    yi = rng.permutation(np.repeat(np.asarray(classes), n_per_class))
    Z = _CENTERS[yi] + rng.normal(0.0, 1.0, (len(yi), DIM))
    return Z.astype(np.float32), yi


def class_stream(seed: int = 0, n_base: int = 15, n_step: int = 10):
    """Base init on classes 0, 1; the stream then brings classes 2, 3, 4, one after another."""
    Zb, yb = blobs([0, 1], n_base, seed)
    steps = [blobs([k], n_step, seed + 1 + k) for k in (2, 3, 4)]
    return Zb, yb, np.concatenate([s[0] for s in steps]), np.concatenate([s[1] for s in steps])


def revisit_stream(seed: int = 0, n_base: int = 15, n_new: int = 12, n_old: int = 4):
    """As ``class_stream``, but each step also revisits the classes seen before it."""
    Zb, yb = blobs([0, 1], n_base, seed)
    Zs, ys = [], []
    for k in (2, 3, 4):
        Zn, yn = blobs([k], n_new, seed + 1 + k)
        Zo, yo = blobs(list(range(k)), n_old, seed + 10 + k)
        order = np.random.default_rng(seed + k).permutation(len(yn) + len(yo))
        Zs.append(np.concatenate([Zn, Zo])[order])
        ys.append(np.concatenate([yn, yo])[order])
    return Zb, yb, np.concatenate(Zs), np.concatenate(ys)


def held_out(seed: int = 99, n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    return blobs(list(range(N_CLASSES)), n, seed)


def learn(learner: Learner, Z: np.ndarray, yi: np.ndarray, labels=INT_LABELS,
          after: Callable[[], None] | None = None) -> Learner:
    for z, k in zip(Z, yi, strict=True):
        learner.learn_one(z, labels[k])
        if after is not None:
            after()
    return learner


def fitted(cls, settings, labels=INT_LABELS, stream=class_stream) -> Learner:
    Zb, yb, Zs, ys = stream()
    learner = cls(**settings).fit_base(Zb, [labels[k] for k in yb])
    return learn(learner, Zs, ys, labels)
