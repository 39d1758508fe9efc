"""RanPAC's head: ridge regression on random ReLU features, its ridge chosen from the stream.

RanPAC (McDonnell et al., NeurIPS 2023) lifts the frozen features z (d) into h = relu(P z)
(D = ``proj_dim``) and fits W = (G + lambda I)^-1 C to one-hot targets, with the Gram matrix
G = sum h h^T (D, D) and C = sum h y^T (D, K), the sum of h per class. Both are running sums:
this learner keeps them as ``rp_lda`` keeps its statistics (same projection P from the seed,
same shifted per-class sums and second moment, updated per sample through a buffer committed
in blocks, exact at every moment, same state file), so it subclasses ``RPLDA`` and replaces
only the solve. G = M2 + c s^T + s c^T + t c c^T and C^T = sums + counts c^T, with c the
shift, s the total of h - c and t the sample count.

The ridge lambda: RanPAC holds out part of the first task's data and picks the best lambda on
it. A single-pass learner has no held-out data, so ``ridge_estimator="gcv"`` (the default)
chooses lambda by generalised cross-validation on the running statistics alone (Golub, Heath &
Wahba 1979): the formula and its cost: docs/findings/shrinkage-and-ranpac.md;
``ridge_`` is the lambda in use. ``ridge_estimator="fixed"``: lambda = ``ridge``, one Cholesky
factorization per refit. Answers at any moment (issue 49, docs/anytime.md): between refits the
solution is kept and caught up on the rows learned since the last answer (G += H^T H and
C += H^T Y by Woodbury corrections on the anchor's factorization, ``anytime.Kept``), lambda
held: exactly ridge regression with ``ridge_`` on everything seen. A refit (lambda chosen
again) happens when those rows are gone or the corrections would pass D / 4 rows.

Deviations: no backbone adaptation in the first session (features stay frozen, as for every
learner here); ``predict_proba`` is the softmax of the ridge outputs h W, which ranks the
classes as RanPAC does but is not calibrated (outputs near 0 and 1 give soft probabilities).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.anytime import Answer, Kept, pmax_for
from ciosl.learners.base import Learner, Range, register
from ciosl.learners.rplda import RPLDA, add_gram_, spd_solve, symmetric

GRID = 10.0 ** np.arange(-6.0, 3.01, 0.25)  # lambda / (tr G / D), the GCV candidates


def gcv_ridge(s: torch.Tensor, q: torch.Tensor, t: int, scale: float) -> float:
    """The lambda of ``scale * GRID`` with the least GCV score, from the Gram's eigenvalues s
    (D,), the squared norms q (D,) of the rows of V^T C and the sample count t."""
    lam = torch.as_tensor(GRID * scale, dtype=torch.float64)[:, None]  # (L, 1)
    rss = t - (q * (s + 2 * lam) / (s + lam) ** 2).sum(1)  # (L,)
    df = (s / (s + lam)).sum(1)  # (L,)
    score = rss.clamp(min=0) / (1 - df / t).clamp(min=1e-12) ** 2
    return float(lam[int(score.argmin()), 0])


@register
class RanPAC(RPLDA):
    name = "ranpac"
    description = ("RanPAC's head: random ReLU projection + ridge regression on one-hot targets "
                   "from running Gram statistics, the ridge chosen by GCV on the stream")
    help = {
        "proj_dim": RPLDA.help["proj_dim"],
        "ridge_estimator": "gcv: lambda chosen by generalised cross-validation on the running "
                           "statistics; fixed: lambda = ridge",
        "ridge": "lambda of the ridge (G + lambda I)^-1 C (ridge_estimator=fixed)",
        "seed": "draws the random projection P",
    }
    choices: ClassVar[dict[str, tuple]] = {"ridge_estimator": ("gcv", "fixed")}
    ranges = {**RPLDA.ranges, "ridge": Range(0, 1e6)}
    added_settings: ClassVar[dict[str, Any]] = {}
    conformance_settings: ClassVar[list[dict]] = [
        {"proj_dim": 32}, {"proj_dim": 32, "ridge_estimator": "fixed", "ridge": 0.0}]

    def __init__(self, *, proj_dim: int = 4096, ridge_estimator: str = "gcv", ridge: float = 1.0,
                 seed: int = 0):
        self.proj_dim = proj_dim
        self.ridge_estimator = ridge_estimator
        self.ridge = ridge
        Learner.__init__(self, seed=seed)

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The outputs' (W (K, D), b (K,)) on h - c: kept, caught up on the rows learned since
        the last answer with the ridge held (``anytime.py``: G += H^T H, C += H^T Y), refit
        (the ridge chosen again) when those rows are gone or the corrections would pass D / 4
        rows."""
        ans, at = self._answer, (self._gen, self.n_pending)
        if ans is not None and ans.at == at:
            return ans.Wb
        new = None
        if ans is not None and ans.kept is not None:
            rows = self._rows_since(*ans.at)
            if rows is not None and len(rows[1]):
                new = self._caught_up(ans, at, *rows)
        if new is None:
            new = self._refit(at)
        self._answer = new
        return new.Wb

    def _caught_up(self, ans: Answer, at, Zr: torch.Tensor, yr: torch.Tensor) -> Answer | None:
        H = self._project(Zr)  # (m, D): G += H^T H
        u, inv = torch.unique(yr, return_inverse=True)
        E = torch.nn.functional.one_hot(inv, len(u)).double()  # (m, u): C += H^T Y
        grow = len(self.counts) - len(ans.M)
        R = torch.cat([ans.M, ans.M.new_zeros(grow, H.shape[1])]) if grow else ans.M.clone()
        R.index_add_(0, yr, H)  # (K, D) C^T, the per-class sums of h
        t = ans.t + len(yr)
        kept = ans.kept.caught_up(H, R, u, E, None, None) if ans.holds(t) else None
        if kept is None:
            return None
        W = kept.W
        return Answer(at, R, None, t, 0.0, ans.rho, kept, None, (W, W @ self.shift), ans.t0)

    def _refit(self, at) -> Answer:
        """A fresh solution, the ridge chosen now (GCV: one eigendecomposition of G; while all
        t < D samples wait, of H H^T (t, t) instead: the same nonzero spectrum)."""
        Hp, yp, counts, sums = self._totals()  # sums of h - c; c = 0 until the first commit
        c, t, D, K = self.shift, self.n_committed + len(yp), len(self.shift), len(counts)
        pmax = pmax_for(D)
        R = sums + counts[:, None].double() * c  # (K, D) C^T, the per-class sums of h
        dual = self.n_committed == 0 and len(yp) < D
        if dual:  # G = X^T X, C = X^T Y with X = Hp (p, D): work on M = X X^T (p, p)
            M, Y = Hp @ Hp.T, torch.nn.functional.one_hot(yp, K).double()
        else:  # M = G (D, D)
            M = symmetric(add_gram_(self.m2.clone(), Hp)) if self.n_committed else Hp.T @ Hp
            s = sums.sum(0)
            M += torch.outer(c, s) + torch.outer(s, c) + t * torch.outer(c, c)
        kept = None
        if self.ridge_estimator == "fixed":
            lam = float(self.ridge)
            if lam > 0 and dual:  # (lam I + X^T X)^-1 by Woodbury: p corrections on lam I
                kept = Kept.scaled_identity(lam, K, D, pmax).caught_up(
                    Hp, R, torch.arange(K), Y, None, None, pmax=max(pmax, len(yp)))
            elif lam > 0:
                A = M.clone()
                A.diagonal().add_(lam)
                kept = Kept.cholesky(A, R, pmax)
            if kept is None:  # lam = 0: the pseudo-inverse, nothing kept
                M.diagonal().add_(lam)
                B = spd_solve(M, Y if dual else R.T, lam > 0)  # (G + lam I)^-1 C, or its dual
                W = (Hp.T @ B if dual else B).T.contiguous()  # (K, D)
                return Answer(at, R, None, t, 0.0, lam, None, None, (W, W @ c))
        else:  # the same nonzero spectrum s either way; dual: V^T C = diag(sqrt s) U^T Y
            s, V = torch.linalg.eigh(M)
            s = s.clamp(min=0)
            Q = V.T @ (Y if dual else R.T)  # (m, K)
            q = Q.square().sum(1) * (s if dual else 1)
            scale = float(s.sum()) / D  # tr G / D
            lam = gcv_ridge(s, q, t, scale) if scale > 0 else 1.0
            if dual:
                kept = Kept.scaled_identity(lam, K, D, pmax).caught_up(
                    Hp, R, torch.arange(K), Y, None, None, pmax=max(pmax, len(yp)))
            if kept is None:
                kept = Kept.eigen(s, V, lam, R, pmax) if not dual else None
            if kept is None:  # a dual correction failed: the dual solve, nothing kept
                W = (Hp.T @ (V @ (Q / (s + lam)[:, None]))).T.contiguous()
                return Answer(at, R, None, t, 0.0, lam, None, None, (W, W @ c))
        W = kept.W
        return Answer(at, R, None, t, 0.0, lam, kept, None, (W, W @ c))

    shrinkage_ = None  # no covariance here: ``ridge_``

    @property
    def ridge_(self) -> float:
        """The lambda of the current solve (``ridge`` if fixed)."""
        self._weights()
        return self._answer.rho
