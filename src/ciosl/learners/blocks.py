"""Exact class means taken in blocks: the shared statistics of NCM and Deep SLDA.

Samples wait in a buffer of ``block`` rows; a full buffer is folded into per-class means and
counts at once (``_commit``: one ``index_add`` over the classes present, and for SLDA one
float64 GEMM for the scatter). The class means merge exactly (Chan et al.):
mu_k += (nu_k - mu_k) m_k / (n_k + m_k) for the m_k samples of class k in the block, mean nu_k.
Answers account for the waiting rows without committing them (``means`` / ``counts`` are the
statistics of every sample learned), so a prediction equals the sample-by-sample rule at every
moment, and the committed statistics depend on the samples only, not on when the learner was
asked, saved or loaded. The state holds the committed statistics and the waiting rows.

Answers (issue 49): a learner keeps its last answer (``_answer``, not part of the state) and
catches up on the rows learned since (``_rows_since``): the waiting rows after those it had
seen, and, when one commit happened since, the rest of the previous block (kept: a commit
takes a fresh buffer instead of overwriting the full one). Any other change (a base set, a
rollback, a load) starts a new generation and the next answer is computed afresh.

Growth and rollback: the class-indexed arrays grow by capacity doubling (``undo.Rows``), and a
failed call is undone from a journal that ``_commit`` fills before it overwrites anything (the
waiting rows and the rows of the classes in the block; SLDA adds its scatter): a call that
commits nothing saves nothing but two counts.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.anytime import GENERATIONS, fill_blocks, group, merged
from ciosl.learners.base import Learner
from ciosl.learners.undo import Rows


class BlockMeans(Learner):
    """A learner whose statistics are exact per-class means, updated in blocks."""

    block: ClassVar[int] = 256  # samples buffered before one update of the statistics
    # predictions read the kept answer, published after a learn that a prediction preceded
    # (``Learner.keeps_answer``): no learn step writes it
    published_parts: ClassVar[tuple[str, ...] | None] = ()
    keeps_answer = True
    draws_random = False  # no step draws a random number (Learner._draws_random)

    # ------------------------------------------------------------------ state
    def _init_state(self, dim: int) -> None:
        self._mu = Rows((dim,), torch.float64)  # (K, d) committed class means
        self._n = Rows((), torch.int64)  # (K,) committed samples per class
        self.pending_z = torch.zeros(self.block, dim)  # (block, d) raw samples waiting
        self.pending_y = torch.zeros(self.block, dtype=torch.int64)  # (block,)
        self.n_pending = 0
        self._journal: dict[str, Any] | None = None
        self._new_generation()
        self._changed(cov=True)

    # ------------------------------------------------------------------ rows since an answer
    def _new_generation(self) -> None:
        """The statistics changed in a way a kept answer cannot follow row by row (a base set,
        a rollback, a load): the next answer refits."""
        self._gen = next(GENERATIONS)
        self._prev: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self._answer = None

    def _rotate(self) -> None:
        """The full buffer was committed: keep it as the previous block (a kept answer
        catches up on its rows) and take a fresh one (never written again)."""
        self._prev = self.pending_z, self.pending_y, self._gen
        self.pending_z = torch.empty_like(self.pending_z)
        self.pending_y = torch.empty_like(self.pending_y)
        self._gen = next(GENERATIONS)

    def _rows_since(self, gen: int, p: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows (m, d) and classes (m,) learned since the moment (``gen``, ``p``): the
        waiting rows after the first p, and before them the rest of the previous block if
        one commit happened since. None if the rows are gone (two commits or more since, a
        base set, a rollback, a load)."""
        q = self.n_pending
        if gen == self._gen:
            return (self.pending_z[p:q], self.pending_y[p:q]) if p <= q else None
        prev = self._prev
        if prev is not None and prev[2] == gen:
            return torch.cat([prev[0][p:], self.pending_z[:q]]), torch.cat([prev[1][p:],
                                                                            self.pending_y[:q]])
        return None

    @property
    def _pending_np(self) -> tuple[np.ndarray, np.ndarray]:
        """Zero-copy numpy views of the waiting rows (a numpy row write costs far less than a
        torch one on a one-sample step)."""
        views = getattr(self, "_views", None)
        if views is None or views[0] is not self.pending_z:
            views = self.pending_z, self.pending_z.numpy(), self.pending_y.numpy()
            self._views = views
        return views[1], views[2]

    def _changed(self, cov: bool) -> None:
        """The statistics changed (``cov``: more than the class list): drop cached answers."""
        self._totals_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def _add_class(self) -> None:
        self._mu.grow()
        self._n.grow()
        self._changed(cov=False)

    def _block_state(self) -> dict[str, Any]:
        p = self.n_pending
        return {"mu": self._mu.view.clone(), "counts": self._n.view.clone(),
                "pending_z": self.pending_z[:p].clone(), "pending_y": self.pending_y[:p].clone()}

    def _load_block_state(self, state: dict[str, Any]) -> None:
        """A state of this version, or one saved before blocks (no waiting rows)."""
        mu, counts = state["mu"], state["counts"]
        K = len(mu)  # one row per class: the loader's probe checks it against classes_
        if mu.shape != (K, self.dim_) or counts.shape != (K,):
            raise ValueError(f"means {tuple(mu.shape)} and counts {tuple(counts.shape)} do not "
                             f"match the width {self.dim_}")
        pz = state.get("pending_z", torch.zeros(0, self.dim_))
        py = state.get("pending_y", torch.zeros(0, dtype=torch.int64))
        p = len(py)
        if p >= self.block or pz.shape != (p, self.dim_) or (
                p and not 0 <= int(py.min()) <= int(py.max()) < K):
            raise ValueError(f"{p} waiting samples, or their classes, out of range")
        self._mu.set(mu.double())
        self._n.set(counts.long())
        self.pending_z[:p], self.pending_y[:p], self.n_pending = pz, py, p
        self._new_generation()
        self._changed(cov=True)

    # ------------------------------------------------------------------ learning
    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        p = self.n_pending
        pz, py = self._pending_np
        pz[p], py[p] = z, yi  # beyond the waiting rows: nothing counts it until n_pending does
        if p + 1 == self.block:
            # a known class keeps no undo record (no copy per sample): the commit computes
            # and allocates everything before it moves anything, so if it raises, the sample
            # is simply not counted
            self._commit(self.pending_z, self.pending_y)
            self.n_pending = 0
            self._rotate()
        else:
            self.n_pending = p + 1
        self._changed(cov=True)

    def _append(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Buffer the samples in order; commit every full buffer."""
        fill_blocks(self, torch.from_numpy(Z), torch.from_numpy(np.asarray(yi, dtype=np.int64)))
        self._changed(cov=True)

    _learn_batch = _append

    _group = staticmethod(group)  # rows, classes present, positions, counts, means
    _merged = staticmethod(merged)  # exact means after a block (Chan et al.)

    @classmethod
    def _merge(cls, mu: torch.Tensor, n: torch.Tensor, u: torch.Tensor, m: torch.Tensor,
               nu: torch.Tensor) -> None:
        """``_merged``, in place."""
        mu[u], n[u] = cls._merged(mu, n, u, m, nu)

    def _commit(self, Z: torch.Tensor, y: torch.Tensor) -> None:
        """Fold rows Z (b, d) of classes y (b,) into the committed statistics. Everything is
        computed and allocated before the first statistic moves (``_fold`` allocates before
        it adds in place), so a failure leaves them as they were."""
        Z64, u, inv, m, nu = self._group(Z, y)
        self._save_before_commit(u)
        mu, n = self._mu.view, self._n.view
        mu_u, n_u = self._merged(mu, n, u, m, nu)  # (u, d), (u,)
        self._fold(Z64, u, inv, m, nu, mu, n)
        mu[u], n[u] = mu_u, n_u

    def _fold(self, Z64, u, inv, m, nu, mu, n) -> None:
        """What a block adds besides the means (SLDA: the scatter), before the means move."""

    def _totals(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Means (K, d) and counts (K,) of every sample learned, waiting rows included."""
        if self.n_pending == 0:
            return self._mu.view, self._n.view
        if self._totals_cache is None:
            mu, n = self._mu.view.clone(), self._n.view.clone()
            p = self.n_pending
            _, u, _, m, nu = self._group(self.pending_z[:p], self.pending_y[:p])
            self._merge(mu, n, u, m, nu)
            self._totals_cache = mu, n
        return self._totals_cache

    @property
    def mu(self) -> torch.Tensor:
        """Class means of every sample learned, (K, d) float64."""
        return self._totals()[0]

    @property
    def counts(self) -> torch.Tensor:
        """Samples learned per class, (K,) int64."""
        return self._totals()[1]

    # ------------------------------------------------------------------ all-or-nothing
    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """Two counts and the kept answer with the buffers it reads (references); ``_commit``
        adds what it is about to overwrite."""
        self._journal = {"n_pending": self.n_pending, "rows": [], "kept": (
            self._gen, self._prev, self.pending_z, self.pending_y, self._answer)}
        return self._journal

    def _save_before_commit(self, u: torch.Tensor) -> None:
        j = self._journal
        if j is None:
            return
        if "pending" not in j:  # the first commit of the call: the rows that waited before
            j["pending"] = self.pending_z.clone(), self.pending_y.clone()
            self._save_first_commit(j)
        j["rows"].append((u, self._mu.view[u].clone(), self._n.view[u].clone()))

    def _save_first_commit(self, journal: dict[str, Any]) -> None:
        """Add to ``journal`` what a commit overwrites besides the means (SLDA: the scatter)."""

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        for u, mu, n in reversed(record["rows"]):
            self._mu.buf[u], self._n.buf[u] = mu, n
        self._mu.truncate(n_classes)
        self._n.truncate(n_classes)
        if "pending" in record:
            self.pending_z.copy_(record["pending"][0])
            self.pending_y.copy_(record["pending"][1])
        self.n_pending = record["n_pending"]
        self._journal = None
        # the kept answer and the blocks it catches up from, as they were (a step writes the
        # waiting buffer only past its waiting rows, and a commit takes a fresh one): the
        # next answer is the one a learner that never made the call would give, to the bit
        self._gen, self._prev, self.pending_z, self.pending_y, self._answer = record["kept"]
        self._changed(cov=True)

    def _undo_done(self, record: dict[str, Any]) -> None:
        self._journal = None
