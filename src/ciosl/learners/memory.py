"""Replay memory: fixed-capacity storage, replacement policies and selection strategies.

Paper sections 3.2-3.4. Each stored item keeps its feature ``z``, its label ``y``, the logits
recorded for it (for distillation), how many of those logits were valid when recorded, and its
online loss and uncertainty scores (refreshed whenever the item is replayed, section 3.4).

Replacement when the memory is full (``offer``):

- ``reservoir``: Vitter's algorithm R; every stream item is held with probability
  capacity / n_offered.
- ``lawrrr``: the reservoir condition decides whether to store; the victim is drawn with
  probability proportional to ``class_count(y_i) / (loss_i + eps)``.
- ``lawcbr``: always store; the victim comes from the class with the most items (ties: the
  lowest class index), drawn with probability proportional to ``1 / (loss_i + eps)``.
- ``class_balanced_random`` (REMIND): always store; the victim is uniform in the largest class
  (ties: the lowest class index).

Selection (``select``): ``uniform`` without replacement; ``uapn`` / ``lapn`` the n//2 items of
highest and the n - n//2 of lowest uncertainty / loss, over the whole memory (the paper) or over
a pool of ``candidates`` items drawn uniformly (so that no item is replayed at every step). Ties
follow the total order (score, slot): among equal scores the highest slots count as "highest"
and the lowest slots as "lowest", so both halves are always disjoint and the result is
deterministic given the pool.

All randomness comes from the ``rng`` argument (the learner's generator). Storage and
growth: docs/design.md, "Module notes".

All-or-nothing (``begin`` / ``rollback`` / ``commit``): while a journal is open, every slot is
saved before it is first written, so a failed learner call puts back exactly the rows it wrote.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ciosl.errors import _describe, size_text, too_large

REPLACEMENTS = ("reservoir", "lawrrr", "lawcbr", "class_balanced_random")
SELECTIONS = ("uniform", "uapn", "lapn")
EPS = 1e-8  # added to losses in the 1/loss weights, so a zero loss is fine


def _floats(values: Any) -> np.ndarray:
    """``values`` (a tensor, an array or numbers) as a float32 numpy array, without a copy
    where it already is one."""
    if isinstance(values, torch.Tensor):
        return values.detach().to(torch.float32).numpy()
    return np.asarray(values, dtype=np.float32)


def _weighted_index(w: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn with probability proportional to the non-negative weights ``w``."""
    c = np.cumsum(w, dtype=np.float64)
    total = c[-1]
    if not (np.isfinite(total) and total > 0):  # all weights 0 (infinite losses): uniform
        return int(rng.integers(len(w)))
    return min(int(np.searchsorted(c, rng.random() * total, side="right")), len(w) - 1)


