"""Offline: the upper bound, exposed as a method (``ciosl run --method offline``).

It stores every sample it is given, in order (base init first, then the stream), and when asked
to predict after new data arrived it trains the shared MLP head (hidden [256, 256], ReLU) from
scratch on all of them with ``head.train_offline``: ``epochs`` epochs of shuffled
``batch_size`` mini-batches, SGD lr 0.01, momentum 0.9, weight decay 1e-5. It retrains exactly
as the runner's reference ``evaluation.protocol.offline_accuracy`` does, so its accuracy at
each testing event equals ``accuracy_offline`` and its Omega_all is 1 by construction; its
result file then gives the absolute accuracies of the upper bound.

What makes the training identical to the reference (a coupling to keep in sync with
``offline_accuracy``):

- data: every sample seen, base init then stream prefix, in arrival order (= ``Ordering.seen``);
- output units: the seen labels sorted as ``np.unique`` sorts them; ``predict_proba`` maps the
  columns back to ``classes_`` (order of first appearance);
- seed: ``seed * 1000 + t`` with t the number of retrainings done before this one. The runner
  builds the learner with ``seed = ordering.seed`` and predicts once per testing event, after
  new data (events are distinct stream positions), so t is the event index. t counts
  retrainings, not predictions: predicting again without new data reuses the cached head.
- epochs / batch size: ``protocol_defaults`` takes them from the dataset's ``DatasetSpec``
  (``offline_epochs``, ``offline_batch_size``), as the reference does. ``--offline-epochs N``
  changes only the reference: mirror it with ``--set epochs=N``, or Omega_all is not 1.

Design choices: ``violates_single_pass`` (it revisits everything); no ``buffer`` (unbounded
storage is the point); ``fit_base`` only stores (training is lazy, at the first prediction);
the stored samples, the retraining counter and the cached head are the state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ciosl.data.runtime import resolve_device
from ciosl.learners.base import Learner, register
from ciosl.learners.head import HIDDEN, MLP, train_offline


@register
class Offline(Learner):
    name = "offline"
    violates_single_pass = True
    regimes = ("streaming", "online")
    regime_note = ("it stores every sample once; epochs over a task would store duplicates")
    description = ("upper bound: the MLP head retrained from scratch on everything seen, as the "
                   "offline reference (Omega_all = 1 by construction)")
    help = {
        "epochs": "epochs of each retraining (the dataset's offline_epochs in `ciosl run`)",
        "batch_size": "mini-batch size (the dataset's offline_batch_size in `ciosl run`)",
        "lr": "SGD learning rate",
        "momentum": "SGD momentum",
        "weight_decay": "L2 weight decay added to the gradient",
        "seed": "retraining t is seeded with seed * 1000 + t, as the offline reference",
    }

    def __init__(self, *, epochs: int = 50, batch_size: int = 128, lr: float = 0.01,
                 momentum: float = 0.9, weight_decay: float = 1e-5, seed: int = 0):
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        super().__init__(seed=seed)

    # where retraining runs: not a setting (results and state do not depend on it beyond float
    # rounding); None: $CIOSL_DEVICE, else auto. The runner sets it to the reference's device.
    device: str | None = None

    @classmethod
    def protocol_defaults(cls, *, ordering: str, spec: Any = None) -> dict[str, Any]:
        """The reference learner's epochs and batch size for this dataset."""
        if spec is None:
            return {}
        return {**super().protocol_defaults(ordering=ordering, spec=spec),
                "epochs": spec.offline_epochs, "batch_size": spec.offline_batch_size}

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.epochs < 1 or self.batch_size < 1:  # lr: its range (Learner.ranges)
            raise ValueError(f"{self.name}: need epochs >= 1 and batch_size >= 1")

    def _init_state(self, dim: int) -> None:
        self.Z = torch.zeros(64, dim)  # (capacity, d), doubled when full; rows [:n] used
        self.y = torch.zeros(64, dtype=torch.int64)  # (capacity,) internal class indices
        self.n = 0
        self.n_trains = 0  # retrainings so far: t of the next one
        self._head: MLP | None = None
        self._head_n = -1  # samples the cached head was trained on

    def _add_class(self) -> None:
        pass

    def _append(self, Z: np.ndarray, yi: np.ndarray) -> None:
        end = self.n + len(Z)
        if end > len(self.Z):
            cap = max(end, 2 * len(self.Z))
            self.Z = torch.cat([self.Z[:self.n], self.Z.new_zeros(cap - self.n, self.Z.shape[1])])
            self.y = torch.cat([self.y[:self.n], self.y.new_zeros(cap - self.n)])
        self.Z[self.n:end] = torch.from_numpy(Z)
        self.y[self.n:end] = torch.from_numpy(np.asarray(yi, dtype=np.int64))
        self.n = end

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        self._append(Z, yi)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._append(z[None], np.array([yi]))

    def _sorted_rank(self) -> np.ndarray:
        """(K,) position of each internal class among the labels sorted as np.unique sorts."""
        order = np.argsort(np.asarray(self.classes_), kind="stable")  # sorted pos -> internal
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return rank

    def head(self) -> MLP:
        """The head trained on everything seen (cached until new data arrive)."""
        if self._head is None or self._head_n != self.n:
            rank = self._sorted_rank()
            with torch.enable_grad():  # the runner predicts under torch.no_grad
                self._head = train_offline(
                    self.Z[:self.n].numpy(), rank[self.y[:self.n].numpy()], len(rank),
                    epochs=self.epochs, batch_size=self.batch_size,
                    seed=int(self.seed) * 1000 + self.n_trains, lr=self.lr,
                    momentum=self.momentum, weight_decay=self.weight_decay,
                    device=resolve_device(self.device))
            self._head_n = self.n
            self.n_trains += 1
        return self._head

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        P = self.head().predict_proba(Z)  # (n, K) columns in sorted-label order
        return P[:, self._sorted_rank()]  # (n, K) columns in classes_ order

    def _undo_record(self, yi: np.ndarray) -> int:
        return self.n  # learning only appends rows: truncation undoes it

    def _undo(self, record: int, n_classes: int) -> None:
        self.n = record

    def _state(self) -> dict[str, Any]:
        return {"Z": self.Z[:self.n].clone(), "y": self.y[:self.n].clone(),
                "n_trains": self.n_trains, "head_n": self._head_n,
                "head": None if self._head is None else [t.cpu() for t in self._head.state()]}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.n = 0
        self._append(state["Z"].numpy(), state["y"].numpy())
        self.n_trains = int(state["n_trains"])
        self._head_n = int(state["head_n"])
        self._head = None
        if state["head"] is not None:
            self._head = MLP(1, 1, HIDDEN, generator=torch.Generator())  # shapes come from load
            self._head.load(state["head"])
