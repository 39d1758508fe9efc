"""The feature cache's entries (``ciosl.data.features`` decides what goes in them and when): one
``.npz`` file per ``FeatureSet``, named by its key, holding its arrays and a JSON metadata record
(format version, key, dataset, extractor, class names, array shapes) with a sha256 of both.
An entry is written atomically (``save_features``) and verified on load (``load_features``):
another format version or key, shapes that differ from the recorded ones, or a checksum mismatch
raise ``ValueError``, and the caller rebuilds the entry."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from ciosl.data.types import FeatureSet
from ciosl.errors import writing
from ciosl.fileio import atomic_write_bytes, cache_root, check_regular

FORMAT_VERSION = 2
_ARRAYS = ("train_z", "train_y", "test_z", "test_y", "train_instance", "train_frame")


def default_cache_dir() -> Path:
    return cache_root() / "features"


def _sha(arrays: dict[str, np.ndarray], meta: dict) -> str:
    """sha256 of the metadata and every array (name, dtype, shape, bytes)."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for name in sorted(arrays):
        a = arrays[name]
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def save_features(fs: FeatureSet, path: Path) -> None:
    """Write ``fs`` atomically: temp file in the same folder, fsync, ``os.replace``."""
    arrays = {k: getattr(fs, k) for k in _ARRAYS if getattr(fs, k) is not None}
    meta = {
        "format": FORMAT_VERSION,
        "key": fs.key,
        "dataset": fs.dataset,
        "extractor": fs.extractor,
        "class_names": list(fs.class_names),
        "shapes": {k: list(a.shape) for k, a in arrays.items()},
    }
    meta["sha256"] = _sha(arrays, meta)
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    with writing(path):  # "No space left on device" names the entry, not its temporary
        atomic_write_bytes(path, buf.getvalue())


def load_features(path: Path, key: str) -> FeatureSet:
    """Read and verify a cache entry; raises ``ValueError`` (or a zip/IO error) when bad."""
    check_regular(path, "feature cache entry")  # a FIFO would block np.load for good
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(str(npz["meta"]))
        arrays = {k: npz[k] for k in _ARRAYS if k in npz.files}
    sha = meta.pop("sha256", None)
    if meta.get("format") != FORMAT_VERSION or meta.get("key") != key:
        raise ValueError(f"stale entry (key {meta.get('key')!r}, format {meta.get('format')!r})")
    if {k: list(a.shape) for k, a in arrays.items()} != meta["shapes"]:
        raise ValueError("array shapes differ from the recorded ones")
    if _sha(arrays, meta) != sha:
        raise ValueError("sha256 mismatch")
    return FeatureSet(
        dataset=meta["dataset"],
        extractor=meta["extractor"],
        class_names=tuple(meta["class_names"]),
        key=key,
        **{k: arrays.get(k) for k in _ARRAYS},
    )
