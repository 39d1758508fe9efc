"""REMIND: replay of product-quantized features.

Reference: T. L. Hayes, K. Kafle, R. Shrestha, M. Acharya, C. Kanan, "REMIND your neural network
to prevent catastrophic forgetting", ECCV 2020; adapted as in the paper we reproduce: the frozen
extractor's features are quantized (not a mid-level CNN tensor) and the plastic part is the
shared head (hidden [256, 256], ReLU, SGD lr 0.01, momentum 0.9, weight decay 1e-5).

- Quantizer: ``faiss.ProductQuantizer(D, M=pq_subvectors, nbits=pq_nbits)`` (32 sub-vectors of
  256 centroids each by default) trained once, on the features of the first ``fit_base``
  (REMIND trains its PQ on the base-initialization data). Later ``fit_base`` calls reuse it.
  ``learn_one`` before any ``fit_base`` raises: there is no codebook to quantize with.
- Width: when d is not a multiple of M, features are zero-padded to D = M * ceil(d / M) (the
  padded sub-vectors quantize zeros; reconstructions are cut back to d).
- Small base sets (fewer bits, ``nbits_``): docs/design.md, "Module notes".
- Memory: up to ``buffer`` items, each ``code_size_`` uint8 bytes (M bytes at nbits 8) and a
  label; when full the victim is uniform among the items of the largest class (ties: the
  lowest class index), REMIND's class-balanced random eviction. ``memory_size()`` counts items,
  ``compression_ratio()`` = raw float32 feature bytes (4 d) / code bytes.
- Step: per stream sample, ONE SGD step on the mean cross-entropy of the new sample and N1' =
  ``n_replay`` items drawn uniformly without replacement from the memory (before the new one is
  stored), all reconstructed from their codes (REMIND quantizes the new input too); then the
  new sample's code is stored.
- ``fit_base``: the head is trained on the raw base features (``base_epochs`` epochs of
  ``base_batch_size`` mini-batches, REMIND's offline base init), then every base sample is
  encoded and stored in order.
- Prediction: test features are quantized and reconstructed before the head, as REMIND does.
- State: the codebook as a tensor (``faiss.vector_to_array(pq.centroids)``; faiss objects do not
  pickle), rebuilt by ``copy_array_to_vector`` into a new quantizer with identical codes.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import faiss
import numpy as np
import torch

from ciosl.learners.base import register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM


@register
class Remind(FineTune):
    name = "remind"
    description = "replay of product-quantized features, class-balanced (Hayes et al. 2020)"
    help = {
        "buffer": "replay memory capacity (stored codes)",
        "n_replay": "N1': reconstructed memory items replayed per step",
        "pq_subvectors": "M: product-quantizer sub-vectors (bytes per code at 8 bits)",
        "pq_nbits": "bits per sub-vector code (2^nbits centroids); lowered for small base sets",
        **FineTune.help,
        "seed": "seed of the weight init, the k-means, the shuffling and the replay draws",
    }
    conformance_settings: ClassVar[list[dict]] = [{"buffer": 16, "pq_subvectors": 8,
                                                   "pq_nbits": 3}]

    def __init__(self, *, buffer: int = 1000, n_replay: int = 16, pq_subvectors: int = 32,
                 pq_nbits: int = 8, lr: float = 0.01, momentum: float = 0.9,
                 weight_decay: float = 1e-5, max_grad_norm: float = MAX_GRAD_NORM,
                 base_epochs: int = 20, base_batch_size: int = 16, seed: int = 0):
        self.buffer = buffer
        self.n_replay = n_replay
        self.pq_subvectors = pq_subvectors
        self.pq_nbits = pq_nbits
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm,
                         base_epochs=base_epochs, base_batch_size=base_batch_size, seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.n_replay < 0 or self.pq_subvectors < 1 or not 1 <= self.pq_nbits <= 8:
            raise ValueError(f"{self.name}: need n_replay >= 0, pq_subvectors >= 1, "
                             "1 <= pq_nbits <= 8")

    # ------------------------------------------------------------------ quantizer
    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)  # the head and its optimizer
        self.pad_dim_ = self.pq_subvectors * math.ceil(dim / self.pq_subvectors)  # D
        self.pq: faiss.ProductQuantizer | None = None
        self.nbits_: int | None = None
        self._alloc(0)

    def _alloc(self, code_size: int) -> None:
        self.codes = torch.zeros(self.buffer, code_size, dtype=torch.uint8)  # (C, code_size)
        self.labels = torch.zeros(self.buffer, dtype=torch.int64)  # (C,)
        self._size = 0

    def _build_pq(self, nbits: int, centroids: np.ndarray | None = None) -> None:
        self.nbits_ = nbits
        self.pq = faiss.ProductQuantizer(self.pad_dim_, self.pq_subvectors, nbits)
        self.pq.cp.min_points_per_centroid = 1  # silence the "39 k points" warning
        if centroids is not None:
            faiss.copy_array_to_vector(np.ascontiguousarray(centroids), self.pq.centroids)

    def _train_pq(self, Z: np.ndarray) -> None:
        X = self._pad(Z if len(Z) > 1 else np.repeat(Z, 2, axis=0))  # (n, D)
        self._build_pq(max(1, min(self.pq_nbits, int(math.floor(math.log2(len(X)))))))
        self.pq.cp.seed = int(self.rng.integers(2**31 - 1))
        self.pq.train(X)
        self._alloc(self.code_size_)

    @property
    def code_size_(self) -> int:
        return int(self.pq.code_size)  # ceil(M * nbits_ / 8) bytes

    def compression_ratio(self) -> float:
        """Raw float32 feature bytes / PQ code bytes per stored item."""
        if self.pq is None:
            raise RuntimeError(f"{self.name}: no quantizer before fit_base")
        return 4.0 * self.dim_ / self.code_size_

    def _pad(self, Z: np.ndarray) -> np.ndarray:
        out = np.zeros((len(Z), self.pad_dim_), dtype=np.float32)  # (n, D)
        out[:, :Z.shape[1]] = Z
        return out

    def encode(self, Z: np.ndarray) -> np.ndarray:
        """(n, d) float features -> (n, code_size_) uint8 codes."""
        return self.pq.compute_codes(self._pad(Z))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """(n, code_size_) uint8 codes -> (n, d) float32 reconstructions."""
        return self.pq.decode(np.ascontiguousarray(codes))[:, :self.dim_]

    def reconstruct(self, Z: np.ndarray) -> np.ndarray:
        return self.decode(self.encode(Z))  # (n, d)

    # ------------------------------------------------------------------ memory
    def memory_size(self) -> int:
        return self._size

    def _store(self, code: np.ndarray, c: int) -> None:
        """Store one code (code_size_,); when full, evict uniformly in the largest class."""
        if self._size < self.buffer:
            slot = self._size
            self._size += 1
        else:
            y = self.labels.numpy()
            members = np.flatnonzero(y == np.argmax(np.bincount(y)))  # ties: lowest class
            slot = int(members[self.rng.integers(len(members))])
        journal = getattr(self, "_journal", None)
        if journal is not None and slot not in journal:
            journal[slot] = self.codes, self.codes[slot].clone(), int(self.labels[slot])
        self.codes[slot] = torch.from_numpy(code)
        self.labels[slot] = c

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """The head's record, the stored codes journalled slot by slot (``_store``); the
        quantizer and the code buffers are replaced, never changed, once trained."""
        self._journal: dict[int, tuple] | None = {}
        return {**super()._undo_record(yi), "codes": (self.pq, self.nbits_, self.codes,
                                                      self.labels, self._size)}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        self.pq, self.nbits_, self.codes, self.labels, self._size = record["codes"]
        for slot, (codes, code, label) in (self._journal or {}).items():
            if codes is self.codes:  # rows of a buffer made in the call are dropped with it
                self.codes[slot], self.labels[slot] = code, label
        self._journal = None

    def _undo_done(self, record: dict[str, Any]) -> None:
        super()._undo_done(record)
        self._journal = None

    def _state(self) -> dict[str, Any]:
        cb = None if self.pq is None else torch.from_numpy(faiss.vector_to_array(self.pq.centroids))
        n = self._size
        return {**super()._state(), "centroids": cb, "nbits": self.nbits_,
                "codes": self.codes[:n].clone(), "labels": self.labels[:n].clone()}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        if state["centroids"] is not None:
            self._build_pq(int(state["nbits"]), state["centroids"].numpy())
            self._alloc(self.code_size_)
        n = len(state["labels"])
        self.codes[:n], self.labels[:n], self._size = state["codes"], state["labels"], n

    # ------------------------------------------------------------------ learning
    def learn_one(self, z, y) -> None:
        if self.dim_ is None or self.pq is None:  # checked before the label is registered
            raise RuntimeError(f"{self.name}: call fit_base first; the product quantizer is "
                               "trained on the base-initialization features")
        super().learn_one(z, y)

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        if self.pq is None:
            self._train_pq(Z)  # draws from self.rng, before the head's torch_rng shuffles
        super()._fit_base(Z, yi)  # the head's offline epochs on the raw features
        for code, c in zip(self.encode(Z), yi.tolist(), strict=True):
            self._store(code, c)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._learn_batch(z[None], np.array([yi]))

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """New rows quantized and reconstructed, plus N1' reconstructed replays, one step; the
        new codes are then stored in order (streaming: a batch of one)."""
        codes = self.encode(Z)  # (b, code_size_)
        Y = torch.from_numpy(np.asarray(yi, np.int64))  # (b,)
        k = min(self.n_replay, self._size)
        if k:
            slots = torch.from_numpy(self.rng.choice(self._size, size=k, replace=False))  # (r,)
            codes = np.concatenate([codes, self.codes[slots].numpy()])  # (1 + r, code_size_)
            Y = torch.cat([Y, self.labels[slots]])  # (1 + r,)
        self._step(torch.from_numpy(self.decode(codes)), Y)
        for c, label in zip(codes[:len(yi)], np.asarray(yi).tolist(), strict=True):
            self._store(c, label)

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        return self.net.predict_proba(np.ascontiguousarray(self.reconstruct(Z)))  # (n, n_seen)
