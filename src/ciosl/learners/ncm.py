"""NCM: nearest class mean.

One running mean per class (exact, count-weighted, float64); predict the class whose mean is
nearest in Euclidean distance. ``predict_proba`` is softmax(-||z - mu_k||^2 / temperature),
computed from the logits (2 z.mu_k - ||mu_k||^2) / temperature, which differ from the negative
squared distances by a per-row constant (||z||^2) that the softmax cancels: no large numbers, no
cancellation, and the max is subtracted before exponentiating.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ciosl.learners.base import Learner, register


def merge_means(mu: torch.Tensor, n: torch.Tensor, Z: torch.Tensor, yi: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact class means and counts after adding the batch (Z, yi) to means ``mu`` of ``n``."""
    m = torch.bincount(yi, minlength=len(mu))  # (K,)
    sums = torch.zeros_like(mu).index_add_(0, yi, Z)  # (K, d)
    n_new = n + m
    mu_new = (mu * n[:, None] + sums) / n_new.clamp(min=1)[:, None]
    return mu_new, n_new


@register
class NCM(Learner):
    name = "ncm"
    regimes = ("streaming", "online")
    regime_note = ("a running class mean: visiting a task for several epochs counts its samples several times")
    description = "nearest class mean (running per-class means, Euclidean distance)"
    help = {
        "temperature": "softmax temperature on negative squared distances (predict_proba)",
        "seed": "unused (NCM is deterministic); kept for the common protocol",
    }

    def __init__(self, *, temperature: float = 1.0, seed: int = 0):
        self.temperature = temperature
        super().__init__(seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if not self.temperature > 0:
            raise ValueError(f"{self.name}: temperature must be > 0, got {self.temperature}")

    def _init_state(self, dim: int) -> None:
        self.mu = torch.zeros(0, dim, dtype=torch.float64)  # (K, d)
        self.counts = torch.zeros(0, dtype=torch.int64)  # (K,)

    def _add_class(self) -> None:
        self.mu = torch.cat([self.mu, self.mu.new_zeros(1, self.mu.shape[1])])
        self.counts = torch.cat([self.counts, self.counts.new_zeros(1)])

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        Z64 = torch.from_numpy(Z).double()
        self.mu, self.counts = merge_means(self.mu, self.counts, Z64, torch.from_numpy(yi))

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        n = int(self.counts[yi])
        self.mu[yi] += (torch.from_numpy(z).double() - self.mu[yi]) / (n + 1)
        self.counts[yi] += 1

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        Z64 = torch.from_numpy(Z).double()  # (n, d)
        logits = (2 * Z64 @ self.mu.T - (self.mu**2).sum(1)) / self.temperature  # (n, K)
        return torch.softmax(logits, dim=1).numpy()

    def _state(self) -> dict[str, Any]:
        return {"mu": self.mu.clone(), "counts": self.counts.clone()}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.mu, self.counts = state["mu"].clone(), state["counts"].clone()
