"""RP-LDA: a fixed random ReLU projection, then streaming LDA on the projected features.

The idea of RanPAC (McDonnell et al., NeurIPS 2023) and RanDumb (Prabhu et al., 2024): lift the
frozen features z (d) into h = relu(P z) (D = ``proj_dim``), where P (D, d) is drawn once from
the learner's ``seed`` with entries N(0, 1/d), so that h has the scale of z; a linear rule on h
is a nonlinear rule on z. On h the learner is the streaming LDA of ``slda.py``: class means
mu_k, the pooled within-class covariance Sigma = S / t, scores W h + b with
W = mu Lambda, b = -0.5 diag(mu Lambda mu^T), Lambda = ((1 - eps) Sigma + eps I)^-1,
eps = ``shrinkage``, ``predict_proba`` = softmax(scores); with ``shrinkage_estimator="oas"``
(the default since issue 38's study) the shrinkage is chosen from the running statistics
instead, Sigma_s = (1 - a) Sigma + a (tr Sigma / D) I, as in ``slda.py``.

Exact and fast. Sufficient statistics taken in blocks: the raw samples
wait in a buffer of ``block`` rows, and a full buffer is projected with one GEMM and added to
per-class sums and counts and to the second moment M2 = sum (h - c)(h - c)^T (one more GEMM, on
the lower block triangle only). Then S = M2 - sum_k n_k (mu_k - c)(mu_k - c)^T. The shift c,
the mean of the first committed block, is fixed for good, so the identity stays exact, and it
removes the cancellation that this subtraction suffers when ||mu_k|| >> the within-class
spread. Predictions add the waiting rows to the statistics without committing them, so the
committed statistics depend on the samples only, not on when the learner was asked, saved or
loaded. Answers at any moment (Woodbury corrections): docs/findings/shrinkage-and-ranpac.md.
The state holds the committed statistics and the waiting raw samples, so a saved learner
answers and continues bit for bit; P is drawn again from the seed and checked against 16 saved
entries.

Deviations, on purpose: RanPAC fits ridge regression to one-hot targets on h (and adapts the
backbone in the first session); here the classifier is LDA with a pooled covariance and
shrinkage, as Deep SLDA and RanDumb, so it can be checked against scikit-learn. RanDumb uses
random Fourier features of raw pixels; here ReLU features (RanPAC's) of the frozen features.
The projection has no bias.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.anytime import (
    GENERATIONS,
    Answer,
    Kept,
    fill_blocks,
    lda_rows_caught_up,
    pmax_for,
)
from ciosl.learners.base import Learner, register
from ciosl.learners.shrinkage import SHRINKAGE_ESTIMATORS, check_shrinkage, shrunk_terms
from ciosl.learners.undo import Rows

MAX_PROJ_DIM = 65536  # a (D, D) float64 second moment: 34 GB at the bound
TILE = 512  # column tiles of the lower block-triangular GEMM
PREDICT_CHUNK = 2048  # rows projected at once in predict_proba


def add_gram_(M: torch.Tensor, H: torch.Tensor, alpha: float = 1.0, tile: int = TILE
              ) -> torch.Tensor:
    """M += alpha H^T H on the column tiles of M on and below the diagonal (the part above it
    is not touched; ``symmetric`` rebuilds it, for any ``tile`` <= TILE): about half the
    flops of a full GEMM."""
    for j in range(0, M.shape[0], tile):
        M[j:, j:j + tile].addmm_(H[:, j:].T, H[:, j:j + tile], alpha=alpha)
    return M


def symmetric(M: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose lower triangle is M's, (D, D), a new tensor."""
    S = M.clone()
    for i in range(0, len(S), TILE):
        tile = S[i:i + TILE, i:i + TILE]
        tile.copy_(tile.tril() + tile.tril(-1).T)
        S[i:i + TILE, i + TILE:] = S[i + TILE:, i:i + TILE].T
    return S


