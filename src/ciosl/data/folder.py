"""``folder:DIR``: a user's image folder as a dataset.

Layout: ``DIR/train/<class>/<images>`` and ``DIR/test/<class>/<images>``, or, optionally, one more
level ``<class>/<instance>/<frames>``: each instance is a temporally ordered video, its frames
in file-name order (natural: ``f2`` before ``f10``), which enables the instance orderings.
Classes are the class folders of train/, in natural name order (label k = k-th name); a test
class must also be a train class.

The rules (docs/datasets.md):

- **No train/ and test/**: ``DIR/<class>/...`` is split per class. The class's files are ordered
  by ``sha256("0/" + path relative to the class folder)`` and the first
  ``max(1, round(0.2 n))`` go to test (none when the class has a single file): seeded (seed 0),
  stable (a file's place depends on its own name only: adding a file moves at most one other
  across the split).
- **Images**: ``.png``, ``.jpg``, ``.jpeg``, ``.webp`` (any case), read with Pillow. Grey,
  16-bit grey, palette and CMYK images become RGB; an alpha channel is composited onto white.
- **Other files** (any other extension) are skipped; their number and the first one are logged.
- **Hidden** files and folders (name starting with ``.``) are skipped silently.
- **Links**: a link whose target lies inside DIR is followed (a folder reached twice is read
  once); a link that leaves DIR, or leads nowhere, is skipped, and the first one is logged.
- **Damaged files**: before any extraction every image is opened (format header) and its end
  checked (PNG's IEND chunk, WebP's RIFF size, JPEG's end-of-image marker; a JPEG without one is
  decoded in full to decide): a file that does not decode is named in one line
  (``FolderImages.verify``).
- **Cache key** (``RawDataset.fingerprint``): every image's path, size and modification time
  (ns), and the split rule: a changed, added or removed file gives another key.

Decoding runs in a pool of threads (Pillow releases the GIL) and reads ahead of the extractor
by a few batches: a million-image folder is never in memory at once, only its paths.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ciosl.data.types import RawDataset

logger = logging.getLogger(__name__)

FOLDER_PREFIX = "folder:"
FOLDER_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
TEST_FRACTION = 0.2
SPLIT_SEED = 0
READ_AHEAD = 4  # batches decoded ahead of the one asked for


def natural_key(s: str) -> tuple:
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t)
                 for t in re.split(r"(\d+)", s) if t)


class _Walk:
    """The entries of the folders under one root, with the rules on hidden files, other files
    and links; remembers what it skipped."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.others: list[str] = []
        self.outside: list[str] = []
        self.seen: set[str] = set()

    def _inside(self, entry: os.DirEntry) -> bool:
        if not entry.is_symlink():
            return True
        target = os.path.realpath(entry.path)
        if os.path.exists(target) and os.path.commonpath([target, str(self.root)]) == str(
                self.root):
            return True
        self.outside.append(entry.path)
        return False

    def listing(self, folder: Path) -> tuple[list[Path], list[Path]]:
        """(sub-folders, image files) of ``folder``, each in natural name order."""
        real = os.path.realpath(folder)
        if real in self.seen:
            return [], []
        self.seen.add(real)
        dirs, files = [], []
        with os.scandir(folder) as it:
            for e in it:
                if e.name.startswith(".") or not self._inside(e):
                    continue
                if e.is_dir():
                    if not (e.is_symlink() and os.path.realpath(e.path) in self.seen):
                        dirs.append(Path(e.path))  # a link back to a folder read: skipped
                elif e.is_file():
                    if os.path.splitext(e.name)[1].lower() in FOLDER_EXTENSIONS:
                        files.append(Path(e.path))
                    else:
                        self.others.append(e.path)
        key = lambda p: natural_key(p.name)  # noqa: E731
        return sorted(dirs, key=key), sorted(files, key=key)

    def report(self) -> None:
        if self.others:
            logger.warning("%s: skipped %d file(s) that are not .png/.jpg/.jpeg/.webp images "
                           "(first: %s)", self.root, len(self.others), min(self.others))
        if self.outside:
            logger.warning("%s: skipped %d link(s) leading outside the folder or nowhere "
                           "(first: %s)", self.root, len(self.outside), min(self.outside))


def _class_files(walk: _Walk, folder: Path) -> tuple[list[list[Path]], bool]:
    """A class folder's images as instances (lists of frames) and whether it had an instance
    level. Images directly in the class folder and instance folders beside them: refused."""
    dirs, files = walk.listing(folder)
    if dirs and files:
        raise ValueError(f"{folder}: holds both images ({files[0].name}) and folders "
                         f"({dirs[0].name}); a class folder holds images, or instance folders "
                         "of frames, not both")
    if files or not dirs:
        return [files], False
    instances = []
    for d in dirs:
        sub, frames = walk.listing(d)
        if sub:
            raise ValueError(f"{d}: an instance folder holds frames, not folders ({sub[0].name})")
        instances.append(frames)
    return instances, True


