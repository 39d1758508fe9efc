"""Fine-tune: the paper's lower bound.

The shared MLP head (hidden [256, 256], ReLU) trained on the stream one sample at a time, one
SGD step (momentum, weight decay) per sample on that sample's cross-entropy, nothing else.
``fit_base`` trains offline for ``base_epochs`` epochs of shuffled ``base_batch_size``
mini-batches with the same optimizer, and its momentum buffers carry on into the stream (the
stream continues the same SGD trajectory rather than restarting it). A new class adds one
output unit with torch.nn.Linear's init and a zero momentum buffer; no learned weight moves.

Every step (base and stream) clips its gradient to the L2 norm ``max_grad_norm`` (default 1,
``head.SGD``) before the momentum update: not in the paper, whose plain SGD at lr 0.01 diverges
on one-sample steps over standardised 784-d pixels and collapses to one class on the iid streams
(see ``head``); ``max_grad_norm=inf`` gives the paper's plain SGD.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ciosl.learners.base import Learner, register
from ciosl.learners.head import HIDDEN, MAX_GRAD_NORM, MLP, SGD, check_finite
from ciosl.learners.undo import keep, restore


@register
class FineTune(Learner):
    name = "finetune"
    description = "MLP head trained one sample at a time with plain SGD (lower bound)"
    help = {
        "lr": "SGD learning rate",
        "momentum": "SGD momentum (buffers carry on from fit_base into the stream)",
        "weight_decay": "L2 weight decay added to the gradient",
        "max_grad_norm": "clip each step's gradient to this L2 norm (stability; not in the "
                         "paper, inf: the paper's plain SGD)",
        "base_epochs": "epochs of offline training in fit_base",
        "base_batch_size": "mini-batch size in fit_base",
        "seed": "seed of the weight init and the base-init shuffling",
    }
    paper_values: ClassVar[dict[str, Any]] = {"max_grad_norm": math.inf}  # plain SGD
    published_parts: ClassVar[tuple[str, ...] | None] = ("net",)  # predictions read it

    def __init__(self, *, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 1e-5,
                 max_grad_norm: float = MAX_GRAD_NORM, base_epochs: int = 20,
                 base_batch_size: int = 16, seed: int = 0):
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.max_grad_norm = max_grad_norm
        self.base_epochs = base_epochs
        self.base_batch_size = base_batch_size
        super().__init__(seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        # lr, momentum and weight_decay: their ranges (Learner.ranges)
        if self.base_batch_size < 1 or self.base_epochs < 0 or not self.max_grad_norm > 0:
            raise ValueError(f"{self.name}: need max_grad_norm > 0, base_batch_size >= 1, "
                             "base_epochs >= 0")

    def _init_state(self, dim: int) -> None:
        self.net = MLP(dim, 0, HIDDEN, generator=self.torch_rng)  # output grows per class
        self.opt = SGD(self.net.params, lr=self.lr, momentum=self.momentum,
                       weight_decay=self.weight_decay, max_grad_norm=self.max_grad_norm)

    def _add_class(self) -> None:
        self.net.grow(1, self.torch_rng)

    def _check_finite(self, loss: torch.Tensor, X: torch.Tensor) -> None:
        check_finite(loss, X, name=self.name, n_seen=self.n_seen_, lr=self.lr,
                     momentum=self.momentum, max_grad_norm=self.max_grad_norm)

    def _step(self, X: torch.Tensor, Y: torch.Tensor) -> None:
        """One SGD step on the mean cross-entropy of rows X (n, d), Y (n,)."""
        loss = F.cross_entropy(self.net(X), Y)
        self._check_finite(loss, X)
        self.net.params = self.opt.step(self.net.params, torch.autograd.grad(loss, self.net.params))

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (n, d) float32
        Y = torch.from_numpy(yi)  # (n,) int64
        for _ in range(self.base_epochs):
            perm = torch.randperm(len(X), generator=self.torch_rng)
            for s in range(0, len(X), self.base_batch_size):
                idx = perm[s:s + self.base_batch_size]
                self._step(X[idx], Y[idx])

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._step(torch.from_numpy(z)[None], torch.tensor([yi]))  # (1, d), (1,)

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Online / batch regimes: one SGD step on the mini-batch's mean cross-entropy."""
        self._step(torch.from_numpy(np.ascontiguousarray(Z)), torch.from_numpy(yi))

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        return self.net.predict_proba(Z)  # (n, n_seen), under torch.no_grad

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """The head and its optimizer by reference: a step replaces their tensors."""
        return {"net": keep(self.net), "opt": keep(self.opt)}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        restore(record["net"])
        restore(record["opt"])

    def _state(self) -> dict[str, Any]:
        return {"params": self.net.state(), "momentum": self.opt.state()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.net.load(state["params"])
        self.opt.load(state["momentum"])
