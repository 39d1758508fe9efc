"""GDumb: greedy class-balanced sampler + a head retrained from scratch before inference
(Prabhu et al. 2020, "GDumb: A Simple Approach that Questions Our Progress in Continual
Learning").

Sampler (per incoming sample of class y, with C = ``buffer`` and n = classes seen so far,
y's class included): store it if the memory is not full; else, if y holds fewer than C / n
items, evict an item drawn uniformly from the largest class (ties: the lowest class index,
``ReplayMemory``'s ``class_balanced_random``) and store it; else drop it. Once full, with
enough samples per class, the class counts differ by at most one.

Inference: the shared MLP head (hidden [256, 256], ReLU) trained FROM SCRATCH on the memory
(``head.train_offline``: ``retrain_epochs`` epochs of shuffled ``batch_size`` mini-batches,
SGD lr 0.01, momentum 0.9, weight decay 1e-5), one output unit per class seen. This retraining
before inference breaks the single-pass rule (``violates_single_pass``; the paper marks GDumb
red).

Design choices:

- ``retrain_epochs`` = 30 by default: GDumb's own recipe (SGDR, cutmix, 256 epochs on images)
  is for training a backbone; on frozen features 30 epochs of batch 16 fit the memory of
  1000 items well (~1900 steps) at a cost of well under a second per testing event.
- The retrained head is cached with the memory version it was trained on (a counter of
  memory writes) and reused until the memory changes; a dropped sample changes nothing.
- The retrain's generator is seeded by (seed, memory version): the same memory always gives
  the same head, and predicting never consumes the stream's generators (``rng`` only drives
  the evictions), so prediction does not change what the learner does next.
- ``fit_base`` only passes the base samples through the sampler, in the order given: a head
  trained on them would be thrown away before the first inference.
- The cached head is part of the state (and of ``memory_bytes``), so a restored learner
  predicts without retraining.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import Learner, register
from ciosl.learners.head import HIDDEN, MLP, train_offline
from ciosl.learners.memory import ReplayMemory

_NO_LOGITS = torch.zeros(0)


@register
class GDumb(Learner):
    name = "gdumb"
    violates_single_pass = True
    regimes = ("streaming", "online")
    regime_note = ("its greedy class-balanced sampler would store the same sample several times")
    description = ("class-balanced greedy memory; head retrained from scratch on it before "
                   "each inference")
    help = {
        "buffer": "memory capacity (items), class-balanced greedy sampling",
        "retrain_epochs": "epochs of the from-scratch retraining before inference",
        "batch_size": "mini-batch size of the retraining",
        "lr": "SGD learning rate of the retraining",
        "momentum": "SGD momentum of the retraining",
        "weight_decay": "L2 weight decay of the retraining",
        "seed": "seed of the evictions and (with the memory version) of each retraining",
    }
    conformance_settings: ClassVar[list[dict]] = [{"buffer": 12, "retrain_epochs": 10}]

    def __init__(self, *, buffer: int = 1000, retrain_epochs: int = 30, batch_size: int = 16,
                 lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-5,
                 seed: int = 0):
        self.buffer = buffer
        self.retrain_epochs = retrain_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        super().__init__(seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.buffer < 1 or self.retrain_epochs < 1 or self.batch_size < 1:  # lr: its range
            raise ValueError(f"{self.name}: need buffer >= 1, retrain_epochs >= 1 and "
                             "batch_size >= 1")

    def _init_state(self, dim: int) -> None:
        self.memory = ReplayMemory(self.buffer, dim, replacement="class_balanced_random")
        self.version = 0  # memory writes so far
        self._head: MLP | None = None  # retrained head, valid for memory version _head_version
        self._head_version = -1

    def _add_class(self) -> None:
        pass  # the retrained head has one unit per class seen; the sampler's threshold moves

    def memory_size(self) -> int:
        return len(self.memory)

    def _offer(self, z: Any, yi: int) -> None:
        mem = self.memory
        if len(mem) >= mem.capacity and (
                mem.class_counts().get(yi, 0) >= mem.capacity / len(self.classes_)):
            return  # y already holds its share
        mem.offer(z, yi, logits=_NO_LOGITS, loss=0.0, uncertainty=0.0, rng=self.rng)
        self.version += 1

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._offer(z, yi)

    def head(self) -> MLP:
        """The head trained from scratch on the current memory (cached until it changes)."""
        n_classes = len(self.classes_)
        if (self._head is None or self._head_version != self.version
                or self._head.n_out != n_classes):
            Zm, ym = self.memory.batch(np.arange(len(self.memory)))  # (m, d), (m,)
            with torch.enable_grad():  # the runner predicts under torch.no_grad
                self._head = train_offline(
                    Zm.numpy(), ym.numpy(), n_classes, epochs=self.retrain_epochs,
                    batch_size=self.batch_size, seed=int(self.seed) * 1_000_003 + self.version,
                    lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
            self._head_version = self.version
        return self._head

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        return self.head().predict_proba(Z)  # (n, n_seen)

    def _undo_record(self, yi: np.ndarray) -> tuple:
        return self.memory.begin(), self.version  # the head is replaced, never changed

    def _undo(self, record: tuple, n_classes: int) -> None:
        self.memory.rollback(record[0])
        self.version = record[1]

    def _undo_done(self, record: tuple) -> None:
        self.memory.commit()

    def _state(self) -> dict[str, Any]:
        return {"memory": self.memory.state(), "version": self.version,
                "head": None if self._head is None else self._head.state(),
                "head_version": self._head_version}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.memory.load(state["memory"])
        self.version = int(state["version"])
        self._head_version = int(state["head_version"])
        self._head = None
        if state["head"] is not None:
            self._head = MLP(1, 1, HIDDEN, generator=torch.Generator())  # shapes come from load
            self._head.load(state["head"])
