"""Deep SLDA: streaming linear discriminant analysis (Hayes & Kanan, CVPR-W 2020).

Per-class running means mu_k and one covariance Sigma shared by all classes, both float64,
updated in exact blocks of samples (``blocks.py``: one float64 GEMM per block for S).
Sigma is the pooled within-class covariance S / t, S = sum_i (z_i - mu_{y_i})(z_i - mu_{y_i})^T
over the t samples seen. A new (z, y), with n_y samples of class y seen before, updates it
exactly (Welford): S += n_y / (n_y + 1) (z - mu_y)(z - mu_y)^T, then mu_y and n_y. Streaming
over samples therefore equals the batch estimate on the same samples up to rounding; a block
adds the sum of these updates at once (``_add_scatter``), and answers count the waiting rows.

Deviations from the original code, on purpose: docs/findings/shrinkage-and-ranpac.md.

Prediction: Lambda = ((1 - eps) Sigma + eps I)^-1 with eps = ``shrinkage``, scores
W z + b with W = mu Lambda (one row per class) and b = -0.5 diag(mu Lambda mu^T),
``predict_proba`` = softmax(scores). Answers at any moment (issue 49): docs/findings/shrinkage-and-ranpac.md.

``shrinkage_estimator="oas"`` (the default since issue 38's study on the development streams,
docs/findings/shrinkage-and-ranpac.md) chooses the shrinkage from the stream instead of ``shrinkage``: the Oracle
Approximating Shrinkage of Chen et al. (2010) on the pooled within-class covariance,
Sigma_s = (1 - a) Sigma + a (tr Sigma / d) I, with a computed from tr Sigma, ||Sigma||_F^2 and
the sample count t (``oas_shrinkage``: scikit-learn's ``OAS(assume_centered=True)`` on the
deviations z_i - mu_{y_i}). Those are functions of the running statistics, so no sample is
stored or revisited; the coefficient in use is ``shrinkage_``. Why not Ledoit-Wolf: docs/findings/shrinkage-and-ranpac.md.

``streaming_update=False`` is the paper's frozen variant: Sigma is estimated by ``fit_base``
only and the stream updates the means alone (with no base init, Sigma stays 0 and SLDA reduces
to nearest class mean under the shrinkage metric eps I).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.anytime import Answer, lda_refit, lda_rows_caught_up, pmax_for
from ciosl.learners.base import register
from ciosl.learners.blocks import BlockMeans
from ciosl.learners.rplda import add_gram_, symmetric
from ciosl.learners.shrinkage import SHRINKAGE_ESTIMATORS, check_shrinkage


@register
class SLDA(BlockMeans):
    name = "slda"
    regimes = ("streaming", "online")
    regime_note = ("running class means and covariance: several epochs count the same samples several times")
    description = "Deep streaming LDA: class means + one shared streaming covariance"
    help = {
        "shrinkage": "eps in Lambda = ((1 - eps) Sigma + eps I)^-1 (shrinkage_estimator=fixed)",
        "shrinkage_estimator": "fixed: eps = shrinkage; oas: chosen from the running statistics"
                               " (Oracle Approximating Shrinkage towards tr(Sigma)/d I)",
        "streaming_update": "update the covariance on the stream (False: frozen after fit_base)",
        "seed": "unused (SLDA is deterministic); kept for the common protocol",
    }
    choices: ClassVar[dict[str, tuple]] = {"shrinkage_estimator": SHRINKAGE_ESTIMATORS}
    added_settings: ClassVar[dict[str, Any]] = {"shrinkage_estimator": "fixed"}
    conformance_settings: ClassVar[list[dict]] = [{"streaming_update": False},
                                                  {"shrinkage_estimator": "fixed"}]

    def __init__(self, *, shrinkage: float = 1e-4, shrinkage_estimator: str = "oas",
                 streaming_update: bool = True, seed: int = 0):
        self.shrinkage = shrinkage
        self.shrinkage_estimator = shrinkage_estimator
        self.streaming_update = streaming_update
        super().__init__(seed=seed)

    def _init_state(self, dim: int) -> None:
        self._S = torch.zeros(dim, dim, dtype=torch.float64)  # (d, d) S committed, lower part
        self.n_cov = 0  # samples in S
        self._in_base = False
        super()._init_state(dim)  # means, counts and the waiting rows (blocks.py)
        self._invalidate(cov=True)

    def _invalidate(self, cov: bool) -> None:
        if cov:
            self._S_total: torch.Tensor | None = None

    def _changed(self, cov: bool) -> None:
        super()._changed(cov)
        self._invalidate(cov=cov and self.streaming_update)

    @property
    def scatter(self) -> torch.Tensor:
        """S of every sample learned (waiting rows included), (d, d) float64, symmetric."""
        if self._S_total is None:
            S, p = self._S, self.n_pending
            if p and self.streaming_update:
                S = S.clone()
                Z64, u, inv, m, nu = self._group(self.pending_z[:p], self.pending_y[:p])
                self._add_scatter(S, Z64, u, inv, m, nu, self._mu.view, self._n.view)
            self._S_total = symmetric(S)
        return self._S_total

    def _check_settings(self) -> None:
        super()._check_settings()
        check_shrinkage(self)

    @property
    def covariance(self) -> torch.Tensor:
        """Sigma = S / t, (d, d) float64."""
        t = self.n_cov + (self.n_pending if self.streaming_update else 0)
        return self.scatter / max(t, 1)

    @staticmethod
    def _add_scatter(S, Z64, u, inv, m, nu, mu, n) -> None:
        """S += the block's exact scatter update, before the means mu (K, d) and counts n (K,)
        take the block (Chan et al.; it equals Welford's sample-by-sample updates summed):
        the rows' scatter about their block class means nu_k, plus, per class seen before,
        n_k m_k / (n_k + m_k) (nu_k - mu_k)(nu_k - mu_k)^T. Both in one product of the block's
        rows alone, each about its class's shifted centre
        c_k = nu_k - (n_k / (n_k + m_k))^0.5 (nu_k - mu_k): since the m_k rows z_i - nu_k sum
        to zero, sum_i (z_i - c_k)(z_i - c_k)^T = sum_i (z_i - nu_k)(z_i - nu_k)^T
        + m_k (nu_k - c_k)(nu_k - c_k)^T, and m_k (nu_k - c_k)(nu_k - c_k)^T is the term
        above (c_k = nu_k for a new class). Still a sum of outer products of rows, nothing
        subtracted (no cancellation), and no extra row per class seen before (issue 34: those
        rows made the product up to twice as tall, 92 more of 256 at 100 classes); equal to
        the form with those rows up to rounding. One GEMM on the lower tiles only
        (``rplda.add_gram_``)."""
        n0 = n[u].double()
        f = (n0 / (n0 + m)).sqrt_()  # (u,), 0 for a class new in the block
        c = torch.addcmul(nu, nu - mu[u], f[:, None], value=-1.0)  # (u, d) the centres c_k
        add_gram_(S, torch.sub(Z64, c[inv]), tile=256)

    @property
    def shrinkage_(self) -> float:
        """The shrinkage coefficient of the current prediction rule (``shrinkage`` if fixed,
        as chosen at the last refit, the ridge held since: ``held_ridge``)."""
        self._weights()
        return self._answer.shrinkage

    def _fold(self, Z64, u, inv, m, nu, mu, n) -> None:
        if self.streaming_update or self._in_base:
            self._add_scatter(self._S, Z64, u, inv, m, nu, mu, n)
            self.n_cov += len(Z64)

    def _save_first_commit(self, journal: dict[str, Any]) -> None:
        journal["scatter"] = self._S.clone(), self.n_cov

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        if "scatter" in record:
            self._S, self.n_cov = record["scatter"]
        super()._undo(record, n_classes)
        self._invalidate(cov=True)

    draws_random = False  # no step draws a random number (Learner._draws_random)
    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """The waiting rows are committed first (as stream samples), then the base set at
        once, its scatter included whatever ``streaming_update`` says."""
        if self.n_pending:
            self._commit(self.pending_z[:self.n_pending], self.pending_y[:self.n_pending])
            self.n_pending = 0
        self._in_base = True
        try:
            self._commit(torch.from_numpy(Z), torch.from_numpy(np.asarray(yi, np.int64)))
        finally:
            self._in_base = False
        self._changed(cov=True)
        self._invalidate(cov=True)
        self._new_generation()

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The scores' (W (K, d), b (K,)) of every sample learned: kept, caught up on the rows
        learned since the last answer (``anytime.py``), refit when those rows are gone or the
        corrections since the last refit would pass d / 4 rows."""
        ans, at = self._answer, (self._gen, self.n_pending)
        if ans is not None and ans.at == at:
            return ans.Wb
        new = None
        if ans is not None and ans.kept is not None:
            rows = self._rows_since(*ans.at)
            if rows is not None:
                new = self._caught_up(ans, at, *rows)
        if new is None:
            t = self.n_cov + (self.n_pending if self.streaming_update else 0)
            new = lda_refit(at, self.scatter, self.mu.clone(), self.counts.clone(), t,
                            self.shrinkage, self.shrinkage_estimator, pmax_for(self.dim_))
        self._answer = new
        return new.Wb

    def _answer_now(self) -> None:
        self._weights()

    def _caught_up(self, ans: Answer, at, Zr: torch.Tensor, yr: torch.Tensor
                   ) -> Answer | None:
        return lda_rows_caught_up(ans, at, len(self.classes_), Zr.double(), yr,
                                  self.streaming_update, self.shrinkage_estimator)

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        W, b = self._weights()
        scores = (torch.from_numpy(Z).double() @ W.T).add_(b)  # (n, K), no temporary
        return torch.softmax(scores, dim=1).numpy()

    novelty = "Mahalanobis distance to the nearest class mean (the shared shrunk covariance)"

    def _novelty_score(self, Z: np.ndarray) -> np.ndarray:
        """min_k sqrt((z - mu_k)' Lambda (z - mu_k)) = sqrt(z' Lambda z - 2 max_k (w_k z + b_k))
        with the scores of ``_predict_proba`` (w_k = Lambda mu_k, b_k = -mu_k' Lambda mu_k / 2)."""
        W, b = self._weights()
        Z64 = torch.from_numpy(Z).double()
        quad = (self._answer.precision(Z64.T).T * Z64).sum(1)  # z' Lambda z, (n,)
        best = (Z64 @ W.T).add_(b).max(dim=1).values
        return (quad - 2 * best).clamp_(min=0.0).sqrt_().numpy()

    def _state(self) -> dict[str, Any]:
        return {**self._block_state(), "scatter": symmetric(self._S), "n_cov": self.n_cov}

    def _load_state(self, state: dict[str, Any]) -> None:
        d = self.dim_
        if state["scatter"].shape != (d, d):
            raise ValueError(f"scatter of shape {tuple(state['scatter'].shape)} for width {d}")
        self._S, self.n_cov = state["scatter"].double().clone(), int(state["n_cov"])
        self._load_block_state(state)
        self._invalidate(cov=True)
        self._new_generation()
