"""A closed-form solution kept current as samples arrive: W^T = (A0 + X^T X)^-1 R^T.

The closed forms (Deep SLDA, RP-LDA, RanPAC) answer with W^T = A^-1 R^T, A a (d, d) symmetric
positive definite matrix (the scatter plus a ridge) and R (K, d) one row per class (the class
means, or the per-class sums of the features). Samples add rows X (m, d) to A (A += X^T X) and
change some rows of R. ``Kept`` holds an anchor A0 (a factorization: a Cholesky factor, or an
eigendecomposition) and the rank-m corrections since the anchor as one stacked matrix V (p, d),
A^-1 = A0^-1 - V^T V (Woodbury: each update adds the rows L^-1 X A^-1 of
A^-1 X^T (I + X A^-1 X^T)^-1 X A^-1, L L^T = I + X A^-1 X^T), and the solution W (K, d) itself,
updated exactly (``caught_up``): no factorization, one product A^-1 [X; dR]^T, which costs
(m + r) (d^2 + 2 p d) for m new rows and r right-hand sides that are not combinations of them,
plus O((m + r) d K).

The anchor is recomputed (by the learner: a refit) when the corrections would pass ``pmax``
rows; ``caught_up`` says so by returning None. That bounds both the cost of a catch-up and the
rounding drift of the rank-m chain: at most ``pmax`` corrections since an exact factorization.

A change of the ridge (the shrinkage re-chosen) is not low-rank: a learner holds the ridge of
its last refit (``Answer``: the answer is then exactly the closed form with the coefficient it
reports) and refits once the samples grew by more than 1/8 since (``GROWTH``), besides the
``pmax`` rule. docs/anytime.md states the schedule, its bounds and the costs.

A ``Kept`` is never changed once built: a catch-up returns a new one (the rule of the state,
docs/design.md), so a prediction reading the old one sees a consistent solution.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

import torch

from ciosl.learners.shrinkage import held_ridge, shrunk_terms

GENERATIONS = count(1)  # a fresh number for every change that a catch-up cannot follow
GROWTH = 1.125  # a held shrinkage or ridge is re-chosen once the samples grew by 1/8


def pmax_for(d: int) -> int:
    """Corrections kept before the anchor is refit: d / 4 (at least 8). A catch-up then costs
    at most 1.5 d^2 per row, and a refit (d^3 / 3 for a Cholesky factor) amortised over the d / 4
    rows since the last one costs about as much."""
    return max(8, d // 4)


class Kept:
    """W^T = A^-1 R^T with A^-1 = A0^-1 - V^T V; ``solve0(B)`` = A0^-1 B for B (d, q)."""

    __slots__ = ("R", "V", "W", "pmax", "solve0")

    def __init__(self, solve0: Callable[[torch.Tensor], torch.Tensor], W: torch.Tensor,
                 R: torch.Tensor, pmax: int, V: torch.Tensor | None = None):
        self.solve0 = solve0
        self.W, self.R = W, R  # (K, d) each: the solution and its right-hand sides
        self.V = W.new_zeros(0, W.shape[1]) if V is None else V  # (p, d)
        self.pmax = pmax

    @classmethod
    def cholesky(cls, A: torch.Tensor, R: torch.Tensor, pmax: int) -> Kept | None:
        """Anchor on A (d, d) (consumed): None if A is not numerically positive definite."""
        L, info = torch.linalg.cholesky_ex(A)
        if int(info) != 0:
            return None

        def solve0(B: torch.Tensor) -> torch.Tensor:  # two triangular solves (cholesky_solve
            # copies L at every call: 10x slower for one column at d = 1280)
            return torch.linalg.solve_triangular(
                L.mT, torch.linalg.solve_triangular(L, B, upper=False), upper=True)

        return cls(solve0, solve0(R.T.contiguous()).T.contiguous(), R, pmax)

    @classmethod
    def eigen(cls, s: torch.Tensor, V: torch.Tensor, lam: float, R: torch.Tensor,
              pmax: int) -> Kept:
        """Anchor on A = V diag(s) V^T + lam I, from an eigendecomposition (s (d,), V (d, d))."""
        inv = 1.0 / (s + lam)  # (d,)

        def solve0(B: torch.Tensor) -> torch.Tensor:
            return V @ ((V.T @ B) * inv[:, None])

        return cls(solve0, solve0(R.T).T.contiguous(), R, pmax)

    @classmethod
    def scaled_identity(cls, lam: float, K: int, d: int, pmax: int) -> Kept:
        """Anchor on A = lam I with R = 0 (K, d): start of a dual solve (few rows, d large)."""
        R = torch.zeros(K, d, dtype=torch.float64)
        return cls(lambda B: B / lam, R.clone(), R, pmax)

    def apply(self, B: torch.Tensor) -> torch.Tensor:
        """A^-1 B for B (d, q)."""
        out = self.solve0(B)
        if len(self.V):
            out = out - self.V.T @ (self.V @ B)
        return out

    def caught_up(self, X: torch.Tensor, R: torch.Tensor, cols: torch.Tensor,
                  E: torch.Tensor | None, extra: torch.Tensor | None,
                  extra_cols: torch.Tensor | None, pmax: int | None = None) -> Kept | None:
        """The solution after A += X^T X (X (m, d), m may be 0) and R -> ``R`` (K', d), K' >= K
        (rows from K on are new classes, 0 before). The rows that changed are ``cols`` (u,):
        their change is X^T E (E (m, u), or None: 0) plus, for the columns ``extra_cols``
        (positions in ``cols``), the explicit rows ``extra`` (r, d). None if the corrections
        would pass ``pmax`` rows (the caller refits)."""
        m, d = X.shape
        pmax = self.pmax if pmax is None else pmax
        if len(self.V) + m > pmax:
            return None
        K0, K = len(self.W), len(R)
        blocks = [X.T] + ([extra.T] if extra is not None and len(extra) else [])
        Q = self.apply(torch.cat(blocks, 1)) if sum(b.shape[1] for b in blocks) else None
        dW = X.new_zeros(d, len(cols))  # (d, u) A_old^-1 dR^T
        if E is not None and m:
            dW += Q[:, :m] @ E
        if extra is not None and len(extra):
            dW[:, extra_cols] += Q[:, m:]
        W = torch.cat([self.W, self.W.new_zeros(K - K0, d)]) if K > K0 else self.W.clone()
        W[cols] += dW.T
        V = self.V
        if m:
            Qx = Q[:, :m]  # (d, m) A_old^-1 X^T
            C = X @ Qx  # (m, m) X A_old^-1 X^T
            C = 0.5 * (C + C.T)
            C.diagonal().add_(1.0)
            L, info = torch.linalg.cholesky_ex(C)
            if int(info) != 0:
                return None
            Vn = torch.linalg.solve_triangular(L, Qx.T, upper=False)  # (m, d)
            W -= (R @ Vn.T) @ Vn  # A_new^-1 = A_old^-1 - Vn^T Vn, applied to R_new
            V = torch.cat([V, Vn])
        return Kept(self.solve0, W, R, self.pmax, V)


# ---------------------------------------------------------------------- exact class means
def fill_blocks(owner, Z: torch.Tensor, y: torch.Tensor) -> None:
    """Buffer the rows (Z, y) in order into ``owner``'s pending block (``pending_z``,
    ``pending_y``, ``n_pending`` of ``block`` rows) and hand every full block to
    ``owner._commit`` (then ``owner._rotate()``): the statistics of the closed forms move in
    exact blocks of their arithmetic's size."""
    i = 0
    while i < len(y):
        k = min(owner.block - owner.n_pending, len(y) - i)
        owner.pending_z[owner.n_pending:owner.n_pending + k] = Z[i:i + k]
        owner.pending_y[owner.n_pending:owner.n_pending + k] = y[i:i + k]
        i += k
        if owner.n_pending + k == owner.block:
            owner._commit(owner.pending_z, owner.pending_y)
            owner.n_pending = 0
            owner._rotate()
        else:
            owner.n_pending += k


