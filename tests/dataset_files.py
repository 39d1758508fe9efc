"""Small files in the official layouts of the datasets' loaders (Fashion-MNIST's IDX files,
CIFAR's pickled batches), written for tests in any folder: a test module imports these from here,
never from another test module (a test file must run alone)."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np


def idx_bytes(a: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, a.ndim]) + np.asarray(a.shape, ">u4").tobytes()
    return header + a.astype(np.uint8).tobytes()


def write_fashion(folder: Path, n: int = 20, gz: bool = True, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n), ("t10k", n // 2)):
        for stem, arr in ((f"{split}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28))),
                          (f"{split}-labels-idx1-ubyte", np.arange(count) % 10)):
            data = idx_bytes(arr)
            if gz:
                (folder / (stem + ".gz")).write_bytes(gzip.compress(data))
            else:
                (folder / stem).write_bytes(data)


def write_cifar(folder: Path, n: int = 6, hundred: bool = False, protocol: int = 4) -> np.ndarray:
    """Batches in the official layout; returns the first training image (32, 32, 3)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    k = 100 if hundred else 10
    key = b"fine_labels" if hundred else b"labels"
    files = ("train", "test") if hundred else (*(f"data_batch_{i}" for i in range(1, 6)),
                                               "test_batch")
    first = None
    for f in files:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        first = data[0].reshape(3, 32, 32).transpose(1, 2, 0) if first is None else first
        d = {b"batch_label": f.encode(), key: list(rng.integers(0, k, n)), b"data": data,
             b"filenames": [b"x.png"] * n}
        (folder / f).write_bytes(pickle.dumps(d, protocol=protocol))
    names = [f"class{i}".encode() for i in range(k)]
    meta = {b"fine_label_names": names, b"coarse_label_names": names[:20]} if hundred else {
        b"label_names": names, b"num_cases_per_batch": n}
    (folder / ("meta" if hundred else "batches.meta")).write_bytes(pickle.dumps(meta, protocol))
    return first
