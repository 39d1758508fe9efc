"""One streaming run: base init, the single-pass stream, the testing events, the offline reference.

The offline reference learner (the same MLP as the plastic head, trained for several epochs on
every sample seen up to an event) depends only on the data, the ordering, the seed and the event,
never on the learner: its accuracy is cached on disk and shared by every method, process and
machine that uses the same cache folder ("the offline model is trained only once").
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ciosl.data.orderings import Ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation.metrics import accuracy
from ciosl.fileio import atomic_write_json, cache_root, read_json
from ciosl.learners.base import Learner
from ciosl.learners.head import train_offline

OFFLINE_VERSION = 1
Progress = Callable[[int], None]  # called with the number of samples just learned
PROGRESS_EVERY = 500


@dataclass(frozen=True)
class OfflineSettings:
    """Paper Table 5: SGD lr 0.01, momentum 0.9, weight decay 1e-5, [256, 256] ReLU MLP."""

    epochs: int
    batch_size: int
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5


def subset_train(fs: FeatureSet, idx: np.ndarray) -> FeatureSet:
    """The feature set with only the training samples ``idx`` (e.g. --limit-per-class)."""
    pick = (lambda a: None if a is None else a[idx])  # noqa: E731
    key = hashlib.sha256(fs.key.encode() + np.asarray(idx, np.int64).tobytes()).hexdigest()[:16]
    return replace(fs, train_z=fs.train_z[idx], train_y=fs.train_y[idx],
                   train_instance=pick(fs.train_instance), train_frame=pick(fs.train_frame),
                   key=f"{fs.key}-sub{key}")


def offline_accuracy(fs: FeatureSet, ordering: Ordering, t: int, settings: OfflineSettings,
                     cache_dir: Path | None = None) -> float:
    """Accuracy at event t of an MLP trained offline on everything seen by then (cached)."""
    ident = {
        "version": OFFLINE_VERSION, "features": fs.key, "ordering": ordering.kind,
        "seed": ordering.seed, "event": t, "position": int(ordering.events[t]),
        "n_base": len(ordering.base), "n_stream": len(ordering.stream),
        "settings": settings.__dict__,
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    path = (cache_dir or cache_root()) / "offline" / f"{key}.json"
    cached = read_json(path)
    if isinstance(cached, dict) and cached.get("ident") == ident:
        return float(cached["accuracy"])

    seen = ordering.seen(t)
    classes, yi = np.unique(fs.train_y[seen], return_inverse=True)
    net = train_offline(fs.train_z[seen], yi, len(classes), epochs=settings.epochs,
                        batch_size=settings.batch_size, seed=ordering.seed * 1000 + t,
                        lr=settings.lr, momentum=settings.momentum,
                        weight_decay=settings.weight_decay)
    mask = ordering.test_mask(fs.test_y, t)
    pred = classes[net.predict_proba(fs.test_z[mask]).argmax(axis=1)]
    acc = accuracy(pred, fs.test_y[mask])
    atomic_write_json(path, {"ident": ident, "accuracy": acc})
    return acc


def run_stream(learner: Learner, fs: FeatureSet, ordering: Ordering, *,
               progress: Progress | None = None) -> dict:
    """Base-initialize ``learner``, stream every sample once, test at each event.

    Returns per-event accuracies and sizes, the learning time per streamed sample (evaluation
    excluded) and the peak size of the learner's state.
    """
    Z, y = fs.train_z, fs.train_y
    t0 = time.perf_counter()
    learner.fit_base(Z[ordering.base], y[ordering.base])
    base_seconds = time.perf_counter() - t0
    acc, n_test, memory = [], [], []
    learn_seconds, predict_seconds, pos = 0.0, 0.0, 0
    for t, end in enumerate(ordering.events):
        for lo in range(pos, int(end), PROGRESS_EVERY):
            hi = min(int(end), lo + PROGRESS_EVERY)
            t0 = time.perf_counter()
            for i in ordering.stream[lo:hi]:
                learner.learn_one(Z[i], y[i])
            learn_seconds += time.perf_counter() - t0
            if progress is not None:
                progress(hi - lo)
        pos = int(end)
        mask = ordering.test_mask(fs.test_y, t)
        t0 = time.perf_counter()
        with torch.no_grad():
            acc.append(accuracy(learner.predict(fs.test_z[mask]), fs.test_y[mask]))
        predict_seconds += time.perf_counter() - t0  # includes any retraining before inference
        n_test.append(int(mask.sum()))
        memory.append(learner.memory_bytes())
    n_stream = len(ordering.stream)
    return {
        "seed": ordering.seed,
        "events": [int(e) for e in ordering.events],
        "n_test": n_test,
        "accuracy": acc,
        "n_base": len(ordering.base),
        "n_stream": n_stream,
        "base_seconds": base_seconds,
        "learn_seconds": learn_seconds,
        "predict_seconds": predict_seconds,
        "seconds_per_sample": learn_seconds / max(1, n_stream),
        "samples_per_second": n_stream / learn_seconds if learn_seconds > 0 else float("inf"),
        "peak_memory_bytes": max(memory),
        "class_order": list(ordering.class_order),
    }