def group(Z: torch.Tensor, y: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows Z (b, d) as float64, the classes present u (u,), each row's position in u (b,),
    the rows per class m (u,) and their means nu (u, d)."""
    u, inv = torch.unique(y, return_inverse=True)
    Z64 = Z.double()
    m = torch.bincount(inv, minlength=len(u))
    nu = torch.zeros(len(u), Z.shape[1], dtype=torch.float64).index_add_(0, inv, Z64)
    return Z64, u, inv, m, nu / m[:, None]


def merged(mu: torch.Tensor, n: torch.Tensor, u: torch.Tensor, m: torch.Tensor,
           nu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact means (Chan et al.): rows u of mu (K, d) and n (K,) after m samples of means nu,
    new tensors (u, d), (u,)."""
    n0 = n[u]
    return mu[u] + (nu - mu[u]) * (m.double() / (n0 + m).double())[:, None], n0 + m


# ---------------------------------------------------------------------- LDA (SLDA, RP-LDA)
class Answer:
    """A solution kept between answers: at the moment ``at`` = (generation, waiting rows),
    class means M (K, d) and counts n (K,), t samples in the scatter of trace ``trace``, the
    ridge ``rho`` of S + rho I held since the last refit at t0 samples (``kept``: its
    solution, or None: refit at every change), the shrinkage coefficient in use and the
    scores' (W, b). RanPAC's: M the per-class sums of h, rho its lambda, no shrinkage."""

    __slots__ = ("M", "Wb", "at", "kept", "n", "precision", "rho", "shrinkage", "t", "t0",
                 "trace")

    def __init__(self, at, M, n, t, trace, rho, kept, shrinkage, Wb, t0=None, precision=None):
        self.at, self.M, self.n, self.t, self.trace = at, M, n, t, trace
        self.rho, self.kept, self.shrinkage, self.Wb = rho, kept, shrinkage, Wb
        self.t0 = t if t0 is None else t0  # samples at the refit
        # LDA's: B (d, q) -> Lambda B, the precision the scores use (W = M Lambda)
        self.precision = precision

    def holds(self, t: int) -> bool:
        """Whether the ridge chosen at the refit may still be held at t samples: t grew by at
        most 1/8 since (``GROWTH``; the d / 4 corrections are ``Kept``'s bound)."""
        return t <= GROWTH * self.t0


def lda_refit(at, S, M, n, t, eps, estimator, pmax) -> Answer:
    """A fresh solution from the scatter S (d, d) of t samples and the means M (K, d): the
    shrinkage chosen now, the ridge rho = r / a of a S + r I factorized (Cholesky; the
    pseudo-inverse, and nothing kept, if a S + r I is singular or a = 0)."""
    d, trace = len(S), float(S.trace())
    a, r, e = shrunk_terms(trace, float(S.square().sum()), t, d, eps, estimator)
    kept = None
    if a > 0 and r > 0:
        A = S.clone()
        A.diagonal().add_(r / a)
        kept = Kept.cholesky(A, M, pmax)
    if kept is None:  # a = 0: (r I)^-1, nearest class mean; else a singular a S + r I
        if a == 0:
            W, precision = M / r, (lambda B: B / r)
        else:
            P = torch.linalg.pinv(a * S + r * torch.eye(d, dtype=S.dtype), hermitian=True)
            W, precision = M @ P, (lambda B: P @ B)  # (K, d)
        return Answer(at, M, n, t, trace, None, None, e, (W, -0.5 * (W * M).sum(1)),
                      precision=precision)
    W = kept.W / a  # (S + rho I)^-1 = a (a S + r I)^-1
    return Answer(at, M, n, t, trace, r / a, kept, e, (W, -0.5 * (W * M).sum(1)),
                  precision=lambda B: kept.apply(B) / a)


def lda_caught_up(ans: Answer, at, X, M, n, cols, E, extra, extra_cols, t, trace, estimator
                  ) -> Answer | None:
    """``ans`` after rows X (m, d) joined the scatter (S += X^T X) and the means became M
    (rows ``cols`` changed: X^T E plus ``extra`` at ``extra_cols``), with the ridge held:
    the exact LDA solution for the shrinkage ``held_ridge`` gives. None: refit."""
    if not ans.holds(t):
        return None
    kept = ans.kept.caught_up(X, M, cols, E, extra, extra_cols)
    if kept is None:
        return None
    a, e = held_ridge(ans.rho, t, trace, X.shape[1], estimator)
    W = kept.W / a
    return Answer(at, M, n, t, trace, ans.rho, kept, e, (W, -0.5 * (W * M).sum(1)), ans.t0,
                  precision=lambda B: kept.apply(B) / a)



def lda_rows_caught_up(ans: Answer, at, K: int, Z64: torch.Tensor, yr: torch.Tensor,
                       streaming: bool, estimator: str) -> Answer | None:
    """``ans`` after the rows Z64 (m, d) of classes yr (m,) (K classes now): the means merged
    as a block merges them, the scatter's increment as a factor X (m, d), S += X^T X (the
    rows about their class's shifted centre, as ``SLDA._add_scatter``), the changes of the
    means of known classes as combinations of X's rows, those of new classes explicit;
    ``streaming=False``: the scatter frozen, the means' changes explicit."""
    if len(yr) == 0:
        return None
    d = Z64.shape[1]
    grow = K - len(ans.M)
    M0 = torch.cat([ans.M, ans.M.new_zeros(grow, d)]) if grow else ans.M  # (K, d)
    n = torch.cat([ans.n, ans.n.new_zeros(grow)]) if grow else ans.n.clone()
    _, u, inv, m, nu = group(Z64, yr)
    nk = n[u].double()  # (u,) samples before the rows
    M = M0.clone()
    M[u], n[u] = merged(M0, n, u, m, nu)
    dM = M[u] - M0[u]  # (u, d)
    if streaming:
        f = (nk / (nk + m)).sqrt_()  # (u,), 0 for a new class
        c = torch.addcmul(nu, nu - M0[u], f[:, None], value=-1.0)  # (u, d)
        X = Z64 - c[inv]  # (m, d): S += X^T X
        # the mean of a known class k moves by its rows of X summed / sqrt(n_k (n_k + m_k))
        w = torch.where(nk > 0, 1.0 / (nk * (nk + m)).clamp(min=1).sqrt(), 0.0)  # (u,)
        E = torch.zeros(len(yr), len(u), dtype=torch.float64)
        E[torch.arange(len(yr)), inv] = w[inv]
        extra_cols = torch.nonzero(nk == 0).flatten()  # new classes: explicit
        t, trace = ans.t + len(yr), ans.trace + float(X.square().sum())
    else:  # the scatter is frozen: the means' changes, explicit
        X, E, t, trace = Z64.new_zeros(0, d), None, ans.t, ans.trace
        extra_cols = torch.arange(len(u))
    return lda_caught_up(ans, at, X, M, n, u, E, dM[extra_cols], extra_cols, t, trace,
                         estimator)

