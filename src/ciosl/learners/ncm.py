"""NCM: nearest class mean.

One running mean per class (exact, count-weighted, float64, taken in blocks of samples:
``blocks.py``); predict the class whose mean is nearest in Euclidean distance. ``predict_proba`` is softmax(-||z - mu_k||^2 / temperature),
computed from the logits (2 z.mu_k - ||mu_k||^2) / temperature, which differ from the negative
squared distances by a per-row constant (||z||^2) that the softmax cancels: no large numbers, no
cancellation, and the max is subtracted before exponentiating.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ciosl.learners.anytime import pmax_for
from ciosl.learners.base import register
from ciosl.learners.blocks import BlockMeans


def merge_means(mu: torch.Tensor, n: torch.Tensor, Z: torch.Tensor, yi: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact class means and counts after adding the batch (Z, yi) to means ``mu`` of ``n``."""
    m = torch.bincount(yi, minlength=len(mu))  # (K,)
    sums = torch.zeros_like(mu).index_add_(0, yi, Z)  # (K, d)
    n_new = n + m
    mu_new = (mu * n[:, None] + sums) / n_new.clamp(min=1)[:, None]
    return mu_new, n_new


@register
class NCM(BlockMeans):
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

    _fit_base = BlockMeans._append

    def _answer_now(self) -> None:
        self._answer_means()
    draws_random = False  # no step draws a random number (Learner._draws_random)

    def _answer_means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The class means (K, d) and ||mu_k||^2 (K,) of every sample learned, kept between
        answers: the rows learned since the last answer are merged into its means (O(m d) for
        m rows, plus a copy of the (K, d) means), as the block merge does; the means are taken
        again from the statistics when those rows are gone (``_rows_since``) or when d / 4 rows
        were merged since (the merges' rounding does not accumulate)."""
        ans, at = self._answer, (self._gen, self.n_pending)
        if ans is not None and ans[0] == at:
            return ans[1], ans[3]
        rows = None if ans is None else self._rows_since(*ans[0])
        merged = 0 if rows is None else ans[4] + len(rows[1])
        if rows is None or merged > pmax_for(self.dim_):
            # the means of the statistics, copied (the committed rows move): at the latest
            # every d / 4 rows merged, so that the merges' rounding does not accumulate
            mu, n = self.mu.clone(), self.counts.clone()
            sq = (mu**2).sum(1)  # (K,)
            merged = 0
        else:
            _, mu0, n0, sq0, _ = ans
            grow = len(self.classes_) - len(mu0)
            mu = torch.cat([mu0, mu0.new_zeros(grow, mu0.shape[1])]) if grow else mu0.clone()
            n = torch.cat([n0, n0.new_zeros(grow)]) if grow else n0.clone()
            sq = torch.cat([sq0, sq0.new_zeros(grow)]) if grow else sq0.clone()
            if len(rows[1]):
                _, u, _, m, nu = self._group(*rows)
                mu[u], n[u] = self._merged(mu, n, u, m, nu)
                sq[u] = (mu[u] ** 2).sum(1)
        self._answer = at, mu, n, sq, merged
        return mu, sq

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        mu, sq = self._answer_means()  # (K, d), (K,): waiting rows included
        Z64 = torch.from_numpy(Z).double()  # (n, d)
        # (2 z.mu - ||mu||^2) / T in place: the same rounding, no (n, K) temporaries
        logits = (Z64 @ mu.T).mul_(2).sub_(sq).div_(self.temperature)  # (n, K)
        return torch.softmax(logits, dim=1).numpy()

    novelty = "Euclidean distance to the nearest class mean"

    def _novelty_score(self, Z: np.ndarray) -> np.ndarray:
        """min_k ||z - mu_k||, from the same logits as ``_predict_proba`` (temperature 1)."""
        mu, sq = self._answer_means()  # (K, d), (K,): the means predictions use
        Z64 = torch.from_numpy(Z).double()
        near = (Z64 @ mu.T).mul_(2).sub_(sq).max(dim=1).values  # max_k 2 z.mu_k - ||mu_k||^2
        return (Z64.square().sum(1) - near).clamp_(min=0.0).sqrt_().numpy()

    def _state(self) -> dict[str, Any]:
        return self._block_state()

    def _load_state(self, state: dict[str, Any]) -> None:
        self._load_block_state(state)
