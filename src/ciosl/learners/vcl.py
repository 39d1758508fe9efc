"""VCL: variational continual learning (Nguyen et al. 2018, "Variational Continual Learning")
adapted to the class-incremental stream, as the paper's baseline.

Head: CIOSL's mean-field Gaussian MLP (``bnn.py``, hidden [256, 256], ReLU) with ONE output
layer that grows with the classes (a single head: class-incremental, no task identity). Per
incoming sample (z, y), ONE SGD step (lr 0.01, momentum 0.9, weight decay 1e-5) on

    L = CE(f(z), y) + lambda1 * KL(q || prior) / N

with one local-reparameterization draw, N = samples seen so far (base init included). No replay
and no distillation: this is CIOSL's objective with lambda2 = 0 and N1' = N2' = 0, and it runs
on CIOSL's own machinery (``bayes_head.BayesHead``: the same step, optimizer, init, growth, base
training and prediction), so the two differ only in what VCL leaves out.

Design choices:

- The prior is the previous posterior (VCL's p_t = q_{t-1}). A stream has no task boundaries,
  so when the posterior becomes the prior is CIOSL's ``prior_refresh`` setting, with the same
  default (``"every"``, R = ``refresh_every`` = 500 stream samples): within a window the KL
  anchors the head to the last snapshot, on every ordering. ``"class"`` (refresh when a new
  label arrives) is the closest reading of VCL's task boundaries on class orderings, but leaves
  the head anchored to the base posterior on the iid and instance orderings; ``"step"`` makes
  the KL inert (the first trap of docs/design.md); ``"base"`` anchors to the base posterior forever.
- After ``fit_base`` (``base_epochs`` epochs, KL to the initial prior N(0, s^2 / fan_in)) the
  prior is the base posterior.
- A new class's output unit starts as a freshly built layer's would, with the initial prior
  (``bnn.py``); nothing learned moves.
- Prediction: mean weights by default, or the MC average of ``mc_samples`` softmaxes
  (``prediction="mc"``), as CIOSL.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from ciosl.learners.base import register
from ciosl.learners.bayes_head import (
    BAYES_HELP,
    BAYES_MAX_GRAD_NORM,
    FISHER_DECAY,
    REFRESHES,
    BayesHead,
)


@register
class VCL(BayesHead):
    name = "vcl"
    description = "Bayesian MLP head, KL to the previous posterior as prior; no replay"
    choices = {"prior_refresh": REFRESHES, "prediction": ("mean", "mc")}
    help = dict(BAYES_HELP)
    help["mc_samples"] = "k: weight draws averaged by prediction=mc"
    help["seed"] = "seed of the init, the noise draws and the base shuffling"
    conformance_settings: ClassVar[list[dict]] = [
        {"prior_refresh": "class", "prediction": "mc"},
        {"refresh_every": 3},
    ]

    def __init__(self, *, lambda1: float = 1.0, prior_refresh: str = "every",
                 refresh_every: int = 500, prediction: str = "mean", mc_samples: int = 5,
                 temperature: float = 1e-4,
                 fisher_decay: float = FISHER_DECAY, prior_scale: float = 1.0, lr: float = 0.01,
                 max_grad_norm: float = BAYES_MAX_GRAD_NORM,
                 momentum: float = 0.9, weight_decay: float = 1e-5, base_epochs: int = 10,
                 base_batch_size: int = 16, seed: int = 0):
        self.lambda1 = lambda1
        self.prior_refresh = prior_refresh
        self.refresh_every = refresh_every
        self.prediction = prediction
        self.mc_samples = mc_samples
        self.temperature = temperature
        self.fisher_decay = fisher_decay
        self.prior_scale = prior_scale
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.base_epochs = base_epochs
        self.base_batch_size = base_batch_size
        super().__init__(seed=seed)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._learn_batch(z[None], np.array([yi]))

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """One step on b new rows (streaming: b = 1)."""
        self._refresh_if_due(len(yi))
        self._step(torch.from_numpy(np.ascontiguousarray(Z)),  # (b, d)
                   torch.from_numpy(np.asarray(yi, np.int64)),  # (b,)
                   n_data=self.n_seen_ + len(yi))

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (n, d)
        self._train(X, torch.from_numpy(yi), epochs=self.base_epochs,
                    batch_size=self.base_batch_size, n_data=self.n_seen_ + len(X))
        self._base_done()
