"""ExStream: streaming replay with per-class prototype buffers merged by nearest pairs.

Reference: T. L. Hayes, N. D. Cahill, C. Kanan, "Memory efficient experience replay for
streaming learning", ICRA 2019.

Memory: one prototype buffer per class, each prototype a feature vector with a count (how many
stream samples it summarises). Every class gets ``buffer // n_classes_seen`` slots, so the total
never exceeds ``buffer``. Per incoming sample (z, y), ONE SGD step of the shared head (hidden
[256, 256], ReLU, SGD lr 0.01, momentum 0.9, weight decay 1e-5) on the mean cross-entropy of the
mini-batch {(z, y)} + N1' = ``n_replay`` prototypes (label = their class), then z is stored.

Design choices:

- Insertion: while class y's buffer has room, z becomes a new prototype of count 1. When it is
  full, its two nearest prototypes (Euclidean; ties: the lowest (i, j) in row-major order) are
  merged into slot i as their count-weighted mean with the summed count, and z takes the freed
  slot j. So the counts of a class always sum to the samples of that class seen (the merge
  loses no sample).
- Distances (a cache per class) and the cost of rebalancing: docs/findings/cost-per-new-class.md.
- A class capacity of 1 has no pair to merge: z is merged into the single prototype instead.
- Rebalancing: when a new class arrives the capacity drops to ``buffer // n_classes``; every
  older class buffer is shrunk to it by merging its nearest pairs (the freed slot removed) until
  it fits. With more classes than ``buffer`` slots the capacity is 0 and a class keeps no
  prototypes (degenerate; the count invariant then no longer holds).
- Replay: N1' prototypes drawn uniformly without replacement from all stored prototypes (all
  if fewer), drawn before z is stored, so z is never in its own replay batch. The loss weights
  every prototype equally, whatever its count (as the paper's uniform replay).
- ``fit_base``: ``base_epochs`` epochs of shuffled ``base_batch_size`` mini-batches (the same
  SGD, whose momentum carries on into the stream), then every base sample is inserted in order.
- ``memory_size()`` is the number of stored prototypes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import Range, register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM

_EXACT = "donot_use_mm_for_euclid_dist"  # per-pair distances, independent of the batch shape


def distances(A: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """(k, n) Euclidean distances between the rows of A (k, d) and P (n, d)."""
    return torch.cdist(A, P, compute_mode=_EXACT)


def pairwise(P: torch.Tensor) -> torch.Tensor:
    """(n, n) distances between the rows of P (n, d), +inf on the diagonal."""
    return distances(P, P).fill_diagonal_(float("inf"))


def nearest_pair(D: torch.Tensor) -> tuple[int, int]:
    """(i, j), i < j: the closest pair of a ``pairwise`` matrix D (n, n), n >= 2; argmin
    returns the first minimum, so ties go to the lowest (i, j) in row-major order."""
    i, j = divmod(int(torch.argmin(D)), D.shape[0])
    return min(i, j), max(i, j)


@register
class ExStream(FineTune):
    name = "exstream"
    description = "replay of per-class prototypes merged by nearest pairs (Hayes et al. 2019)"
    help = {
        "buffer": "total prototypes; each class holds buffer // n_classes_seen",
        "n_replay": "N1': prototypes replayed per step",
        **FineTune.help,
        "seed": "seed of the weight init, the base-init shuffling and the replay draws",
    }
    conformance_settings: ClassVar[list[dict]] = [{"buffer": 16}, {"buffer": 5, "n_replay": 4}]
    # a full class caches its (n_c, n_c) float32 distances, n_c up to buffer (one class): 400 MB
    # at 10000, and 4 TB at the generic integer bound 10^6
    ranges: ClassVar[dict[str, Range]] = {**FineTune.ranges, "buffer": Range(1, 10000)}

    def __init__(self, *, buffer: int = 1000, n_replay: int = 16, lr: float = 0.01,
                 momentum: float = 0.9, weight_decay: float = 1e-5,
                 max_grad_norm: float = MAX_GRAD_NORM, base_epochs: int = 20,
                 base_batch_size: int = 16, seed: int = 0):
        self.buffer = buffer
        self.n_replay = n_replay
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm,
                         base_epochs=base_epochs, base_batch_size=base_batch_size, seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.n_replay < 0:
            raise ValueError(f"{self.name}: n_replay must be >= 0, got {self.n_replay}")

    # ------------------------------------------------------------------ state
    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)  # the head and its optimizer
        self.protos: list[torch.Tensor] = []  # per class (n_c, d)
        self.counts: list[torch.Tensor] = []  # per class (n_c,) int64, samples summarised
        self._dist: list[torch.Tensor | None] = []  # per class (n_c, n_c) cache, or None
        self._by_size: dict[int, set[int]] | None = None  # n_c -> classes (cache: _sizes)

    def _sizes(self) -> dict[int, set[int]]:
        """The classes holding each number of prototypes > 0 (built once, then kept up to date
        by ``_resized``; dropped on rollback and load)."""
        if self._by_size is None:
            by: dict[int, set[int]] = {}  # built, then assigned (a fault leaves no half cache)
            for c, P in enumerate(self.protos):
                if len(P):
                    by.setdefault(len(P), set()).add(c)
            self._by_size = by
        return self._by_size

    def _resized(self, c: int, old: int) -> None:
        """Class c went from ``old`` prototypes to ``len(self.protos[c])``."""
        by, new = self._by_size, len(self.protos[c])
        if by is None or new == old:
            return
        self._held = None
        if old:
            by[old].discard(c)
            if not by[old]:
                del by[old]
        if new:
            by.setdefault(new, set()).add(c)

    def _holding(self) -> tuple[np.ndarray, np.ndarray]:
        """The classes holding prototypes, ascending, and how many each (cached until a size
        changes): the replay draw's table, without a pass over every class per step."""
        if getattr(self, "_held", None) is None or self._by_size is None:
            pairs = sorted((c, n) for n, cs in self._sizes().items() for c in cs)
            self._held = (np.array([c for c, _ in pairs], dtype=np.int64),
                          np.array([n for _, n in pairs], dtype=np.int64))
        return self._held

    def _over(self, limit: int) -> list[int]:
        """The classes holding more than ``limit`` prototypes, in ascending order."""
        return sorted(c for n, cs in self._sizes().items() if n > limit for c in cs)

    def class_capacity(self) -> int:
        return self.buffer // max(len(self.protos), 1)

    def memory_size(self) -> int:
        return sum(len(P) for P in self.protos)

    def _add_class(self) -> None:
        super()._add_class()
        self.protos.append(torch.zeros(0, self.dim_))
        self.counts.append(torch.zeros(0, dtype=torch.int64))
        self._dist.append(None)
        cap = self.class_capacity()
        for c in self._over(max(cap, 1) if cap else 0):  # the others already fit
            self._shrink(c, cap)

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """The lists by reference, and the values of the classes a step may change in place:
        those of ``yi``, and, when classes arrive, those over the smaller share (the merges
        cost more than these copies)."""
        K = len(self.protos)
        touched = {int(c) for c in yi if c < K}
        n_new = len({int(c) for c in yi if c >= K})
        if n_new:  # merged in place: the classes over the smaller share (emptied ones are
            # replaced, not written: kept by reference)
            touched |= set(self._over(max(self.buffer // (K + n_new), 1)))
        saved = [(c, self.protos[c], self.protos[c].clone(), self.counts[c],
                  self.counts[c].clone(), self._dist[c],
                  None if self._dist[c] is None else self._dist[c].clone()) for c in touched]
        return {**super()._undo_record(yi), "lists": (list(self.protos), list(self.counts),
                                                      list(self._dist)), "classes": saved}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        self.protos, self.counts, self._dist = (list(v) for v in record["lists"])
        self._by_size = None  # rebuilt when next needed
        for c, P, P0, n, n0, D, D0 in record["classes"]:
            P.copy_(P0)
            n.copy_(n0)
            if D is not None:
                D.copy_(D0)
            self.protos[c], self.counts[c], self._dist[c] = P, n, D

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "protos": [P.clone() for P in self.protos],
                "counts": [n.clone() for n in self.counts]}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.protos = [P.clone() for P in state["protos"]]
        self.counts = [n.clone() for n in state["counts"]]
        self._dist = [None] * len(self.protos)
        self._by_size = None

    # ------------------------------------------------------------------ prototypes
    def _pair(self, c: int) -> tuple[int, int]:
        if self._dist[c] is None:
            self._dist[c] = pairwise(self.protos[c])  # (n_c, n_c)
        return nearest_pair(self._dist[c])

    def _refresh(self, c: int, rows: list[int]) -> None:
        """Recompute the cached distances of the changed prototypes ``rows`` of class c."""
        D, R = self._dist[c], distances(self.protos[c][rows], self.protos[c])  # (k, n_c)
        D[rows], D[:, rows] = R, R.T
        D[rows, rows] = float("inf")

    def _merge(self, c: int, i: int, j: int) -> None:
        """Prototype i of class c := count-weighted mean of i and j, count summed; j is freed
        (the caller overwrites or removes it)."""
        P, n = self.protos[c], self.counts[c]
        wi, wj = float(n[i]), float(n[j])
        P[i] = (wi * P[i] + wj * P[j]) / (wi + wj)
        n[i] += n[j]

    def _shrink(self, c: int, cap: int) -> None:
        """Merge nearest pairs of class c until it holds at most ``cap`` prototypes."""
        old = len(self.protos[c])
        while len(self.protos[c]) > max(cap, 1):
            i, j = self._pair(c)
            self._merge(c, i, j)
            keep = torch.arange(len(self.protos[c])) != j  # (n_c,)
            self.protos[c], self.counts[c] = self.protos[c][keep], self.counts[c][keep]
            self._dist[c] = self._dist[c][keep][:, keep]
            self._refresh(c, [i])  # i < j keeps its index
        if cap == 0:
            self.protos[c], self.counts[c] = self.protos[c][:0], self.counts[c][:0]
            self._dist[c] = None
        self._resized(c, old)

    def _insert(self, x: torch.Tensor, c: int) -> None:
        """Store sample x (d,) of class c (see the module docstring)."""
        cap, P, n = self.class_capacity(), self.protos[c], self.counts[c]
        if cap == 0:
            return
        if len(P) < cap:
            self.protos[c] = torch.cat([P, x[None]])  # (n_c + 1, d)
            self.counts[c] = torch.cat([n, torch.ones(1, dtype=torch.int64)])
            self._dist[c] = None  # distances are needed only once the class is full
            self._resized(c, len(P))
        elif cap == 1:
            P[0] = (float(n[0]) * P[0] + x) / (float(n[0]) + 1.0)
            n[0] += 1
        else:
            i, j = self._pair(c)
            self._merge(c, i, j)
            P[j], n[j] = x, 1
            self._refresh(c, [i, j])

    def _replay(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(min(n_replay, stored),) prototypes drawn uniformly: X (r, d), Y (r,)."""
        held, sizes = self._holding()  # (h,) classes holding prototypes, (h,) how many: the
        # empty classes take no draw, so the draws are those over every class in order
        k = min(self.n_replay, int(sizes.sum()))
        if k == 0:
            return torch.zeros(0, self.dim_), torch.zeros(0, dtype=torch.int64)
        flat = self.rng.choice(int(sizes.sum()), size=k, replace=False)  # (r,)
        ends = np.cumsum(sizes)
        at = np.searchsorted(ends, flat, side="right")  # (r,) position in held of each draw
        cls, rows = held[at], flat - (ends[at] - sizes[at])  # (r,) class, row inside it
        X = torch.stack([self.protos[c][i] for c, i in zip(cls.tolist(), rows.tolist(),
                                                          strict=True)])
        return X, torch.from_numpy(cls.astype(np.int64))

    # ------------------------------------------------------------------ learning
    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._fit_base(Z, yi)  # the head's offline epochs
        for x, c in zip(torch.from_numpy(np.ascontiguousarray(Z)), yi.tolist(), strict=True):
            self._insert(x, c)  # x (d,)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        x = torch.from_numpy(z)  # (d,)
        Xr, Yr = self._replay()  # (r, d), (r,)
        self._step(torch.cat([x[None], Xr]), torch.cat([torch.tensor([yi]), Yr]))
        self._insert(x, yi)

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Online / batch regimes: one step on the mini-batch + N1' prototypes, then each new
        sample is inserted in order."""
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (b, d)
        Xr, Yr = self._replay()  # (r, d), (r,)
        self._step(torch.cat([X, Xr]), torch.cat([torch.from_numpy(yi), Yr]))
        for x, k in zip(X, yi.tolist(), strict=True):
            self._insert(x, k)
