"""The readers of each dataset's files (digits, CIFAR, ImageNet-100, iCubWorld, ``features:PATH``)
into a ``RawDataset``, and the helpers they share; ``datasets.load_dataset`` picks one."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.checks import bad_feature
from ciosl.data.archive import load_npz
from ciosl.data.download import download_url, extract_tar, mirror_urls
from ciosl.data.safe_pickle import BadPickleError, safe_load
from ciosl.data.specs import DATASETS, FEATURES_PREFIX, _check_feature_file, data_root
from ciosl.data.types import ArrayImages, DatasetSpec, RawDataset
from ciosl.errors import echo

IMAGE_EXTENSIONS = {".jpeg", ".jpg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff"}
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
