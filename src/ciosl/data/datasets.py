"""The dataset registry and loaders (the registry itself is in ``specs``, the readers of most
formats in ``loaders``; both re-exported here; Fashion-MNIST and the generated datasets here).

``DATASETS`` holds each dataset's protocol (docs/design.md's table); ``get_spec(name)`` also accepts
``features:PATH`` for a user's .npz of precomputed features. ``load_dataset(name)`` returns a
``RawDataset`` or raises ``FileNotFoundError`` telling how to get the data; it never downloads
unless ``download=True``. Data live under ``data_root()`` (``$CIOSL_DATA``, default
``~/.cache/ciosl/data``), one folder per dataset, or wherever ``root`` points.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ciosl.data.download import download_url, mirror_urls
from ciosl.data.folder import FOLDER_PREFIX, load_folder
from ciosl.data.instances import make_instance_dataset

# the readers of the other formats (loaders.py) and the registry (specs.py): re-exported here
from ciosl.data.loaders import (  # noqa: F401
    CIFAR,
    CIFAR_MIRRORS,
    IMAGE_EXTENSIONS,
    IMAGENET100,
    FileImages,
    _cifar_dirs,
    _class_names,
    _find_cifar,
    _fingerprint,
    _folder_fingerprint,
    _images_in,
    _missing,
    _natural_key,
    _subdirs,
    check_cifar_batch,
    load_cifar,
    load_digits,
    load_features,
    load_icubworld1,
    load_imagenet100,
    read_batch,
)
from ciosl.data.specs import (  # noqa: F401
    _ALL,
    _FROM_FASHION,
    _IID,
    _WHERE,
    DATASETS,
    FEATURES_PREFIX,
    _check_feature_file,
    data_root,
    get_spec,
)
from ciosl.data.streams import load_core50, load_stream51
from ciosl.data.types import ArrayImages, DatasetSpec, RawDataset
from ciosl.data.video import make_video_dataset

FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian dataset-fashion-mnist

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                 "Sneaker", "Bag", "Ankle boot")
FASHION_MIRRORS = (
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
)
FASHION_FILES = {  # split -> (images, labels); official md5 of the .gz files
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FASHION_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}


# ---------------------------------------------------------------- Fashion-MNIST (IDX)


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally .gz) of unsigned bytes: magic, dims, then the data."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # a truncated or damaged .gz
        raise ValueError(f"{path}: corrupt or truncated gzip file ({type(e).__name__}: "
                         f"{e or 'ends early'}); delete it and download it again") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int(v) for v in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = 4 + 4 * ndim + int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(f"{path}: {len(raw)} bytes, expected {expected} for shape {shape} "
                       "(truncated or corrupted file)")
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
          return folder / name
    return None


def _fashion_dirs(root: Path | None) -> list[Path]:
    """Where Fashion-MNIST is looked for: ``root`` only, when given (a folder named by the user
    is never silently replaced by another one)."""
    if root is not None:
        return [root]
    return [data_root() / "fashion-mnist", FASHION_SYSTEM_DIR]


def _find_fashion(root: Path | None) -> Path | None:
    for d in _fashion_dirs(root):
        if all(_idx_file(d, s) for pair in FASHION_FILES.values() for s in pair):
          return d
    return None


def load_fashion_mnist(root: str | Path | None = None, *, download: bool = False) -> RawDataset:
    """Fashion-MNIST from IDX files (plain or .gz) in ``root``, $CIOSL_DATA or the system."""
    spec = DATASETS["fashion-mnist"]
    root = Path(root) if root is not None else None
    folder = _find_fashion(root)
    if folder is None and download:
        folder = root or data_root() / "fashion-mnist"
        for fname, md5 in FASHION_MD5.items():
          download_url(mirror_urls(fname, FASHION_MIRRORS), folder / fname, md5)
    if folder is None:
        raise _missing(spec, _fashion_dirs(root))
    arrays = []
    for img_stem, lab_stem in FASHION_FILES.values():
        x, y = read_idx(_idx_file(folder, img_stem)), read_idx(_idx_file(folder, lab_stem))
        if (x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y)
                or (y.size and y.max() >= 10)):
          raise ValueError(f"{folder}: inconsistent Fashion-MNIST files ({img_stem}: "
                           f"{x.shape}, expected (n, 28, 28); {lab_stem}: {y.shape} with labels "
                           f"{'..'.join(str(int(v)) for v in (y.min(), y.max())) if y.size else 'none'}"
                           ", expected n labels in 0..9)")
        arrays += [x, y.astype(np.int64)]
    xtr, ytr, xte, yte = arrays
    return RawDataset("fashion-mnist", "images", ArrayImages(xtr), ytr, ArrayImages(xte), yte,
                    FASHION_CLASSES, _fingerprint("fashion-mnist", arrays),
                    meta={"path": str(folder)})


# ---------------------------------------------------------------- registry entry points


def _video(name: str, root: Path | None, download: bool) -> RawDataset:
    if name in ("digits-video", "digits-video-28"):  # 8x8 -> 16x16 or 28x28 first
        src, upsample = load_digits(), (2.0 if name == "digits-video" else 3.5)
    else:
        try:
          src, upsample = load_fashion_mnist(root, download=download), 1
        except FileNotFoundError as e:
          raise FileNotFoundError(f"{name}: needs fashion-mnist. {e}") from None
    images = src.train_x.images  # type: ignore[union-attr]
    return make_video_dataset(name, images, src.train_y, src.class_names, upsample=upsample)


def _instances(name: str, root: Path | None, download: bool) -> RawDataset:
    if name == "digits-instances":
        return make_instance_dataset(name, load_digits(), n_frames=40)
    try:
        src = load_fashion_mnist(root, download=download)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{name}: needs fashion-mnist. {e}") from None
    return make_instance_dataset(name, src, n_frames=200)


def load_dataset(
    name: str,
    *,
    root: str | Path | None = None,
    download: bool = False,
    allow_subset: bool = False,
) -> RawDataset:
    """Load a dataset by name (or ``features:PATH``, ``folder:DIR``); never downloads unless
    ``download``.

    ``root`` points at the dataset's own folder (default ``data_root()/name``; for
    fashion-mnist-video the fashion-mnist folder). ``allow_subset`` only concerns imagenet100.
    """
    get_spec(name)  # validates the name
    if name.startswith(FEATURES_PREFIX):
        return load_features(name[len(FEATURES_PREFIX):])
    if name.startswith(FOLDER_PREFIX):
        return load_folder(name[len(FOLDER_PREFIX):])
    root = Path(root).expanduser() if root is not None else None
    if root is not None and not root.is_dir() and not (download and not root.exists()):
        # a folder given is the only one searched: never fall back to another one silently
        raise FileNotFoundError(f"--data {root}: {'no such folder' if not root.exists() else 'not a folder'} "
                                f"(it names {name}'s own folder; leave --data out to use "
                                f"{data_root()})")
    loaders: dict[str, Callable[[], RawDataset]] = {
        "digits": load_digits,
        "fashion-mnist": lambda: load_fashion_mnist(root, download=download),
        "cifar10": lambda: load_cifar("cifar10", root, download=download),
        "cifar100": lambda: load_cifar("cifar100", root, download=download),
        "imagenet100": lambda: load_imagenet100(root, allow_subset=allow_subset),
        "icubworld1": lambda: load_icubworld1(root),
        "digits-video": lambda: _video(name, root, download),
        "digits-video-28": lambda: _video(name, root, download),
        "fashion-mnist-video": lambda: _video(name, root, download),
        "digits-instances": lambda: _instances(name, root, download),
        "fashion-mnist-instances": lambda: _instances(name, root, download),
        "stream51": lambda: load_stream51(root),
        "core50": lambda: load_core50(root),
        "core50-cat": lambda: load_core50(root, categories=True),
    }
    return loaders[name]()


def _locate(name: str) -> str | None:
    """Where a registered dataset's data are, by file existence only (cheap)."""
    root = data_root() / name
    if name in ("digits", "digits-video", "digits-video-28", "digits-instances"):
        return "scikit-learn"
    if name in ("fashion-mnist", "fashion-mnist-video", "fashion-mnist-instances"):
        found = _find_fashion(None)
        return str(found) if found else None
    if name in CIFAR:
        found = _find_cifar(name, None)
        return str(found) if found else None
    if name == "stream51":
        ok = (root / "Stream-51_meta_train.json").is_file()
        return str(root) if ok else None
    if name in ("core50", "core50-cat"):
        root = data_root() / "core50"
        return str(root) if (root / "LUP.pkl").is_file() else None
    sub = ("train", "val") if name == "imagenet100" else ("train", "test")
    return str(root) if all((root / s).is_dir() for s in sub) else None


def dataset_status() -> list[tuple[DatasetSpec, bool, str | None]]:
    """(spec, available, where) for every registered dataset, without loading anything."""
    return [(spec, (where := _locate(name)) is not None, where) for name, spec in DATASETS.items()]
