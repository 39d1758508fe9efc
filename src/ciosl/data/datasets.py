"""The dataset registry and loaders.

``DATASETS`` holds each dataset's protocol (DESIGN.md's table); ``get_spec(name)`` also accepts
``features:PATH`` for a user's .npz of precomputed features. ``load_dataset(name)`` returns a
``RawDataset`` or raises ``FileNotFoundError`` telling how to get the data; it never downloads
unless ``download=True``. Data live under ``data_root()`` (``$CIOSL_DATA``, default
``~/.cache/ciosl/data``), one folder per dataset, or wherever ``root`` points.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.checks import bad_feature
from ciosl.data.archive import check_zip, load_npz
from ciosl.data.download import download_url, extract_tar, mirror_urls
from ciosl.data.instances import make_instance_dataset
from ciosl.data.safe_pickle import BadPickleError, safe_load
from ciosl.data.types import ArrayImages, DatasetSpec, RawDataset
from ciosl.data.video import make_video_dataset
from ciosl.errors import echo
from ciosl.fileio import kind_of

FEATURES_PREFIX = "features:"
IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff"}
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
CIFAR_MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
CIFAR = {  # name -> (archive, md5, folder, train files, test files, label key, names key)
    "cifar10": ("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
              "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)),
              ("test_batch",), b"labels", ("batches.meta", b"label_names")),
    "cifar100": ("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
               "cifar-100-python", ("train",), ("test",), b"fine_labels",
               ("meta", b"fine_label_names")),
}

# The paper's appendix, "List Of ImageNet-100 Classes", in its order (label k = IMAGENET100[k]).
IMAGENET100 = (
    "n01632777 n01667114 n01744401 n01753488 n01768244 n01770081 n01798484 n01829413 "
    "n01843065 n01871265 n01872401 n01981276 n02006656 n02012849 n02025239 n02085620 "
    "n02086079 n02089867 n02091831 n02094258 n02096294 n02100236 n02100877 n02102040 "
    "n02105251 n02106550 n02110627 n02120079 n02130308 n02168699 n02169497 n02177972 "
    "n02264363 n02417914 n02422699 n02437616 n02483708 n02488291 n02489166 n02494079 "
    "n02504013 n02667093 n02687172 n02788148 n02791124 n02794156 n02814860 n02859443 "
    "n02895154 n02910353 n03000247 n03208938 n03223299 n03271574 n03291819 n03347037 "
    "n03445777 n03529860 n03530642 n03602883 n03627232 n03649909 n03666591 n03761084 "
    "n03770439 n03773504 n03788195 n03825788 n03866082 n03877845 n03908618 n03916031 "
    "n03929855 n03954731 n04009552 n04019541 n04141327 n04147183 n04235860 n04285008 "
    "n04286575 n04328186 n04347754 n04355338 n04423845 n04442312 n04456115 n04485082 "
    "n04486054 n04505470 n04525038 n07248320 n07716906 n07730033 n07768694 n07836838 "
    "n07860988 n07871810 n11939491 n12267677"
).split()

_IID, _ALL = ("iid", "class_iid"), ("iid", "class_iid", "instance", "class_instance")
_WHERE = "$CIOSL_DATA (default ~/.cache/ciosl/data)"
_FROM_FASHION = ("generated from fashion-mnist: make fashion-mnist available (apt-get install "
                 f"dataset-fashion-mnist, or the 4 IDX files in {_WHERE}/fashion-mnist)")


# DatasetSpec(name, description, base_fraction, classes_per_step, buffer, orderings,
#             default_extractor, offline_epochs, offline_batch_size, how_to_get,
#             base_epochs, base_batch_size)
# Base init trains like the dataset's offline learner: the paper's Table 5 lists one "offline"
# batch size and epoch count per dataset as the training parameters of CIOSL and the offline
# model, and base init is CIOSL's offline training. The stand-ins take the recipe of the
# dataset they stand in for (fashion-mnist: CIFAR-10's; the video datasets: iCubWorld's).
DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec(
        "digits", "scikit-learn 8x8 handwritten digits, 10 classes (1437 train / 360 test)",
        0.10, 2, 100, _IID, "pixels", 30, 16,
        "ships with scikit-learn: always available", base_epochs=30, base_batch_size=16),
    # Offline reference: 50 epochs (as CIFAR) x 5 testing events x 10 runs is too slow on 2
    # cores: 10 epochs. Base init (once per run) keeps CIFAR-10's 50 epochs of 128.
    DatasetSpec(
        "fashion-mnist", "Fashion-MNIST, 28x28 grey clothes, 10 classes (60000 / 10000)",
        0.02, 2, 1000, _IID, "pixels", 10, 128,
        "apt-get install dataset-fashion-mnist, or put the 4 IDX files in "
        f"{_WHERE}/fashion-mnist, or run `ciosl features --dataset fashion-mnist --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "cifar10", "CIFAR-10, 32x32 colour, 10 classes (50000 / 10000)",
        0.02, 2, 1000, _IID, "mobilenet_v2", 50, 128,
        "get cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) and "
        f"unpack it in {_WHERE}/cifar10, or run `ciosl features --dataset cifar10 --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "cifar100", "CIFAR-100, 32x32 colour, 100 fine classes (50000 / 10000)",
        0.10, 10, 1000, _IID, "mobilenet_v2", 50, 128,
        "get cifar-100-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) and "
        f"unpack it in {_WHERE}/cifar100, or run `ciosl features --dataset cifar100 --download`",
        base_epochs=50, base_batch_size=128),
    DatasetSpec(
        "imagenet100", "ImageNet-100: the paper's 100 ILSVRC-2012 classes (val as test)",
        0.10, 10, 1000, _IID, "mobilenet_v2", 100, 256,
        "put ILSVRC-2012 train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (val sorted into wnid "
        f"folders) in {_WHERE}/imagenet100; only the paper's 100 wnids are used",
        base_epochs=100, base_batch_size=256),
    DatasetSpec(
        "icubworld1", "iCubWorld 1.0: 10 classes x 3 object instances, video frames",
        0.10, 2, 180, _ALL, "mobilenet_v2", 30, 16,
        "get iCubWorld 1.0 (https://robotology.github.io/iCubWorld/) and arrange it as "
        f"{_WHERE}/icubworld1/{{train,test}}/<class>/<instance>/<frames>",
        base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "digits-video", "object streams from digits: 10 classes x 3 instances x 200/67 "
        "frames of smooth rotation/scale/shift/brightness (16x16)",
        0.10, 2, 180, _ALL, "pixels", 30, 16, "generated from digits: always available",
        base_epochs=30, base_batch_size=16),
    # the same streams at Fashion-MNIST's size (784 pixels): a development stream whose input
    # width, priors (fan_in) and border pixels are those of the report streams
    DatasetSpec(
        "digits-video-28", "object streams from digits at 28x28: 10 classes x 3 instances x "
        "200/67 frames of smooth rotation/scale/shift/brightness",
        0.10, 2, 180, _ALL, "pixels", 30, 16, "generated from digits: always available",
        base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "fashion-mnist-video", "object streams from Fashion-MNIST: 10 classes x 3 instances "
        "x 200/67 frames of smooth rotation/scale/shift/brightness (28x28)",
        0.10, 2, 180, _ALL, "pixels", 30, 16,
        _FROM_FASHION,
        base_epochs=30, base_batch_size=16),
    # real images as object instances (data/instances.py): k-means clusters of each class, a
    # nearest-neighbour walk through each cluster's core, the dataset's own test split; the
    # temporal streams for pretrained features (the -video ones saturate there)
    DatasetSpec(
        "digits-instances", "object-instance streams of real digits: 10 classes x 3 k-means "
        "instances x <= 40 frames in nearest-neighbour order; digits' test split",
        0.10, 2, 34, _ALL, "efficientnet_lite0", 30, 16,  # buffer: iCubWorld's 180 / 6000 frames
        "generated from digits: always available", base_epochs=30, base_batch_size=16),
    DatasetSpec(
        "fashion-mnist-instances", "object-instance streams of real Fashion-MNIST images: 10 "
        "classes x 3 k-means instances x 200 frames in nearest-neighbour order; the 10k test split",
        0.10, 2, 180, _ALL, "efficientnet_lite0", 30, 16,
        _FROM_FASHION,
        base_epochs=30, base_batch_size=16),
)}


def data_root() -> Path:
    """Where datasets live: ``$CIOSL_DATA`` if set, else ``~/.cache/ciosl/data``."""
    env = os.environ.get("CIOSL_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ciosl" / "data"


def _check_feature_file(name: str, path: Path) -> None:
    """A ``features:PATH`` that is missing, or is a folder, a FIFO or a device: one line
    saying which (never a read that blocks)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        raise FileNotFoundError(f"{name}: no such feature file {path}") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{name}: {path} is not a regular file ({kind_of(mode)})")