def spd_solve(A: torch.Tensor, B: torch.Tensor, definite: bool) -> torch.Tensor:
    """A^-1 B for a symmetric positive semi-definite A: Cholesky if A is ``definite`` (pinv if
    that fails), pinv if not (A may be singular)."""
    if definite:
        L, info = torch.linalg.cholesky_ex(A)
        if int(info) == 0:
            return torch.cholesky_solve(B, L)
    return torch.linalg.pinv(A, hermitian=True) @ B


def draw_projection(D: int, dim: int, seed: int) -> torch.Tensor:
    """P (D, d), entries N(0, 1/d) drawn from ``seed``: the random features h = relu(P z) of
    rp_lda, ranpac and acil (the same seed gives the same features in each)."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(D, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)


def check_proj_dim(name: str, D) -> None:
    if type(D) is not int or not 1 <= D <= MAX_PROJ_DIM:  # not bool, not a numpy integer
        raise ValueError(f"{name}: proj_dim must be a Python int in [1, {MAX_PROJ_DIM}], got "
                         f"proj_dim={D!r} ({type(D).__name__})")


@register
class RPLDA(Learner):
    name = "rp_lda"
    regimes = ("streaming", "online")
    regime_note = ("running class statistics: several epochs count the same samples several "
                   "times")
    description = ("random ReLU projection (RanPAC / RanDumb) + streaming LDA with exact, "
                   "block-buffered statistics")
    help = {
        "proj_dim": f"D, width of the random ReLU features h = relu(P z) (1 to {MAX_PROJ_DIM})",
        "shrinkage": "eps in Lambda = ((1 - eps) Sigma + eps I)^-1 on the projected features "
                     "(shrinkage_estimator=fixed)",
        "shrinkage_estimator": "fixed: eps = shrinkage; oas: chosen from the running statistics"
                               " (Oracle Approximating Shrinkage towards tr(Sigma)/D I, as slda)",
        "seed": "draws the random projection P",
    }
    choices: ClassVar[dict[str, tuple]] = {"shrinkage_estimator": SHRINKAGE_ESTIMATORS}
    added_settings: ClassVar[dict[str, Any]] = {"shrinkage_estimator": "fixed"}
    conformance_settings: ClassVar[list[dict]] = [{"proj_dim": 32},
                                                  {"proj_dim": 32, "shrinkage_estimator": "fixed"}]
    block: ClassVar[int] = 256  # samples buffered before one GEMM update of the statistics
    published_parts: ClassVar[tuple[str, ...] | None] = ()  # the kept answer (blocks.py)
    keeps_answer = True

    def __init__(self, *, proj_dim: int = 4096, shrinkage: float = 1e-4,
                 shrinkage_estimator: str = "oas", seed: int = 0):
        self.proj_dim = proj_dim
        self.shrinkage = shrinkage
        self.shrinkage_estimator = shrinkage_estimator
        super().__init__(seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        check_proj_dim(self.name, self.proj_dim)
        # shrinkage: its range, [0, 1] (Learner.ranges); refused where oas ignores it
        if "shrinkage_estimator" in self.get_params():  # not in ranpac, which subclasses this
            check_shrinkage(self)

    # ------------------------------------------------------------------ state
    def _init_state(self, dim: int) -> None:
        D = int(self.proj_dim)
        self.proj = draw_projection(D, dim, self.seed)  # (D, d)
        self.shift = torch.zeros(D, dtype=torch.float64)  # (D,) c, set by the first commit
        self._sums = Rows((D,), torch.float64)  # (K, D) sum of h - c per class
        self._counts = Rows((), torch.int64)  # (K,) committed samples per class
        self._journal: dict[str, Any] | None = None
        self.m2 = torch.zeros(0, 0, dtype=torch.float64)  # (D, D) once committed, lower part
        self.n_committed = 0
        self.pending_z = torch.zeros(self.block, dim)  # (block, d) raw samples waiting
        self.pending_y = torch.zeros(self.block, dtype=torch.int64)  # (block,)
        self.n_pending = 0
        self._new_generation()

    def _new_generation(self) -> None:
        """A change a kept answer cannot follow row by row (a rollback, a load): it refits."""
        self._gen = next(GENERATIONS)
        self._prev: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self._answer: Answer | None = None

    def _rotate(self) -> None:
        """The full buffer was committed: kept as the previous block, a fresh one taken."""
        self._prev = self.pending_z, self.pending_y, self._gen
        self.pending_z = torch.empty_like(self.pending_z)
        self.pending_y = torch.empty_like(self.pending_y)
        self._gen = next(GENERATIONS)

    def _rows_since(self, gen: int, p: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The raw rows (m, d) and classes (m,) learned since the moment (``gen``, ``p``), or
        None if they are gone (``blocks.BlockMeans._rows_since``)."""
        q = self.n_pending
        if gen == self._gen:
            return (self.pending_z[p:q], self.pending_y[p:q]) if p <= q else None
        prev = self._prev
        if prev is not None and prev[2] == gen:
            return torch.cat([prev[0][p:], self.pending_z[:q]]), torch.cat([prev[1][p:],
                                                                            self.pending_y[:q]])
        return None

    @property
    def sums(self) -> torch.Tensor:
        return self._sums.view  # (K, D), grown by capacity doubling

    @property
    def counts(self) -> torch.Tensor:
        return self._counts.view  # (K,)

    def _add_class(self) -> None:
        self._sums.grow()
        self._counts.grow()

    # ------------------------------------------------------------------ all-or-nothing
    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """Two counts; ``_commit`` adds what it is about to overwrite (the waiting rows, the
        second moment, the rows of the classes in the block), and the kept answer with the
        buffers it reads (references: ``blocks.BlockMeans._undo_record``)."""
        self._journal = {"n_pending": self.n_pending, "rows": [], "kept": (
            self._gen, self._prev, self.pending_z, self.pending_y, self._answer)}
        return self._journal

    def _save_before_commit(self, y: torch.Tensor) -> None:
        j = self._journal
        if j is None:
            return
        if "pending" not in j:
            j["pending"] = self.pending_z.clone(), self.pending_y.clone()
            j["moments"] = (self.shift, self.m2 if self.n_committed == 0 else self.m2.clone(),
                            self.n_committed)
        u = torch.unique(y)
        j["rows"].append((u, self.sums[u].clone(), self.counts[u].clone()))

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        for u, sums, counts in reversed(record["rows"]):
            self._sums.buf[u], self._counts.buf[u] = sums, counts
        self._sums.truncate(n_classes)
        self._counts.truncate(n_classes)
        if "pending" in record:
            self.pending_z.copy_(record["pending"][0])
            self.pending_y.copy_(record["pending"][1])
            self.shift, self.m2, self.n_committed = record["moments"]
        self.n_pending = record["n_pending"]
        self._journal = None
        # the kept answer as it was: the next answer is a twin's, to the bit (as BlockMeans)
        self._gen, self._prev, self.pending_z, self.pending_y, self._answer = record["kept"]

    def _undo_done(self, record: dict[str, Any]) -> None:
        self._journal = None

    def _state(self) -> dict[str, Any]:
        p = self.n_pending
        return {"shift": self.shift.clone(), "sums": self.sums.clone(),
                "counts": self.counts.clone(), "m2": self.m2.clone(),
                "n_committed": self.n_committed, "pending_z": self.pending_z[:p].clone(),
                "pending_y": self.pending_y[:p].clone(),
                "proj_probe": self.proj.flatten()[:16].clone()}

    def _load_state(self, state: dict[str, Any]) -> None:
        if not torch.equal(state["proj_probe"], self.proj.flatten()[:16]):
            raise ValueError("the random projection drawn from the seed differs from the saved "
                             "one (another torch version?)")
        p, K, D = len(state["pending_y"]), len(self.counts), len(self.shift)
        n = int(state["n_committed"])
        if p >= self.block or (len(state["pending_y"]) and not 0 <= int(state["pending_y"].min())
                               <= int(state["pending_y"].max()) < K):
            raise ValueError(f"{p} waiting samples or their classes out of range")
        if state["m2"].shape != ((D, D) if n else (0, 0)) or int(state["counts"].sum()) != n:
            raise ValueError("second moment or counts inconsistent with n_committed")
        self.shift, self.m2 = state["shift"].clone(), state["m2"].clone()
        if state["sums"].shape != (K, D) or state["counts"].shape != (K,):
            raise ValueError("class sums or counts inconsistent with the classes")
        self._sums.set(state["sums"])
        self._counts.set(state["counts"])
        self.n_committed, self.n_pending = n, p
        self.pending_z[:p], self.pending_y[:p] = state["pending_z"], state["pending_y"]
        self._new_generation()

    # ------------------------------------------------------------------ learning
    def transform(self, Z: np.ndarray) -> np.ndarray:
        """The random features h = relu(P z), (n, D) float64 (after the first sample)."""
        if self.dim_ is None:
            raise RuntimeError(f"{self.name}: transform before any sample was learned")
        Z = self._check_Z(Z, where="transform")
        return self._project(torch.from_numpy(Z)).numpy()

    def _project(self, Z: torch.Tensor) -> torch.Tensor:
        return torch.relu(Z.double() @ self.proj.T)  # (n, D)

    def _append(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Buffer the samples; commit every full buffer."""
        fill_blocks(self, torch.from_numpy(Z), torch.from_numpy(yi))

    def _commit(self, Z: torch.Tensor, y: torch.Tensor) -> None:
        """Fold rows Z (b, d) of classes y (b,) into the moments. Everything is computed and
        allocated before the first statistic moves, so a failure leaves them as they were
        (a known-class ``learn_one`` keeps no undo record)."""
        self._save_before_commit(y)
        H = self._project(Z)  # (b, D)
        first = self.n_committed == 0
        shift = H.mean(0) if first else self.shift  # (D,)
        m2 = H.new_zeros(len(shift), len(shift)) if first else self.m2  # (D, D)
        H -= shift
        per_class = torch.bincount(y, minlength=len(self.counts))  # (K,)
        add_gram_(m2, H)
        self.shift, self.m2 = shift, m2
        self.sums.index_add_(0, y, H)
        self.counts.add_(per_class)
        self.n_committed += len(y)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._append(z[None], np.array([yi]))

    _fit_base = _learn_batch = _append  # the same buffer: batches equal one-by-one updates
    draws_random = False  # no step draws a random number (Learner._draws_random)

    # ------------------------------------------------------------------ statistics
    def _totals(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Waiting rows h - c (p, D) and labels (p,), and the counts (K,) and sums of h - c
        (K, D) of all samples, committed or not (nothing is committed here)."""
        yp = self.pending_y[:self.n_pending]
        Hp = self._project(self.pending_z[:self.n_pending]) - self.shift
        counts = self.counts + torch.bincount(yp, minlength=len(self.counts))
        return Hp, yp, counts, self.sums.index_add(0, yp, Hp)

    def _scatter(self, Hp, yp, counts, sums) -> torch.Tensor:
        """S, the pooled within-class scatter of all samples, (D, D)."""
        if self.n_committed == 0:  # every sample is waiting: centre exactly
            X = Hp - sums[yp] / counts[yp, None]  # (p, D)
            return X.T @ X
        G = sums / counts.clamp(min=1).double().sqrt()[:, None]  # (K, D), G^T G = sum_k n_k mu_k mu_k^T
        return symmetric(add_gram_(add_gram_(self.m2.clone(), Hp), G, alpha=-1.0))

    @property
    def means(self) -> torch.Tensor:
        """Class means of h, (K, D) float64."""
        _, _, counts, sums = self._totals()
        return self.shift + sums / counts[:, None]

    @property
    def covariance(self) -> torch.Tensor:
        """Sigma = S / t of h, (D, D) float64."""
        Hp, yp, counts, sums = self._totals()
        return self._scatter(Hp, yp, counts, sums) / (self.n_committed + len(yp))

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The scores' (W (K, D), b (K,)) on h - c: kept, caught up on the rows learned since
        the last answer (``anytime.py``), refit when those rows are gone, when the shift c was
        set since (the first commit), or when the corrections would pass D / 4 rows."""
        ans, at = self._answer, (self._gen, self.n_pending, self.n_committed > 0)
        if ans is not None and ans.at == at:
            return ans.Wb
        new = None
        if ans is not None and ans.kept is not None and ans.at[2] == at[2]:
            rows = self._rows_since(*ans.at[:2])
            if rows is not None:
                H = self._project(rows[0]) - self.shift  # (m, D)
                new = lda_rows_caught_up(ans, at, len(self.counts), H, rows[1], True,
                                         self._estimator)
        if new is None:
            new = self._refit(at)
        self._answer = new
        return new.Wb

    def _answer_now(self) -> None:
        self._weights()

    @property
    def _estimator(self) -> str:
        return self.shrinkage_estimator

    def _refit(self, at) -> Answer:
        """A fresh solution: the shrinkage chosen now, S + rho I factorized (rho = r / a), or,
        while every sample waits and p < D, the solution of the p x p system of the Woodbury
        identity (a kept solution on rho I with the p rows as corrections)."""
        Hp, yp, counts, sums = self._totals()
        M = sums / counts.clamp(min=1)[:, None]  # (K, D) class means of h - c
        D, n, K = len(self.shift), self.n_committed + len(yp), len(counts)
        pmax = pmax_for(D)
        kept = S = None
        if self.n_committed == 0 and len(yp) < D:  # every sample waits: X (p, D), S = X^T X
            X = Hp - M[yp]  # deviations from the class means
            XXt = X @ X.T  # (p, p)
            trace = float(XXt.trace())
            a, r, e = self._shrunk(trace, float(XXt.square().sum()), n, D)
            if a > 0 and r > 0:
                # Woodbury: (rho I + X^T X)^-1 = (I - X^T (rho I + X X^T)^-1 X) / rho
                kept = Kept.scaled_identity(r / a, K, D, pmax).caught_up(
                    X, M, torch.arange(K), None, M, torch.arange(K), pmax=max(pmax, len(yp)))
        else:
            S = self._scatter(Hp, yp, counts, sums)
            trace = float(S.trace())
            a, r, e = self._shrunk(trace, float(S.square().sum()), n, D)
            if a > 0 and r > 0:
                A = S.clone()
                A.diagonal().add_(r / a)
                kept = Kept.cholesky(A, M, pmax)
        if kept is None:  # a = 0: (r I)^-1 (nearest class mean); r = 0: the pseudo-inverse
            if a == 0:
                W = M / r
            else:
                A = X.T @ X if S is None else S
                A.mul_(a).diagonal().add_(r)  # the shrunk covariance a S + r I
                W = spd_solve(A, M.T, r > 0).T.contiguous()  # (K, D)
            rho = None
        else:
            W, rho = kept.W / a, r / a  # (S + rho I)^-1 = a (a S + r I)^-1
        # scores on h - c: they differ from those on h by a per-row constant only
        return Answer(at, M, counts.clone(), n, trace, rho, kept, e, (W, -0.5 * (W * M).sum(1)))

    def _shrunk(self, trace: float, frob2: float, n: int, D: int) -> tuple[float, float, float]:
        return shrunk_terms(trace, frob2, n, D, self.shrinkage, self.shrinkage_estimator)

    @property
    def shrinkage_(self) -> float:
        """The shrinkage coefficient of the current prediction rule (``shrinkage`` if fixed)."""
        self._weights()
        return self._answer.shrinkage

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        W, b = self._weights()
        Z = torch.from_numpy(Z)
        out = [torch.softmax((self._project(Z[i:i + PREDICT_CHUNK]) - self.shift) @ W.T + b, 1)
               for i in range(0, len(Z), PREDICT_CHUNK)]  # (n, K)
        return torch.cat(out).numpy()