def _split_rank(rel: str) -> str:
    return hashlib.sha256(f"{SPLIT_SEED}/{rel}".encode()).hexdigest()


def _split(base: Path, instances: list[list[Path]]) -> tuple[list[list[Path]], list[Path]]:
    """One class's (train instances, test files) by the stated rule (module docstring)."""
    files = [f for inst in instances for f in inst]
    n_test = 0 if len(files) < 2 else max(1, round(TEST_FRACTION * len(files)))
    test = set(sorted(files, key=lambda f: _split_rank(f.relative_to(base).as_posix()))[:n_test])
    return [[f for f in inst if f not in test] for inst in instances], [f for f in files if f
                                                                         in test]


def layout(path: Path) -> tuple[bool, bool]:
    """(has train/ and test/, has an instance level), looking at one class folder only: cheap
    (``specs.get_spec``)."""
    split = (path / "train").is_dir() and (path / "test").is_dir()
    top = path / "train" if split else path
    walk = _Walk(path)
    classes, _ = walk.listing(top)
    for c in classes:
        dirs, files = walk.listing(c)
        if dirs or files:
            return split, bool(dirs) and not files
    return split, False


def check_folder(name: str, path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{name}: no such folder {path}")
    if not path.is_dir():
        raise ValueError(f"{name}: {path} is not a folder")


def load_folder(path: str | Path) -> RawDataset:
    """``DIR`` as a ``RawDataset`` of lazily decoded images (module docstring: layout, rules)."""
    path = Path(path).expanduser()
    name = f"{FOLDER_PREFIX}{path}"
    check_folder(name, path)
    walk = _Walk(path)
    split = (path / "train").is_dir() and (path / "test").is_dir()
    top = path / "train" if split else path
    class_dirs, loose = walk.listing(top)
    if not class_dirs:
        raise ValueError(f"{name}: no class folders in {top} (expected {top}/<class>/<images>)")
    if loose:
        raise ValueError(f"{name}: {loose[0]} lies beside the class folders; images go in "
                         f"{top}/<class>/")
    classes = [d.name for d in class_dirs]
    train: list[list[list[Path]]] = []  # per class, per instance, frames
    test: list[list[Path]] = []  # per class
    levels = set()
    for d in class_dirs:
        instances, level = _class_files(walk, d)
        levels.add(level)
        if split:
            train.append(instances)
            test.append([])
        else:
            tr, te = _split(d, instances)
            train.append(tr)
            test.append(te)
    if len(levels) > 1:
        raise ValueError(f"{name}: some class folders hold instance folders and others images; "
                         "use one layout for every class")
    if split:
        test_dirs, loose = walk.listing(path / "test")
        unknown = [d.name for d in test_dirs if d.name not in classes]
        if unknown:
            raise ValueError(f"{name}: test class {unknown[0]!r} has no train/ folder (train "
                             f"classes: {', '.join(classes[:10])})")
        for d in test_dirs:
            instances, _ = _class_files(walk, d)
            test[classes.index(d.name)] = [f for inst in instances for f in inst]
    walk.report()
    for k, c in enumerate(classes):
        if not any(train[k]):
            raise ValueError(f"{name}: class {c!r} has no training images "
                             f"({', '.join(FOLDER_EXTENSIONS)})")
    temporal = levels == {True}
    ptr, ytr, inst, frame, pte, yte = [], [], [], [], [], []
    n_inst = 0
    for k in range(len(classes)):
        for frames in train[k]:
            if not frames:
                continue
            ptr += frames
            ytr += [k] * len(frames)
            inst += [n_inst] * len(frames)
            frame += range(len(frames))
            n_inst += 1
        pte += test[k]
        yte += [k] * len(test[k])
    h = hashlib.sha256(f"folder|split {split} {SPLIT_SEED} {TEST_FRACTION}|".encode())
    for tag, files in (("train", ptr), ("test", pte)):
        for p in files:
            st = p.stat()
            h.update(f"{tag}|{p.relative_to(path).as_posix()}|{st.st_size}|"
                     f"{st.st_mtime_ns}\n".encode())
    h.update("|".join(classes).encode())
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return RawDataset(name, "images", FolderImages(ptr), i64(ytr), FolderImages(pte), i64(yte),
                      tuple(classes), h.hexdigest(),
                      train_instance=i64(inst) if temporal else None,
                      train_frame=i64(frame) if temporal else None,
                      meta={"path": str(path), "split": "folders" if split else
                            f"sha256 per class, {TEST_FRACTION:g} to test, seed {SPLIT_SEED}"})


# ---------------------------------------------------------------------------- decoding


def decode(path: str | Path) -> np.ndarray:
    """One image as uint8 RGB (H, W, 3): grey, 16-bit grey, palette and CMYK converted, alpha
    composited onto white. Raises ``ValueError`` naming the file when it does not decode."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):
                a = np.asarray(im, dtype=np.int64)
                a = (a >> 8) if im.mode.startswith("I;16") else np.clip(a, 0, 255)
                return np.repeat(a.astype(np.uint8)[..., None], 3, axis=2)
            if im.mode == "P" and "transparency" in im.info:
                im = im.convert("RGBA")
            if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
                rgba = im.convert("RGBA")
                white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                im = Image.alpha_composite(white, rgba)
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: does not decode as an image ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'damaged'})") from None


def _ends_well(path: str, fmt: str | None) -> bool | None:
    """Whether the file ends as its format says (True / False), None when that cannot be told
    from its last bytes (a JPEG with data after its end marker)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64))
        tail = f.read()
        if fmt == "PNG":
            return tail[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
        if fmt == "WEBP":
            f.seek(4)
            riff = int.from_bytes(f.read(4), "little")
            return riff + 8 == size or riff + 9 == size  # an odd chunk's pad byte
        if fmt == "JPEG":
            return True if tail.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9") else None
    return False


def check_image(path: str | Path) -> None:
    """Cheap check that ``path`` decodes: its header (format, size) and its end; a JPEG whose
    end cannot tell is decoded in full. Raises ``ValueError`` naming the file."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            fmt = im.format
            im.size  # noqa: B018
        if fmt not in ("PNG", "JPEG", "WEBP", "MPO"):
            raise ValueError(f"a {fmt} image, not PNG, JPEG or WebP")
        ok = _ends_well(str(path), "JPEG" if fmt == "MPO" else fmt)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: does not decode as an image ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'damaged'})") from None
    if ok is None:
        decode(path)
    elif not ok:
        raise ValueError(f"{path}: does not decode as an image (truncated: it does not end as "
                         f"a {fmt} file ends)")


_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The process's decoding pool (one thread per available core, at least 2)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from ciosl.data.runtime import available_cores

            _POOL = ThreadPoolExecutor(max(2, available_cores()), thread_name_prefix="decode")
        return _POOL


class FolderImages:
    """Image files decoded on demand in a pool of threads (``pool``), ``READ_AHEAD`` batches
    ahead of a reader that goes through them in order: ``get_batch`` returns a (b, H, W, 3)
    uint8 array when the batch's images share a size, else a list of (H, W, 3) arrays."""

    def __init__(self, paths: Sequence[Path | str]):
        self.paths = [str(p) for p in paths]
        self._ahead: dict[tuple[int, int], Future] = {}
        self._issued: set[int] = set()  # span starts submitted in this pass
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.paths)

    def verify(self) -> None:
        """Every file decodes (``check_image``), checked in the pool; the first one that does
        not (in file order) raises a ``ValueError`` naming it."""
        chunk = 256
        spans = range(0, len(self.paths), chunk)
        checks = pool().map(lambda s: [check_image(p) for p in self.paths[s:s + chunk]], spans)
        for _ in checks:
            pass

    def _submit(self, start: int, stop: int) -> Future:
        return pool().submit(lambda: [decode(p) for p in self.paths[start:stop]])

    def _decoded(self, start: int, stop: int) -> list[np.ndarray]:
        """The images of [start, stop), and the next ``READ_AHEAD`` spans of the same width
        submitted. Each span is decoded once per pass, also when several readers (the
        extraction's workers) ask for neighbouring spans out of order; a span asked for again
        starts a new pass."""
        with self._lock:
            fut = self._ahead.pop((start, stop), None)
            if fut is None:
                if start in self._issued:  # read before: a new pass over the images
                    for f in self._ahead.values():
                        f.cancel()
                    self._ahead.clear()
                    self._issued.clear()
                fut = self._submit(start, stop)
            self._issued.add(start)
            n, step = len(self.paths), stop - start
            for k in range(1, READ_AHEAD + 1):  # the next spans of the same width
                s = start + k * step
                if s >= n:
                    break
                if s not in self._issued:
                    self._issued.add(s)
                    self._ahead[(s, min(n, s + step))] = self._submit(s, min(n, s + step))
            behind = start - 2 * READ_AHEAD * step  # spans a reader skipped: dropped
            for span in [sp for sp in self._ahead if sp[0] < behind]:
                self._ahead.pop(span).cancel()
        return fut.result()

    def get_batch(self, idx: Sequence[int] | np.ndarray) -> np.ndarray | list[np.ndarray]:
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx))):
            images = self._decoded(int(idx[0]), int(idx[0]) + len(idx))
        else:
            images = list(pool().map(decode, [self.paths[i] for i in idx]))
        if images and len({im.shape for im in images}) == 1:
            return np.stack(images)
        return images