def get_spec(name: str) -> DatasetSpec:
    """The protocol of a registered dataset or of a ``features:PATH`` file."""
    if name.startswith(FEATURES_PREFIX):
        path = Path(name[len(FEATURES_PREFIX):]).expanduser()
        _check_feature_file(name, path)
        names = {m.filename for m in check_zip(path, "features .npz", verify=False)}
        temporal = {"train_instance.npy", "train_frame.npy"} <= names
        return DatasetSpec(name, f"precomputed features from {path}", 0.10, 2, 1000,
                         _ALL if temporal else _IID, "none", 50, 128,
                         "a .npz with train_z, train_y, test_z, test_y",
                         base_epochs=50, base_batch_size=128)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {echo(name)}; valid choices: "
                         f"{', '.join(DATASETS)}, {FEATURES_PREFIX}PATH")
    return DATASETS[name]


# ---------------------------------------------------------------- helpers


def _fingerprint(name: str, arrays: Iterable[np.ndarray]) -> str:
    h = hashlib.sha256(name.encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.data)
    return h.hexdigest()


def _folder_fingerprint(name: str, base: Path, files: Sequence[Path]) -> str:
    h = hashlib.sha256(name.encode())
    for p in sorted(files):
        st = p.stat()
        h.update(f"|{p.relative_to(base).as_posix()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _natural_key(s: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _subdirs(path: Path) -> list[Path]:
    return sorted((p for p in path.iterdir() if p.is_dir()), key=lambda p: _natural_key(p.name))


def _images_in(path: Path) -> list[Path]:
    files = (p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    return sorted(files, key=lambda p: _natural_key(p.name))


def _missing(
    spec: DatasetSpec, looked: Iterable[Path | None], detail: str = ""
) -> FileNotFoundError:
    places = ", ".join(str(p) for p in looked if p is not None)
    return FileNotFoundError(f"{spec.name}: data not found{detail} (looked in: {places}). "
                           f"To get it: {spec.how_to_get}")


class FileImages:
    """Images on disk, opened with PIL on demand; ``get_batch`` returns a list of arrays."""

    def __init__(self, paths: Sequence[Path], mode: str = "RGB"):
        self.paths = list(paths)
        self.mode = mode

    def __len__(self) -> int:
        return len(self.paths)

    def get_batch(self, idx: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        from PIL import Image

        out = []
        for i in np.asarray(idx, dtype=np.int64):
          with Image.open(self.paths[i]) as im:
              out.append(np.asarray(im.convert(self.mode), dtype=np.uint8))
        return out


# ---------------------------------------------------------------- digits


def load_digits() -> RawDataset:
    """scikit-learn's digits, 0..16 scaled to uint8, stratified 80/20 split (seed 0)."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    d = sk_digits()
    images = np.rint(d.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8)
    labels = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(images, labels, test_size=0.2, random_state=0,
                                        stratify=labels)
    return RawDataset("digits", "images", ArrayImages(xtr), ytr, ArrayImages(xte), yte,
                    tuple(str(k) for k in range(10)), _fingerprint("digits", (xtr, ytr, xte, yte)))


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


# ---------------------------------------------------------------- CIFAR-10 / CIFAR-100


def _cifar_dirs(name: str, root: Path | None) -> list[Path]:
    folder = CIFAR[name][2]
    bases = [root] if root is not None else [data_root() / name]  # root only, when given
    return [p for b in bases for p in (b / folder, b)]


def _find_cifar(name: str, root: Path | None) -> Path | None:
    _, _, _, train, test, _, (meta, _) = CIFAR[name]
    for d in _cifar_dirs(name, root):
        if all((d / f).is_file() for f in (*train, *test, meta)):
          return d
    return None


def check_cifar_batch(path: Path, data: Any, labels: Any,
                      n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A batch's images (n, 3072) of bytes and its n labels in [0, n_classes), or a
    ValueError naming the file and what is off."""
    x, y = np.asarray(data), np.asarray(labels)
    if x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or x.dtype.kind not in "ui":
        raise ValueError(f"{path}: images must be rows of 3072 bytes, got {x.dtype} {x.shape}")
    if x.size and (x.min() < 0 or x.max() > 255):
        raise ValueError(f"{path}: pixel values outside 0..255")
    if y.ndim != 1 or y.dtype.kind not in "ui" or len(y) != len(x):
        raise ValueError(f"{path}: {len(x)} images but labels of shape {y.shape} ({y.dtype}): "
                         "one integer label per image expected")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"{path}: labels must be in 0..{n_classes - 1}, found "
                         f"{int(y.min())}..{int(y.max())}")
    return x.astype(np.uint8), y.astype(np.int64)


def read_batch(path: Path) -> Any:
    """A CIFAR pickle through the safe unpickler; any failure names the file."""
    try:
        return safe_load(path)
    except OSError:
        raise
    except Exception as e:  # refused global, truncation (EOFError), garbage: one clear error
        raise BadPickleError(f"{path}: not a readable CIFAR pickle ({type(e).__name__}: "
                             f"{e})") from None


def load_cifar(name: str, root: str | Path | None = None, *, download: bool = False) -> RawDataset:
    """CIFAR-10/100 from the official python-pickle batches (read with the safe unpickler)."""
    spec = DATASETS[name]
    archive, md5, _, train, test, label_key, (meta, names_key) = CIFAR[name]
    root = Path(root) if root is not None else None
    folder = _find_cifar(name, root)
    if folder is None and download:
        base = root or data_root() / name
        path = download_url(mirror_urls(archive, CIFAR_MIRRORS), base / archive, md5)
        extract_tar(path, base)
        folder = _find_cifar(name, root)
    if folder is None:
        raise _missing(spec, _cifar_dirs(name, root))

    def read(files: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for f in files:
          d = read_batch(folder / f)
          if not isinstance(d, dict) or b"data" not in d or label_key not in d:
              raise ValueError(f"{folder / f}: not a {name} batch (keys b'data', {label_key!r})")
          x, y = check_cifar_batch(folder / f, d[b"data"], d[label_key], n_classes)
          xs.append(x.reshape(-1, 3, 32, 32))
          ys.append(y)
        return np.concatenate(xs).transpose(0, 2, 3, 1).copy(), np.concatenate(ys)  # NHWC

    n_classes = 100 if name == "cifar100" else 10
    (xtr, ytr), (xte, yte) = read(train), read(test)
    meta_d = read_batch(folder / meta)
    raw_names = meta_d.get(names_key) if isinstance(meta_d, dict) else None
    if not isinstance(raw_names, list | tuple) or len(raw_names) != n_classes:
        raise ValueError(f"{folder / meta}: expected {n_classes} class names under "
                         f"{names_key!r}, got {len(raw_names) if raw_names is not None else 'none'}")
    names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in raw_names)
    return RawDataset(name, "images", ArrayImages(xtr), ytr, ArrayImages(xte), yte, names,
                    _fingerprint(name, (xtr, ytr, xte, yte)), meta={"path": str(folder)})


# ---------------------------------------------------------------- ImageNet-100


def load_imagenet100(root: str | Path | None = None, *, allow_subset: bool = False) -> RawDataset:
    """ImageNet-100 from ``root/{train,val}/<wnid>/*.JPEG``; lazy (PIL, RGB, varying sizes).

    All 100 wnids are required unless ``allow_subset`` (then: the listed wnids present in
    both train and val, in the paper's order).
    """
    spec = DATASETS["imagenet100"]
    base = Path(root) if root is not None else data_root() / "imagenet100"
    if not ((base / "train").is_dir() and (base / "val").is_dir()):
        raise _missing(spec, [base], " (no train/ and val/ folders)")
    present = [w for w in IMAGENET100 if (base / "train" / w).is_dir()
             and (base / "val" / w).is_dir()]
    missing = [w for w in IMAGENET100 if w not in present]
    if not present or (missing and not allow_subset):
        raise _missing(spec, [base], f": {len(missing)} of the 100 ImageNet-100 classes have no "
                     f"train/ and val/ folder (first missing: {', '.join(missing[:5])})")
    split = {}
    for s in ("train", "val"):
        paths, labels = [], []
        for k, w in enumerate(present):
          files = _images_in(base / s / w)
          paths += files
          labels += [k] * len(files)
        split[s] = (paths, np.asarray(labels, dtype=np.int64))
    (ptr, ytr), (pte, yte) = split["train"], split["val"]
    return RawDataset("imagenet100", "images", FileImages(ptr), ytr, FileImages(pte), yte,
                    tuple(present), _folder_fingerprint("imagenet100", base, ptr + pte),
                    meta={"path": str(base), "missing_wnids": tuple(missing)})


# ---------------------------------------------------------------- iCubWorld 1.0


def load_icubworld1(root: str | Path | None = None) -> RawDataset:
    """iCubWorld 1.0 from ``root/train/<class>/<instance>/<frames>`` and ``root/test/<class>/
    [<instance>/]<frames>``; frames in natural (numeric) order; lazy like ImageNet-100."""
    spec = DATASETS["icubworld1"]
    base = Path(root) if root is not None else data_root() / "icubworld1"
    if not ((base / "train").is_dir() and (base / "test").is_dir()):
        raise _missing(spec, [base], " (no train/ and test/ folders)")
    classes = [d.name for d in _subdirs(base / "train")]
    if not classes or [d.name for d in _subdirs(base / "test")] != classes:
        raise ValueError(f"{base}: train/ and test/ must hold the same, non-empty set of class "
                       f"folders (train: {classes})")
    ptr, ytr, inst, frame, pte, yte = [], [], [], [], [], []
    n_inst = 0
    for k, c in enumerate(classes):
        for d in _subdirs(base / "train" / c):
          files = _images_in(d)
          ptr += files
          ytr += [k] * len(files)
          inst += [n_inst] * len(files)
          frame += range(len(files))
          n_inst += 1
        test_dirs = [base / "test" / c, *_subdirs(base / "test" / c)]
        files = [f for d in test_dirs for f in _images_in(d)]
        pte += files
        yte += [k] * len(files)
    if not ptr or not pte:
        raise ValueError(f"{base}: no image frames found ({sorted(IMAGE_EXTENSIONS)})")
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return RawDataset("icubworld1", "images", FileImages(ptr), i64(ytr), FileImages(pte),
                    i64(yte), tuple(classes), _folder_fingerprint("icubworld1", base, ptr + pte),
                    train_instance=i64(inst), train_frame=i64(frame), meta={"path": str(base)})


# ---------------------------------------------------------------- features:PATH


def load_features(path: str | Path) -> RawDataset:
    """A user's .npz: train_z, train_y, test_z, test_y [, train_instance, train_frame,
    class_names]. Labels are remapped to 0..K-1 (sorted) when they are not already."""
    path = Path(path).expanduser()
    name = f"{FEATURES_PREFIX}{path}"
    _check_feature_file(name, path)

    def bad(msg: str) -> ValueError:
        return ValueError(f"{path}: {msg}")

    d = load_npz(path, "features .npz")  # one clear error for any damaged file
    missing = [k for k in ("train_z", "train_y", "test_z", "test_y") if k not in d]
    if missing:
        raise bad(f"missing array(s) {missing}; found {sorted(d)}")
    if ("train_instance" in d) != ("train_frame" in d):
        raise bad("train_instance and train_frame must be given together")
    z = {}
    for s in ("train", "test"):
        x, y = d[f"{s}_z"], d[f"{s}_y"]
        if x.ndim != 2 or x.dtype.kind not in "biuf":
          raise bad(f"{s}_z must be a real 2-D array (n, d); got {x.dtype} {x.shape}")
        if y.ndim != 1 or y.dtype.kind not in "iu":
          raise bad(f"{s}_y must be a 1-D integer array; got {y.dtype} {y.shape}")
        if len(x) != len(y):
          raise bad(f"{s}_z has {len(x)} rows but {s}_y has {len(y)} labels")
        if len(x) == 0:
            raise bad(f"no {'training' if s == 'train' else 'test'} samples ({s}_z is empty)")
        if x.shape[1] == 0:
            raise bad(f"{s}_z has 0 features per sample (shape {x.shape}); a sample needs at "
                      "least one")
        found = bad_feature(x)  # before float32 turns 1e39 into inf
        if found is not None:
            raise bad(f"{s}_z row {found[0]} {found[1]}")
        z[s] = x.astype(np.float32)
    if z["train"].shape[1] != z["test"].shape[1]:
        raise bad(f"train_z has {z['train'].shape[1]} features, test_z {z['test'].shape[1]}")
    extra = {}
    for k in ("train_instance", "train_frame"):
        if k in d:
          v = d[k]
          if v.shape != d["train_y"].shape or v.dtype.kind not in "iu":
              raise bad(f"{k} must be integers, one per training sample; got {v.dtype} {v.shape}")
          extra[k] = v.astype(np.int64)
    classes = np.unique(d["train_y"])
    if not np.isin(d["test_y"], classes).all():
        raise bad("test_y has labels that never occur in train_y")
    ytr, yte = np.searchsorted(classes, d["train_y"]), np.searchsorted(classes, d["test_y"])
    if "class_names" in d:
        names = _class_names(np.asarray(d["class_names"]).ravel(), bad)
        if len(names) == len(classes):
          pass  # one name per class present, in sorted label order
        elif classes.min() >= 0 and classes.max() < len(names):
          names = [names[c] for c in classes]  # names indexed by the original labels
        else:
          raise bad(f"{len(names)} class_names for {len(classes)} classes "
                    f"(labels {classes.min()}..{classes.max()})")
    else:
        names = [str(c) for c in classes]
    arrays = (z["train"], ytr, z["test"], yte, *extra.values())
    return RawDataset(name, "features", z["train"], ytr.astype(np.int64), z["test"],
                    yte.astype(np.int64), tuple(names), _fingerprint("features", arrays),
                    meta={"path": str(path), "original_labels": classes}, **extra)


def _class_names(names: np.ndarray, bad: Callable[[str], ValueError]) -> list[str]:
    """Class names as text: byte strings (``np.array([b"cat"])``, dtype ``S``) decoded as
    UTF-8, never recorded as ``"b'cat'"``; bytes that are no UTF-8 are refused, naming the
    entry."""
    if names.dtype.kind != "S":
        return [str(n) for n in names]
    out = []
    for i, n in enumerate(names.tolist()):
        try:
            out.append(n.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise bad(f"class_names[{i}] = {echo(n)} is not UTF-8 text (byte {e.start}); give "
                      "the names as text (a str array) or as UTF-8 bytes") from None
    return out


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
    """Load a dataset by name (or ``features:PATH``); never downloads unless ``download``.

    ``root`` points at the dataset's own folder (default ``data_root()/name``; for
    fashion-mnist-video the fashion-mnist folder). ``allow_subset`` only concerns imagenet100.
    """
    get_spec(name)  # validates the name
    if name.startswith(FEATURES_PREFIX):
        return load_features(name[len(FEATURES_PREFIX):])
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
    sub = ("train", "val") if name == "imagenet100" else ("train", "test")
    return str(root) if all((root / s).is_dir() for s in sub) else None


def dataset_status() -> list[tuple[DatasetSpec, bool, str | None]]:
    """(spec, available, where) for every registered dataset, without loading anything."""
    return [(spec, (where := _locate(name)) is not None, where) for name, spec in DATASETS.items()]
