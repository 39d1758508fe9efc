"""Deep SLDA: streaming linear discriminant analysis (Hayes & Kanan, CVPR-W 2020).

Per-class running means mu_k and one covariance Sigma shared by all classes, both float64.
Sigma is the pooled within-class covariance S / t, S = sum_i (z_i - mu_{y_i})(z_i - mu_{y_i})^T
over the t samples seen. A new (z, y), with n_y samples of class y seen before, updates it
exactly (Welford): S += n_y / (n_y + 1) (z - mu_y)(z - mu_y)^T, then mu_y and n_y. Streaming
over samples therefore equals the batch estimate on the same samples up to rounding.

Deviation from the original code, on purpose: Hayes & Kanan weight the update by t / (t + 1)
with t the *total* count, an approximation that over-weights the first samples of every new
class; the class count n_y gives the exact pooled scatter. ``fit_base`` computes the batch
means and scatter (no OAS estimator as in the original; the same definition as the stream)
and merges them with any statistics already held (Chan et al.'s parallel update).

Prediction: Lambda = ((1 - eps) Sigma + eps I)^-1 with eps = ``shrinkage``, scores
W z + b with W = mu Lambda (one row per class) and b = -0.5 diag(mu Lambda mu^T),
``predict_proba`` = softmax(scores). Lambda is recomputed lazily, only when predicting after
the covariance changed; W, b after any update.

``shrinkage_estimator="oas"`` (the default since issue 38's study on the development streams,
docs/findings.md) chooses the shrinkage from the stream instead of ``shrinkage``: the Oracle
Approximating Shrinkage of Chen et al. (2010) on the pooled within-class covariance,
Sigma_s = (1 - a) Sigma + a (tr Sigma / d) I, with a computed from tr Sigma, ||Sigma||_F^2 and
the sample count t (``oas_shrinkage``: scikit-learn's ``OAS(assume_centered=True)`` on the
deviations z_i - mu_{y_i}). Those are functions of the running statistics, so no sample is
stored or revisited; the coefficient in use is ``shrinkage_``. Ledoit-Wolf, which
scikit-learn's ``LinearDiscriminantAnalysis(shrinkage="auto")`` uses, is not offered: its
coefficient needs sum_i ||z_i - mu_{y_i}||^4 about the *current* class means, which moves with
every mean update and is exact only from per-class (d, d) second moments. scikit-learn's
"auto" also standardizes each class and shrinks each class's covariance separately; here one
pooled covariance is shrunk towards a multiple of I.

``streaming_update=False`` is the paper's frozen variant: Sigma is estimated by ``fit_base``
only and the stream updates the means alone (with no base init, Sigma stays 0 and SLDA reduces
to nearest class mean under the shrinkage metric eps I).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import Learner, register
from ciosl.learners.ncm import merge_means

SHRINKAGE_ESTIMATORS = ("fixed", "oas")


def oas_shrinkage(trace: float, frob2: float, n: int, d: int) -> float:
    """OAS coefficient a of the covariance Sigma = S / n from tr S, ||S||_F^2, the sample
    count n and the width d: scikit-learn's ``OAS(assume_centered=True)`` formula, term for
    term (a = 0 at d = 1, 1 when its denominator vanishes)."""
    if d == 1:
        return 0.0
    alpha = frob2 / (n * n * d * d)  # mean(Sigma ** 2)
    mu2 = (trace / (n * d)) ** 2  # (tr Sigma / d) ** 2
    den = (n + 1) * (alpha - mu2 / d)
    return 1.0 if den == 0 else min((alpha + mu2) / den, 1.0)


def check_shrinkage(learner) -> None:
    """Refuse a ``shrinkage`` that would be ignored: one set away from its default while
    ``shrinkage_estimator`` chooses it."""
    default = inspect.signature(type(learner).__init__).parameters["shrinkage"].default
    if learner.shrinkage_estimator != "fixed" and learner.shrinkage != default:
        raise ValueError(f"{learner.name}: shrinkage={learner.shrinkage} is used only with "
                         f"shrinkage_estimator=fixed (now {learner.shrinkage_estimator!r}, "
                         "which chooses the shrinkage itself)")


def shrunk_terms(trace: float, frob2: float, n: int, d: int, eps: float,
                 estimator: str) -> tuple[float, float, float]:
    """(a, r, chosen): a S + r I is the shrunk covariance of Sigma = S / n, S the (d, d)
    within-class scatter of n samples given by its trace and squared Frobenius norm, and
    ``chosen`` the shrinkage coefficient used. "fixed": (1 - eps) Sigma + eps I. "oas":
    (1 - c) Sigma + c (tr Sigma / d) I, c = ``oas_shrinkage``; I (nearest class mean) while
    tr S = 0 (no spread seen yet)."""
    n = max(n, 1)
    if estimator == "fixed":
        return (1 - eps) / n, eps, eps
    if trace <= 0:
        return 0.0, 1.0, 1.0
    c = oas_shrinkage(trace, frob2, n, d)
    return (1 - c) / n, c * trace / (n * d), c


@register
class SLDA(Learner):
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
        self.mu = torch.zeros(0, dim, dtype=torch.float64)  # (K, d)
        self.counts = torch.zeros(0, dtype=torch.int64)  # (K,)
        self.scatter = torch.zeros(dim, dim, dtype=torch.float64)  # (d, d), S
        self.n_cov = 0  # samples in S
        self._invalidate(cov=True)

    def _invalidate(self, cov: bool) -> None:
        self._Wb: tuple[torch.Tensor, torch.Tensor] | None = None
        if cov:
            self._Lambda: torch.Tensor | None = None

    def _check_settings(self) -> None:
        super()._check_settings()
        check_shrinkage(self)

    @property
    def covariance(self) -> torch.Tensor:
        """Sigma = S / t, (d, d) float64."""
        return self.scatter / max(self.n_cov, 1)

    @property
    def shrinkage_(self) -> float:
        """The shrinkage coefficient of the current prediction rule (``shrinkage`` if fixed)."""
        self._weights()
        return self._shrinkage

    def _add_class(self) -> None:
        self.mu = torch.cat([self.mu, self.mu.new_zeros(1, self.mu.shape[1])])
        self.counts = torch.cat([self.counts, self.counts.new_zeros(1)])
        self._invalidate(cov=False)

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        Z64, y = torch.from_numpy(Z).double(), torch.from_numpy(yi)
        m = torch.bincount(y, minlength=len(self.mu)).double()  # (K,) batch counts
        nu = merge_means(torch.zeros_like(self.mu), torch.zeros_like(self.counts), Z64, y)[0]
        D = Z64 - nu[y]  # (n, d) deviations from the batch class means
        n0 = self.counts.double()
        w = n0 * m / (n0 + m).clamp(min=1)  # (K,) weight of the between-means term
        delta = nu - self.mu  # (K, d)
        self.scatter += D.T @ D + (delta.T * w) @ delta
        self.n_cov += len(y)
        self.mu, self.counts = merge_means(self.mu, self.counts, Z64, y)
        self._invalidate(cov=True)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        z64 = torch.from_numpy(z).double()  # (d,)
        n = int(self.counts[yi])
        diff = z64 - self.mu[yi]
        if self.streaming_update:
            self.scatter.addr_(diff, diff, alpha=n / (n + 1))
            self.n_cov += 1
        self.mu[yi] += diff / (n + 1)
        self.counts[yi] += 1
        self._invalidate(cov=self.streaming_update)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._Lambda is None:
            S, d = self.scatter, len(self.scatter)
            a, r, self._shrinkage = shrunk_terms(float(S.trace()), float(S.square().sum()),
                                                 self.n_cov, d, self.shrinkage,
                                                 self.shrinkage_estimator)
            A = a * S + r * torch.eye(d, dtype=torch.float64)  # the shrunk covariance
            self._Lambda = torch.linalg.pinv(A, hermitian=True)  # (d, d)
        if self._Wb is None:
            W = self.mu @ self._Lambda  # (K, d); Lambda is symmetric
            self._Wb = W, -0.5 * (W * self.mu).sum(1)  # (K, d), (K,)
        return self._Wb

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        W, b = self._weights()
        scores = torch.from_numpy(Z).double() @ W.T + b  # (n, K)
        return torch.softmax(scores, dim=1).numpy()

    def _state(self) -> dict[str, Any]:
        return {"mu": self.mu.clone(), "counts": self.counts.clone(),
                "scatter": self.scatter.clone(), "n_cov": self.n_cov}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.mu, self.counts = state["mu"].clone(), state["counts"].clone()
        self.scatter, self.n_cov = state["scatter"].clone(), int(state["n_cov"])
        self._invalidate(cov=True)
