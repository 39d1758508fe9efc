"""ACIL / G-ACIL's analytic head: exact recursive least squares on random ReLU features.

The analytic class-incremental learners (ACIL, Zhuang et al. 2022; G-ACIL, 2024; F-OAL, 2024)
keep ridge regression on one-hot targets current as samples arrive. Here on the random features
of ``rp_lda`` and ``ranpac`` (h = relu(P z), D = ``proj_dim``, P drawn from ``seed``: the same
features as theirs): R = (H^T H + gamma I)^-1 (D, D, float64) and W = R H^T Y (D, K) over
everything seen, so every answer is ridge regression with ``gamma`` on every sample so far (no
refit, nothing held: ``predict_proba`` is the softmax of h W, as ``ranpac``'s).

- ``learn_one`` (Sherman-Morrison): u = R h, c = 1 + h^T u, R' = R - s s^T with s = u / sqrt(c),
  W' = W + (u / c)(y - W^T h)^T. R is kept as R0 - U^T U: a base R0 (never written) and the rows
  s of the last r updates (U, r < ``FOLD`` rows appended in place past their live count), so a
  learn reads R0 once (u = R0 h - U^T (U h)) and writes one row; every ``FOLD`` learns the rows
  fold into a new R0 (one product, O(D^2 r)). Cost per learn O(D^2 + D r + D K), amortised; the
  D x D matrix (134 MB at D = 4096) is read once a learn and written once every ``FOLD``.
- ``learn_many`` / ``fit_base`` (Woodbury, blocks of b <= 512 rows H, after folding the pending
  rows): S = I + H R H^T, R' = R - R H^T S^-1 H R, W' = W + R H^T S^-1 (Y - H W). Cost
  O(b D^2 + b^2 D + b^3 + b D K) per block.
- A new class is a zero column of W (C = H^T Y gains a zero column, so W = R C does): W is kept
  transposed, (K, D) rows in a buffer grown by capacity doubling, so a new class costs
  amortised O(D) at class 10 as at class 100,000.

The state rule (docs/design.md): R0 and W are never written in place, and U only past its live
rows. A step computes new tensors after its checks (c, S positive and finite) and assigns them
together; rollback puts the old references and counts back (``_undo``). The state file holds
R0, the live rows of U and W, so a loaded learner answers and continues bit for bit.

Deviations: ACIL's buffer layer is this random projection without a bias; the backbone stays
frozen (as for every learner here); ``gamma`` is absolute (ranpac's GCV, relative to the
features' scale, is not run: a choice per answer would not be a recursive update).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import Learner, Range, register
from ciosl.learners.rplda import PREDICT_CHUNK, RPLDA, check_proj_dim, draw_projection

BLOCK = 512  # rows per Woodbury step of learn_many: b^2 D + b^3 stays below b D^2
FOLD = 256  # learn_one's rows kept apart from R0 (at most D / 16): their cost per learn,
# 4 r D, stays below the D^2 of reading R0; folding them costs 2 D^2 per learn amortised


def _symmetrize_(R: torch.Tensor, block: int = 512) -> torch.Tensor:
    """R := (R + R^T) / 2, exactly symmetric, in place (R is a step's new tensor, not yet
    published), a pair of blocks at a time: no second D x D temporary."""
    n = len(R)
    for i in range(0, n, block):
        for j in range(i, n, block):
            A, B = R[i:i + block, j:j + block], R[j:j + block, i:i + block]
            avg = (A + B.T).mul_(0.5)
            A.copy_(avg)
            B.copy_(avg.T)
    return R


@register
class ACIL(Learner):
    name = "acil"
    regimes = ("streaming", "online")
    regime_note = RPLDA.regime_note
    description = ("ACIL / G-ACIL's analytic head: exact recursive least squares (ridge on "
                   "one-hot targets) on random ReLU features, the inverse kept by Woodbury")
    help = {
        "proj_dim": RPLDA.help["proj_dim"],
        "gamma": "ridge gamma of R = (H^T H + gamma I)^-1",
        "seed": "draws the random projection P",
    }
    ranges = {**Learner.ranges, "gamma": Range(1e-6, 1e6)}
    conformance_settings: ClassVar[list[dict]] = [{"proj_dim": 32, "gamma": 0.1}]
    draws_random = False
    # predictions read P and W, which no step writes (a step replaces W): they answer from the
    # state published at the end of each call, without the lock (``Learner.published``)
    published_parts: ClassVar[tuple[str, ...] | None] = ()

    def __init__(self, *, proj_dim: int = 4096, gamma: float = 100.0, seed: int = 0):
        self.proj_dim = proj_dim
        self.gamma = gamma
        super().__init__(seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        check_proj_dim(self.name, self.proj_dim)

    # ------------------------------------------------------------------ state
    def _init_state(self, dim: int) -> None:
        D = int(self.proj_dim)
        self.proj = draw_projection(D, dim, self.seed)  # (D, d)
        self._R = torch.eye(D, dtype=torch.float64) / float(self.gamma)  # (D, D) R0
        self._U = torch.zeros(max(1, min(FOLD, D // 16)), D, dtype=torch.float64)
        self._r = 0  # the live rows of _U: R = R0 - U[:r]^T U[:r]
        self._Wt = torch.zeros(8, D, dtype=torch.float64)  # (capacity, D): W^T, rows >= K zero
        self._k = 0

    @property
    def R(self) -> torch.Tensor:
        """The inverse (H^T H + gamma I)^-1, (D, D) float64: R0 with the pending rows folded
        (a new tensor, exactly symmetric; O(D^2 r))."""
        return self._folded()

    def _folded(self) -> torch.Tensor:
        if not self._r:
            return self._R
        U = self._U[:self._r]
        return _symmetrize_(torch.addmm(self._R, U.T, U, alpha=-1.0))

    @property
    def W(self) -> torch.Tensor:
        """The ridge weights W^T, (K, D) float64."""
        return self._Wt[:self._k]

    def _add_class(self) -> None:
        if self._k == len(self._Wt):  # a new, larger buffer: the published one is not written
            Wt = self._Wt.new_zeros(2 * len(self._Wt), self._Wt.shape[1])
            Wt[:self._k] = self._Wt
            self._Wt = Wt
        self._k += 1

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        return {"R": self._R, "U": self._U, "r": self._r, "Wt": self._Wt, "k": self._k}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        self._R, self._U, self._r, self._Wt = record["R"], record["U"], record["r"], record["Wt"]
        self._k = min(record["k"], n_classes)

    def _state(self) -> dict[str, Any]:
        return {"R": self._R.clone(), "U": self._U[:self._r].clone(), "W": self.W.clone(),
                "proj_probe": self.proj.flatten()[:16].clone()}

    def _load_state(self, state: dict[str, Any]) -> None:
        if not torch.equal(state["proj_probe"], self.proj.flatten()[:16]):
            raise ValueError("the random projection drawn from the seed differs from the saved "
                             "one (another torch version?)")
        D = len(self.proj)
        R, W = state["R"], state["W"]
        U = state.get("U", R.new_zeros(0, D))  # files before the pending rows: none pending
        if (R.shape != (D, D) or W.shape != (self._k, D) or R.dtype != torch.float64
                or U.dtype != torch.float64 or U.ndim != 2 or U.shape[1] != D):
            raise ValueError(f"R {tuple(R.shape)}, U {tuple(U.shape)} or W {tuple(W.shape)} "
                             f"inconsistent with proj_dim {D} and {self._k} classes")
        Wt = torch.zeros(len(self._Wt), D, dtype=torch.float64)
        Wt[:self._k] = W
        buf = torch.zeros(max(len(self._U), len(U) + 1), D, dtype=torch.float64)
        buf[:len(U)] = U
        self._R, self._U, self._r, self._Wt = R.clone(), buf, len(U), Wt

    # ------------------------------------------------------------------ learning
    transform = RPLDA.transform
    _project = RPLDA._project

    def _residual(self, H: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        """Y - H W (b, capacity), zero past the K live classes."""
        E = -(H @ self._Wt.T)
        E[torch.arange(len(yi)), yi] += 1.0
        E[:, self._k:] = 0.0
        return E

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        h = self._project(torch.from_numpy(z[None]))[0]  # (D,)
        r, U = self._r, self._U
        u = self._R @ h  # (D,) R h = R0 h - U^T (U h)
        if r:
            u = torch.addmv(u, U[:r].T, U[:r] @ h, alpha=-1.0)
        c = 1.0 + float(h @ u)
        if not np.isfinite(c) or c < 1.0 - 1e-6:  # c >= 1 for a positive definite R
            raise FloatingPointError(f"{self.name}: R lost positive definiteness (c = {c})")
        Wt = torch.addr(self._Wt, self._residual(h[None], torch.tensor([yi]))[0], u / c)
        U[r] = u / np.sqrt(c)  # R' = R - s s^T: a row past the live ones, which no state reads
        R = self._R
        if r + 1 >= len(U):  # fold the rows into a new R0, and start a new U: the rows of a
            R, r = _symmetrize_(torch.addmm(R, U.T, U, alpha=-1.0)), -1  # state published
            U = torch.zeros_like(U)  # before (a reader's twin) are never written
        self._R, self._U, self._r, self._Wt = R, U, r + 1, Wt

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        if len(yi) == 1:
            self._learn_one(Z[0], int(yi[0]))
            return
        R, Wt = self._folded(), self._Wt
        Z, y = torch.from_numpy(Z), torch.from_numpy(np.asarray(yi, dtype=np.int64))
        for i in range(0, len(y), BLOCK):
            H = self._project(Z[i:i + BLOCK])  # (b, D)
            HR = H @ R  # (b, D) = (R H^T)^T
            S = HR @ H.T
            S = 0.5 * (S + S.T)
            S.diagonal().add_(1.0)  # I + H R H^T (b, b), a fresh tensor
            L, info = torch.linalg.cholesky_ex(S)
            if int(info) != 0:
                raise FloatingPointError(f"{self.name}: I + H R H^T is not positive definite")
            V = torch.linalg.solve_triangular(L, HR, upper=False)  # (b, D) L^-1 H R
            G = torch.linalg.solve_triangular(L.T, V, upper=True)  # (b, D) S^-1 H R
            E = -(H @ Wt.T)  # (b, capacity) Y - H W
            E[torch.arange(len(H)), y[i:i + BLOCK]] += 1.0
            E[:, self._k:] = 0.0
            Wt = torch.addmm(Wt, E.T, G)
            R = _symmetrize_(torch.addmm(R, V.T, V, alpha=-1.0))
        if not (bool(torch.isfinite(Wt).all()) and bool(torch.isfinite(R.diagonal()).all())):
            raise FloatingPointError(f"{self.name}: the update is not finite")
        U = torch.zeros_like(self._U) if self._r else self._U  # as at a fold
        self._R, self._U, self._r, self._Wt = R, U, 0, Wt

    _fit_base = _learn_batch

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        Wt, Z = self.W, torch.from_numpy(Z)  # one published W, read once
        out = [torch.softmax(self._project(Z[i:i + PREDICT_CHUNK]) @ Wt.T, 1)
               for i in range(0, len(Z), PREDICT_CHUNK)]  # (n, K)
        return torch.cat(out).numpy()
