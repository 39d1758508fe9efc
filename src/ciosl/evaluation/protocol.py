"""One streaming run: base init, the single-pass stream, the testing events, the offline reference.

The offline reference learner (the same MLP as the plastic head, trained for several epochs on
every sample seen up to an event) depends only on the data, the ordering, the seed and the event,
never on the learner: its accuracy is cached on disk and shared by every method, process and
machine that uses the same cache folder ("the offline model is trained only once").
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ciosl.conformance import checked_predict
from ciosl.data.orderings import Ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation.metrics import accuracy, auosc, auroc, class_counts, matrix_columns
from ciosl.fileio import atomic_write_json, cache_root, read_json
from ciosl.learners.base import NOVELTY_DEFAULT, Learner
from ciosl.learners.head import train_offline

logger = logging.getLogger(__name__)

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
                     cache_dir: Path | None = None, device: str = "cpu") -> float:
    """Accuracy at event t of an MLP trained offline on everything seen by then (cached),
    trained on ``device`` (a CUDA reference is cached apart: its rounding differs)."""
    ident = {
        "version": OFFLINE_VERSION, "features": fs.key, "ordering": ordering.kind,
        "seed": ordering.seed, "event": t, "position": int(ordering.events[t]),
        "n_base": len(ordering.base), "n_stream": len(ordering.stream),
        "settings": settings.__dict__, **({"device": device} if device != "cpu" else {}),
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    path = (cache_dir or cache_root()) / "offline" / f"{key}.json"
    cached = read_json(path)
    if valid_offline_entry(cached, ident):
        return float(cached["accuracy"])  # else missing, stale, edited or damaged: recompute

    seen = ordering.seen(t)
    classes, yi = np.unique(fs.train_y[seen], return_inverse=True)
    net = train_offline(fs.train_z[seen], yi, len(classes), epochs=settings.epochs,
                        batch_size=settings.batch_size, seed=ordering.seed * 1000 + t,
                        lr=settings.lr, momentum=settings.momentum,
                        weight_decay=settings.weight_decay, device=device)
    mask = ordering.test_mask(fs.test_y, t)
    pred = classes[net.predict_proba(fs.test_z[mask]).argmax(axis=1)]
    acc = accuracy(pred, fs.test_y[mask])
    try:
        atomic_write_json(path, {"ident": ident, "accuracy": acc,
                                 "sha256": offline_digest(ident, acc)})
    except OSError as e:  # a read-only or full disk costs the cache, not the run
        logger.warning("Could not write offline reference cache entry %s (%s).", path,
                       e.strerror or e)
    return acc


def offline_digest(ident: dict, accuracy: float) -> str:
    """The checksum of an offline-reference cache entry (as feature cache entries carry)."""
    text = json.dumps({"ident": ident, "accuracy": accuracy}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def valid_offline_entry(entry: Any, ident: dict) -> bool:
    """A cache entry for ``ident`` whose accuracy is a number in [0, 1] matching its checksum."""
    if not (isinstance(entry, dict) and entry.get("ident") == ident):
        return False
    acc = entry.get("accuracy")
    return (isinstance(acc, int | float) and not isinstance(acc, bool) and 0.0 <= acc <= 1.0
            and entry.get("sha256") == offline_digest(ident, acc))


StreamState = dict  # run_stream's resumable state, see run_stream
REGIMES = ("streaming", "online", "batch")


@dataclass(frozen=True)
class Regime:
    """How the stream reaches the learner (the paper's Figure 1).

    - ``streaming``: one sample at a time, each seen once (``learn_one``);
    - ``online``: consecutive mini-batches of ``batch_size`` samples, each seen once
      (``learn_many``); batches never straddle a testing event;
    - ``batch``: the samples between two testing events (a class step in the class orderings)
      form one task, visited for ``epochs`` epochs of shuffled ``batch_size`` mini-batches
      before the event's test. Revisits samples: not single-pass.
    """

    name: str = "streaming"
    batch_size: int = 10
    epochs: int = 5

    def __post_init__(self) -> None:
        if self.name not in REGIMES:
            raise ValueError(f"unknown regime {self.name!r}; valid choices: {', '.join(REGIMES)}")
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError(f"--batch-size and --epochs must be >= 1, got {self.batch_size} "
                             f"and {self.epochs}")


def _chunks(regime: Regime, events: list[int], n_stream: int, every: int) -> list[int]:
    """The stream positions after which the runner regains control (ascending, > 0): testing
    events, progress reports, checkpoints (streaming); mini-batch ends (online); task ends
    (batch). A checkpoint is taken at the first of them at or past each multiple of ``every``.
    """
    if regime.name == "batch":
        return sorted({e for e in events if e > 0} | {n_stream})
    if regime.name == "online":
        cuts = sorted({0, n_stream, *events})
        ends = set(cuts[1:])
        for a, b in zip(cuts, cuts[1:], strict=False):  # batches restart at each testing event
            ends |= set(range(a + regime.batch_size, b, regime.batch_size))
        return sorted(ends)
    stops = set(events) | set(range(0, n_stream + 1, PROGRESS_EVERY)) | {n_stream}
    if every > 0:
        stops |= set(range(0, n_stream + 1, every))
    return sorted(s for s in stops if s > 0)


def run_stream(learner: Learner, fs: FeatureSet, ordering: Ordering, *,
               progress: Progress | None = None, checkpoint_every: int = 0,
               on_checkpoint: Callable[[StreamState], None] | None = None,
               resume: StreamState | None = None, regime: Regime = Regime(),
               open_set: bool = False) -> dict:
    """Base-initialize ``learner``, stream every sample once, test at each event.

    Returns per-event accuracies and sizes, the learning time per streamed sample (evaluation
    excluded) and the peak size of the learner's state. ``regime`` (see ``Regime``) chooses
    how the stream is fed; the testing events are the same in every regime.

    Crash safety: with ``checkpoint_every = N > 0``, ``on_checkpoint(state)`` is called after
    base initialization and after every N streamed samples (online: at the end of the
    mini-batch that reaches N; batch: at the end of the task; always after that position's
    testing event) with a dict holding the learner's ``state_dict``, the stream position, the
    partial results and the timings. ``run_stream(..., resume=state)`` on a fresh learner
    continues from there and returns what the uninterrupted run would have returned (timings
    aside).

    ``open_set`` adds the open-set protocol (Stream-51's) at every event: the test samples of
    the classes not learned by then are novel, the learner's ``novelty_score`` ranks them
    against the known ones, and the run records AUROC and AUOSC per event (None at an event
    with no novel sample), with those of 1 - max probability beside a learner whose score is
    another one (``open_set_scores``).
    """
    Z, y = fs.train_z, fs.train_y
    events = [int(e) for e in ordering.events]
    n_stream = len(ordering.stream)
    if resume is None:
        t0 = time.perf_counter()
        learner.fit_base(Z[ordering.base], y[ordering.base])
        st: StreamState = {"position": 0, "accuracy": [], "n_test": [], "memory": [],
                           "class_counts": [],
                           "base_seconds": time.perf_counter() - t0, "learn_seconds": 0.0,
                           "predict_seconds": 0.0, "open_set": []}
    else:
        learner.load_state_dict(resume["learner"])
        st = {k: v for k, v in resume.items() if k != "learner"}
        st = {**st, **{k: list(st[k]) for k in ("accuracy", "n_test", "memory")},
              "class_counts": list(st.get("class_counts", [])),  # absent: older checkpoints
              "open_set": list(st.get("open_set", []))}

    def evaluate_due() -> None:
        while len(st["accuracy"]) < len(events) and events[len(st["accuracy"])] == st["position"]:
            t = len(st["accuracy"])
            mask = ordering.test_mask(fs.test_y, t)
            t0 = time.perf_counter()
            with torch.no_grad():  # checked as the conformance suite checks a learner
                pred = checked_predict(learner, fs.test_z[mask])
            st["accuracy"].append(accuracy(pred, fs.test_y[mask]))
            st["class_counts"].append(class_counts(pred, fs.test_y[mask]))
            if open_set:
                with torch.no_grad():
                    st["open_set"].append(open_set_scores(learner, fs, ordering, t, mask,
                                                          pred == fs.test_y[mask]))
            st["predict_seconds"] += time.perf_counter() - t0  # includes retraining, if any
            st["n_test"].append(int(mask.sum()))
            st["memory"].append(learner.memory_bytes())

    def save() -> None:
        if checkpoint_every > 0 and on_checkpoint is not None:
            on_checkpoint({**st, "learner": learner.state_dict()})

    def learn(lo: int, hi: int) -> None:
        idx = ordering.stream[lo:hi]
        if regime.name == "streaming":
            for i in idx:
                learner.learn_one(Z[i], y[i])
        elif regime.name == "online":
            learner.learn_many(Z[idx], y[idx])
        else:  # one task, several epochs; the shuffles depend on the seed and the task only
            gen = np.random.default_rng([ordering.seed, lo, hi])
            for _ in range(regime.epochs):
                perm = idx[gen.permutation(len(idx))]
                for s in range(0, len(perm), regime.batch_size):
                    b = perm[s:s + regime.batch_size]
                    learner.learn_many(Z[b], y[b])

    evaluate_due()
    if resume is None:
        save()
    for stop in (c for c in _chunks(regime, events, n_stream, checkpoint_every)
                 if c > st["position"]):
        lo = st["position"]
        t0 = time.perf_counter()
        learn(lo, stop)
        st["learn_seconds"] += time.perf_counter() - t0
        if progress is not None:
            progress(stop - lo)
        st["position"] = stop
        evaluate_due()
        every = checkpoint_every
        if every > 0 and stop < n_stream and stop // every > lo // every:
            save()
    learn_seconds = st["learn_seconds"]
    return {
        "seed": ordering.seed,
        "events": events,
        "n_test": st["n_test"],
        "accuracy": st["accuracy"],
        # per event {label: [correct, n]}; absent if a checkpoint of an older ciosl resumed
        **({"class_counts": st["class_counts"],
            "matrix_columns": matrix_columns(ordering.event_classes, range(fs.n_classes))}
           if len(st["class_counts"]) == len(events) else {}),
        "n_base": len(ordering.base),
        "n_stream": n_stream,
        "base_seconds": st["base_seconds"],
        "learn_seconds": learn_seconds,
        "predict_seconds": st["predict_seconds"],
        "seconds_per_sample": learn_seconds / max(1, n_stream),
        "samples_per_second": n_stream / learn_seconds if learn_seconds > 0 else float("inf"),
        "peak_memory_bytes": max(st["memory"]),
        "class_order": list(ordering.class_order),
        **({"open_set": open_set_record(learner, st["open_set"])} if open_set else {}),
    }


def open_set_scores(learner: Learner, fs: FeatureSet, ordering: Ordering, t: int,
                    known: np.ndarray, correct: np.ndarray) -> dict:
    """The open-set scores of event t: ``known`` masks the test samples of the classes learned
    by then (``correct``: which of them ``learner`` classified right), every other test sample
    is novel. AUROC / AUOSC of the learner's ``novelty_score`` and, when that is not already
    1 - max probability, of 1 - max probability too (the baseline every learner has)."""
    novel = ~np.isin(fs.test_y, ordering.known(t))
    out: dict = {"n_novel": int(novel.sum())}
    if not novel.any():
        return {**out, "auroc": None, "auosc": None}
    Zk, Zn = fs.test_z[known], fs.test_z[novel]
    sk, sn = learner.novelty_score(Zk), learner.novelty_score(Zn)
    out.update(auroc=auroc(sk, sn), auosc=auosc(sk, sn, correct))
    if type(learner).novelty != NOVELTY_DEFAULT:
        mk = 1.0 - learner.predict_proba(Zk).max(axis=1)
        mn = 1.0 - learner.predict_proba(Zn).max(axis=1)
        out.update(auroc_max_probability=auroc(mk, mn),
                   auosc_max_probability=auosc(mk, mn, correct))
    return out


def open_set_record(learner: Learner, per_event: list[dict]) -> dict:
    """A run's open-set fields: the score used and one value per testing event."""
    own = type(learner).novelty
    rec: dict = {"score": own, "n_novel": [e["n_novel"] for e in per_event],
                 "auroc": [e["auroc"] for e in per_event],
                 "auosc": [e["auosc"] for e in per_event]}
    if own != NOVELTY_DEFAULT:
        rec["baseline"] = {"score": NOVELTY_DEFAULT,
                           "auroc": [e.get("auroc_max_probability") for e in per_event],
                           "auosc": [e.get("auosc_max_probability") for e in per_event]}
    return rec