def _extreme(v: np.ndarray, k: int, *, largest: bool) -> np.ndarray:
    """Indices of the k largest (or smallest) of ``v`` in the total order (value, index)."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    m = len(v)
    kth = np.partition(v, m - k if largest else k - 1)[m - k if largest else k - 1]
    strict = np.flatnonzero(v > kth if largest else v < kth)
    ties = np.flatnonzero(v == kth)
    need = k - len(strict)
    ties = ties[len(ties) - need:] if largest else ties[:need]
    return np.concatenate([strict, ties]).astype(np.int64, copy=False)


class ReplayMemory:
    """Fixed-capacity replay buffer with per-item logits, loss and uncertainty."""

    def __init__(self, capacity: int, dim: int, *, replacement: str = "reservoir"):
        if int(capacity) < 1:
            raise ValueError(f"memory capacity must be >= 1, got {capacity}")
        if int(dim) < 1:
            raise ValueError(f"memory feature width must be >= 1, got {dim}")
        if replacement not in REPLACEMENTS:
            raise ValueError(
                f"unknown replacement policy {replacement!r}; valid choices: "
                f"{', '.join(REPLACEMENTS)}"
            )
        self.capacity = int(capacity)
        self.dim = int(dim)
        self.replacement = replacement
        self._allocate(0)

    def _allocate(self, width: int) -> None:
        cap = self.capacity
        try:
            self.z = torch.zeros(cap, self.dim)  # (C, d)
        except (RuntimeError, MemoryError) as e:  # the allocator's message names no setting
            if not too_large(e):  # anything else is not "more than can be allocated"
                raise RuntimeError(f"buffer={cap}: creating a replay memory of {cap} samples "
                                   f"x {self.dim} features failed ({_describe(e)})") from e
            need = cap * self.dim * 4
            raise ValueError(f"buffer={cap}: a replay memory of {cap} samples x {self.dim} "
                             f"features needs {size_text(need)}, more than can be "
                             "allocated here; use a smaller buffer (--buffer)") from None
        self.y = torch.zeros(cap, dtype=torch.int64)  # (C,)
        self._logits = torch.zeros(cap, width)  # (C, >= width), columns from width on are 0
        self._width = width
        self.n_logits = torch.zeros(cap, dtype=torch.int64)  # (C,)
        self.loss = torch.zeros(cap)  # (C,)
        self.uncertainty = torch.zeros(cap)  # (C,)
        self._counts = np.zeros(8, dtype=np.int64)  # (n_classes,) items per class, incremental
        self._size = 0
        self.n_offered = 0
        # slot -> its row before the call: ((z, y) or None if the call kept them, logits,
        # n_logits, loss, uncertainty)
        self._journal: dict[int, tuple] | None = None
        self._views()

    def _views(self) -> None:
        """Zero-copy numpy views of the storage, rebuilt whenever a tensor is replaced."""
        self._np = {name: getattr(self, name).numpy() for name in
                    ("z", "y", "_logits", "n_logits", "loss", "uncertainty")}
        self._np["logits"] = self._np.pop("_logits")  # every column of the buffer

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles carry the tensors only: a copied view would not alias the copied
        tensor, so the views are rebuilt on the other side."""
        return {k: v for k, v in self.__dict__.items() if k != "_np"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._views()

    # ------------------------------------------------------------------ sizes
    def __len__(self) -> int:
        return self._size

    @property
    def size(self) -> int:
        return self._size

    @property
    def width(self) -> int:
        """Number of logit columns currently stored."""
        return self._width

    @property
    def logits(self) -> torch.Tensor:
        """(C, width) stored logits (a view of the buffer)."""
        return self._logits[:, :self._width]

    def nbytes(self) -> int:
        """Bytes of the stored arrays (preallocated for the full capacity)."""
        ts = (self.z, self.y, self._logits, self.n_logits, self.loss, self.uncertainty)
        return sum(t.element_size() * t.nelement() for t in ts) + self._counts.nbytes

    def class_counts(self) -> dict[int, int]:
        """Items held per class (classes with at least one item)."""
        nz = np.flatnonzero(self._counts)
        return {int(c): int(self._counts[c]) for c in nz}

    def grow_logits(self, n_classes: int) -> None:
        """Widen the logits storage to ``n_classes`` columns (zeros); existing values kept.
        The buffer doubles when full: amortised O(capacity) per class."""
        if n_classes > self._width:
            if n_classes > self._logits.shape[1]:
                cap = max(n_classes, 2 * self._logits.shape[1], 8)
                new = torch.zeros(self.capacity, cap)  # (C, cap)
                new[:, :self._width] = self.logits
                self._logits = new
                self._views()
            self._width = n_classes

    # ------------------------------------------------------------------ all-or-nothing
    def begin(self) -> tuple:
        """Open a journal: until ``commit`` or ``rollback``, each slot's row is saved before
        its first write (O(row) per write). Returns the token ``rollback`` needs."""
        self._journal = {}
        return self._size, self.n_offered, self._width

    def commit(self) -> None:
        self._journal = None

    def rollback(self, token: tuple) -> None:
        """Put back every row written since ``begin``, the sizes and the logit width. The
        class counts are counted again (O(capacity), only on a failed call): a fault between
        a write and its count, wherever it came, cannot leave them off."""
        size, n_offered, width = token
        self._views()  # a fault in grow_logits may have come between its buffer and its views
        v = self._np
        for slot, (row, h, n, loss, unc) in (self._journal or {}).items():
            if row is not None:  # the call wrote the features and label too
                v["z"][slot], v["y"][slot] = row
            v["logits"][slot, :len(h)] = h
            v["logits"][slot, len(h):] = 0.0
            v["n_logits"][slot], v["loss"][slot], v["uncertainty"][slot] = n, loss, unc
        self._journal = None
        self._size, self.n_offered, self._width = size, n_offered, width
        self._counts = np.bincount(v["y"][:size], minlength=len(self._counts)).astype(np.int64)

    def _save(self, slots: np.ndarray | list, rows: bool = True) -> None:
        """Journal the rows of ``slots`` not saved yet (a no-op without a journal); with
        ``rows`` False only what ``update`` writes (logits and scores): a replayed step does
        not copy the features of the rows it rescores, and ``offer`` adds them if it then
        overwrites one of those rows."""
        j = self._journal
        if j is None:
            return
        v = self._np
        new = []
        for slot in map(int, slots):
            saved = j.get(slot)
            if saved is None:
                new.append(slot)
            elif rows and saved[0] is None:  # the features are still the call's first ones
                j[slot] = ((v["z"][slot].copy(), int(v["y"][slot])), *saved[1:])
        if new:  # one gather per field (a replayed step rescores ~16 rows)
            new = list(dict.fromkeys(new))
            kept = [(z, y) for z, y in zip(v["z"][new], v["y"][new].tolist(), strict=True)] \
                if rows else [None] * len(new)
            j.update(zip(new, zip(kept, v["logits"][new], v["n_logits"][new].tolist(),
                                  v["loss"][new].tolist(), v["uncertainty"][new].tolist(),
                                  strict=True), strict=True))

    # ------------------------------------------------------------------ storing
    def offer(self, z: Any, y: int, *, rng: np.random.Generator, logits: Any = (),
              loss: float = 0.0, uncertainty: float = 0.0) -> int | None:
        """One stream item arrives; returns the slot written, or None if it was not stored
        (``rng``: the learner's generator, for the replacement; ``logits``, ``loss`` and
        ``uncertainty``: what the loss- and uncertainty-aware policies weigh, none needed by
        the reservoir)."""
        z = _floats(z).reshape(-1)  # (d,)
        if z.shape[0] != self.dim:
            raise ValueError(f"memory: feature width {z.shape[0]} differs from {self.dim}")
        y = int(y)
        if y < 0:
            raise ValueError(f"memory: class index must be >= 0, got {y}")
        loss, uncertainty = float(loss), float(uncertainty)
        if not loss >= 0 or uncertainty != uncertainty:  # negative or NaN
            raise ValueError(f"memory: loss must be >= 0 and scores not NaN, got "
                             f"loss={loss}, uncertainty={uncertainty}")
        h = _floats(logits).reshape(-1)  # (c,)
        self.n_offered += 1
        if self._size < self.capacity:
            slot = self._size
            self._size += 1
        else:
            slot = self._victim(rng)
            if slot is None:
                return None
            self._counts[self._np["y"][slot]] -= 1
        self._write(slot, z, y, h, loss, uncertainty)
        return slot

    def _victim(self, rng: np.random.Generator) -> int | None:
        """The slot to overwrite when full (None: do not store), per the replacement policy."""
        if self.replacement in ("reservoir", "lawrrr"):
            j = int(rng.integers(self.n_offered))
            if j >= self.capacity:
                return None
            if self.replacement == "reservoir":
                return j
            w = self._counts[self._np["y"]] / (self._np["loss"].astype(np.float64) + EPS)  # (C,)
            return _weighted_index(w, rng)
        largest = int(np.argmax(self._counts))  # ties: the lowest class index
        members = np.flatnonzero(self._np["y"] == largest)  # full: the prefix is everything
        if self.replacement == "class_balanced_random":
            return int(members[rng.integers(len(members))])
        w = 1.0 / (self._np["loss"][members].astype(np.float64) + EPS)  # lawcbr
        return int(members[_weighted_index(w, rng)])

    def _write(self, slot: int, z: np.ndarray, y: int, h: np.ndarray, loss: float,
               uncertainty: float) -> None:
        c = h.shape[0]
        self._save((slot,))
        self.grow_logits(c)
        v = self._np
        v["z"][slot] = z
        v["y"][slot] = y
        v["logits"][slot, :c] = h
        v["logits"][slot, c:] = 0.0
        v["n_logits"][slot] = c
        v["loss"][slot] = loss
        v["uncertainty"][slot] = uncertainty
        if y >= len(self._counts):
            self._counts = np.concatenate(
                [self._counts, np.zeros(max(y + 1, 2 * len(self._counts)) - len(self._counts),
                                        dtype=np.int64)])
        self._counts[y] += 1

    # ------------------------------------------------------------------ selecting
    def select(self, n: int, strategy: str, rng: np.random.Generator,
               candidates: int = 0) -> np.ndarray:
        """(min(n, size),) distinct slots to replay, chosen by ``strategy``. ``candidates``
        > 0: uapn / lapn rank only that many items drawn uniformly without replacement (at
        least n), not the whole memory (0, the paper)."""
        if strategy not in SELECTIONS:
            raise ValueError(
                f"unknown selection strategy {strategy!r}; valid choices: {', '.join(SELECTIONS)}"
            )
        if n < 0:
            raise ValueError(f"memory: cannot select {n} items")
        if candidates < 0:
            raise ValueError(f"memory: candidates must be >= 0, got {candidates}")
        if strategy == "uniform":
            return self.sample_uniform(n, rng)
        if self._size <= n:
            return np.arange(self._size, dtype=np.int64)
        score = self._np["uncertainty" if strategy == "uapn" else "loss"][: self._size]
        pool = None
        if 0 < candidates < self._size:  # rank a uniform pool of max(candidates, n) items
            pool = self.sample_uniform(max(candidates, n), rng)
            pool.sort()  # ties keep the slot order (value, slot)
            score = score[pool]
        hi = _extreme(score, n // 2, largest=True)
        lo = _extreme(score, n - n // 2, largest=False)
        out = np.concatenate([hi, lo])
        return out if pool is None else pool[out]

    def sample_uniform(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """(min(n, size),) distinct slots uniformly without replacement (distillation, N2')."""
        if n < 0:
            raise ValueError(f"memory: cannot sample {n} items")
        k = min(n, self._size)
        return rng.choice(self._size, size=k, replace=False).astype(np.int64, copy=False)

    # ------------------------------------------------------------------ reading / updating
    def _slots(self, slots: Any) -> np.ndarray:
        s = np.asarray(slots, dtype=np.int64).reshape(-1)  # (k,)
        if len(s) and (s.min() < 0 or s.max() >= self._size):
            raise IndexError(f"memory: slots must be in [0, {self._size}), got {s.tolist()}")
        return s

    def batch(self, slots: Any, out: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(z[slots] (k, d), y[slots] (k,)), copies; ``out``: a (k, d) tensor to write the
        features into (returned)."""
        s = torch.from_numpy(self._slots(slots))
        return torch.index_select(self.z, 0, s, out=out), self.y.index_select(0, s)

    def labels_of(self, slots: Any) -> torch.Tensor:
        """y[slots] (k,)."""
        return torch.from_numpy(self._np["y"][self._slots(slots)])

    def distill_targets(self, slots: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits[slots] (k, width), mask (k, width) bool: column < n_logits[slot])."""
        s = self._slots(slots)
        mask = np.arange(self.width)[None, :] < self._np["n_logits"][s][:, None]  # (k, width)
        return torch.from_numpy(self._np["logits"][s, :self._width]), torch.from_numpy(mask)

    def update(self, slots: Any, *, logits: Any = None, loss: Any = None,
               uncertainty: Any = None) -> None:
        """Online refresh of replayed items (paper 3.4); only ``slots`` change. Everything is
        checked before anything is written."""
        s = self._slots(slots)
        h = None
        if logits is not None:
            h = _floats(logits)  # (k, c)
            if h.ndim != 2 or h.shape[0] != len(s):
                raise ValueError(f"memory.update: logits must be ({len(s)}, c), got "
                                 f"{tuple(h.shape)}")
        scores = {}
        for name, v in (("loss", loss), ("uncertainty", uncertainty)):
            if v is None:
                continue
            v = _floats(v).reshape(-1)  # (k,)
            if v.shape[0] != len(s):
                raise ValueError(f"memory.update: {name} must have {len(s)} values")
            if np.isnan(v).any() or (name == "loss" and (v < 0).any()):
                raise ValueError(f"memory.update: {name} has NaN or negative values")
            scores[name] = v
        self._save(s, rows=False)  # features and labels stay
        if h is not None:
            c = h.shape[1]
            self.grow_logits(c)
            L = self._np["logits"]
            L[s, :c] = h
            L[s, c:] = 0.0
            self._np["n_logits"][s] = c
        for name, v in scores.items():
            self._np[name][s] = v

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """Torch tensors and plain values only (torch.load(weights_only=True)); filled prefix."""
        n = self._size
        return {
            "capacity": self.capacity, "dim": self.dim, "replacement": self.replacement,
            "size": n, "n_offered": self.n_offered, "width": self.width,
            "z": self.z[:n].clone(), "y": self.y[:n].clone(), "logits": self.logits[:n].clone(),
            "n_logits": self.n_logits[:n].clone(), "loss": self.loss[:n].clone(),
            "uncertainty": self.uncertainty[:n].clone(),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Restore a ``state()`` (capacity, width and policy included)."""
        if state["replacement"] not in REPLACEMENTS:
            raise ValueError(f"unknown replacement policy {state['replacement']!r}")
        self.capacity, self.dim = int(state["capacity"]), int(state["dim"])
        self.replacement = state["replacement"]
        self._allocate(int(state["width"]))
        n = int(state["size"])
        for name in ("z", "y", "logits", "n_logits", "loss", "uncertainty"):
            getattr(self, name)[:n] = state[name]
        self._size, self.n_offered = n, int(state["n_offered"])
        counts = np.bincount(self.y[:n].numpy(), minlength=8).astype(np.int64)
        self._counts = counts  # (n_classes,)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ReplayMemory:
        mem = cls(int(state["capacity"]), int(state["dim"]), replacement=state["replacement"])
        mem.load(state)
        return mem

    def __repr__(self) -> str:
        return (f"ReplayMemory(capacity={self.capacity}, dim={self.dim}, "
                f"replacement={self.replacement!r}, size={self._size})")
