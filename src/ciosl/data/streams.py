"""The field's streaming benchmarks, read from their official files: Stream-51 and CORe50.

Neither can be downloaded here (both sit behind their authors' links); each loader reads the
files as their authors publish them, checks them, and says in one line what is wrong. The
tests build small copies in the same format (tests/data/test_streams.py).

**Stream-51** (Roady et al. 2020; ``root`` holds the two metadata files and the frames):

- ``Stream-51_meta_train.json``: a list of ``[class_id, clip_num, video_num, frame_num, bbox,
  file_loc]``, ``Stream-51_meta_test.json`` a list of ``[class_id, bbox, file_loc]``;
  ``file_loc`` is relative to ``root``.
- ``bbox`` is ``[x_max, x_min, y_max, y_min]`` in pixels (the reference code's order: its width
  is ``bbox[0] - bbox[1]``). Each frame is cropped to that box grown 1.1x about its centre and
  clipped to the image (``stream51_box``: the reference's integer rounding).
- A video starts at an entry whose ``frame_num`` is 0 (the reference's rule), or where the class
  changes; its frames keep the file's order. Videos are ciosl's object instances: the instance
  and class-instance orderings play them in temporal order; Stream-51's instance ordering plays
  each video whole (``DatasetSpec.chunk = None``).
- Test entries whose ``class_id`` is the number of training classes (51) are Stream-51's novel
  images: they keep that label (class name ``novel``), are never scored for accuracy (no
  training sample has it) and are novel at every event of the open-set protocol.

**CORe50** (Lomonaco & Maltoni 2017; ``root`` holds ``paths.pkl``, ``labels.pkl``,
``LUP.pkl`` and the 128x128 frames ``s<session>/o<object>/C_<ss>_<oo>_<fff>.png``, or those in
``root/core50_128x128``):

Its files, test sessions, labels and official orderings: docs/design.md, "Module notes".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.data.loaders import _folder_fingerprint, _missing
from ciosl.data.orderings import Ordering, _pick_events
from ciosl.data.safe_pickle import safe_load
from ciosl.data.specs import DATASETS, data_root
from ciosl.data.types import RawDataset

STREAM51_TRAIN = "Stream-51_meta_train.json"
STREAM51_TEST = "Stream-51_meta_test.json"
STREAM51_RATIO = 1.1  # the reference code's bbox expansion

CORE50_TEST_SESSIONS = (3, 7, 10)
CORE50_SCENARIOS = ("ni", "nc", "nic")
CORE50_FILE = re.compile(r"C_(\d\d)_(\d\d)_(\d\d\d)\.png$")


# ---------------------------------------------------------------- Stream-51


def stream51_box(bbox: Sequence[float], width: int, height: int,
                 ratio: float = STREAM51_RATIO) -> tuple[int, int, int, int]:
    """PIL's (left, top, right, bottom) crop of a Stream-51 ``bbox = [x_max, x_min, y_max,
    y_min]`` grown ``ratio`` times about its centre and clipped to the image, with the
    reference code's integer rounding (``int``, towards zero)."""
    x_max, x_min, y_max, y_min = (float(v) for v in bbox)
    cw, ch = x_max - x_min, y_max - y_min
    cx, cy = int(x_min + cw / 2), int(y_min + ch / 2)
    return (max(int(cx - cw * ratio / 2), 0), max(int(cy - ch * ratio / 2), 0),
            min(int(cx + cw * ratio / 2), width), min(int(cy + ch * ratio / 2), height))


class CroppedImages:
    """Frames on disk, each cropped to its Stream-51 box (``stream51_box``) when read, as RGB;
    ``get_batch`` returns a list of arrays (the crops differ in size)."""

    def __init__(self, paths: Sequence[Path], boxes: np.ndarray, ratio: float = STREAM51_RATIO):
        self.paths, self.boxes, self.ratio = list(paths), np.asarray(boxes, np.float64), ratio

    def __len__(self) -> int:
        return len(self.paths)

    def get_batch(self, idx: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        from PIL import Image

        out = []
        for i in np.asarray(idx, dtype=np.int64):
            with Image.open(self.paths[i]) as im:
                im = im.convert("RGB")
                box = stream51_box(self.boxes[i], *im.size, ratio=self.ratio)
                if box[2] <= box[0] or box[3] <= box[1]:
                    raise ValueError(f"{self.paths[i]}: its bounding box {self.boxes[i].tolist()} "
                                     f"crops nothing from a {im.size[0]}x{im.size[1]} image "
                                     "(Stream-51's order is [x_max, x_min, y_max, y_min])")
                out.append(np.array(im.crop(box), dtype=np.uint8))  # writable
        return out


def _read_json(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not readable Stream-51 metadata ({type(e).__name__}: {e})"
                         ) from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON list of frame entries")
    return data


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _entry(path: Path, i: int, e: Any, n: int) -> tuple[int, list[float], str, list]:
    """(class_id, bbox, file_loc, the entry) of entry ``i`` (``n`` fields), or one line naming
    it."""
    what = ("[class_id, clip_num, video_num, frame_num, bbox, file_loc]" if n == 6
            else "[class_id, bbox, file_loc]")
    if not (isinstance(e, list) and len(e) == n and _is_int(e[0]) and e[0] >= 0
            and isinstance(e[-1], str) and isinstance(e[-2], list) and len(e[-2]) == 4
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in e[-2])
            and all(_is_int(v) for v in e[1:n - 2])):
        raise ValueError(f"{path}: entry {i} is {json.dumps(e)[:80]}, expected {what}")
    x_max, x_min, y_max, y_min = e[-2]
    if not (x_max > x_min and y_max > y_min):
        raise ValueError(f"{path}: entry {i} ({e[-1]}) has bbox {e[-2]}: not [x_max, x_min, "
                         "y_max, y_min] with x_max > x_min and y_max > y_min")
    return e[0], [float(v) for v in e[-2]], e[-1], e


def _frame_path(root: Path, loc: str, where: str) -> Path:
    p = (root / loc)
    if Path(loc).is_absolute() or ".." in Path(loc).parts:
        raise ValueError(f"{where}: file_loc {loc!r} leaves the dataset folder {root}")
    return p


def load_stream51(root: str | Path | None = None) -> RawDataset:
    """Stream-51 from ``root`` (default ``data_root()/stream51``); see the module docstring."""
    spec = DATASETS["stream51"]
    base = Path(root) if root is not None else data_root() / "stream51"
    if not ((base / STREAM51_TRAIN).is_file() and (base / STREAM51_TEST).is_file()):
        raise _missing(spec, [base], f" (no {STREAM51_TRAIN} and {STREAM51_TEST})")
    train = [_entry(base / STREAM51_TRAIN, i, e, 6)
             for i, e in enumerate(_read_json(base / STREAM51_TRAIN))]
    test = [_entry(base / STREAM51_TEST, i, e, 3)
            for i, e in enumerate(_read_json(base / STREAM51_TEST))]
    ytr = np.array([c for c, *_ in train], np.int64)
    classes = np.unique(ytr)
    K = len(classes)
    if not np.array_equal(classes, np.arange(K)):
        raise ValueError(f"{base / STREAM51_TRAIN}: class ids must be 0..{K - 1}, found "
                         f"{classes.tolist()[:10]}...")
    yte = np.array([c for c, *_ in test], np.int64)
    if (yte > K).any():
        bad = int(np.flatnonzero(yte > K)[0])
        raise ValueError(f"{base / STREAM51_TEST}: entry {bad} has class_id {int(yte[bad])}; "
                         f"the training classes are 0..{K - 1}, and {K} marks a novel image")
    inst, frame = np.empty(len(train), np.int64), np.empty(len(train), np.int64)
    v, f = -1, 0
    for i, (c, _, _, e) in enumerate(train):
        if e[3] == 0 or i == 0 or c != train[i - 1][0]:  # a new video
            v, f = v + 1, 0
        inst[i], frame[i] = v, f
        f += 1
    ptr = [_frame_path(base, loc, f"{base / STREAM51_TRAIN} entry {i}")
           for i, (_, _, loc, _) in enumerate(train)]
    pte = [_frame_path(base, loc, f"{base / STREAM51_TEST} entry {i}")
           for i, (_, _, loc, _) in enumerate(test)]
    missing = [p for p in ptr + pte if not p.is_file()]
    if missing:
        raise _missing(spec, [base], f": {len(missing)} of the {len(ptr) + len(pte)} frames "
                       f"the metadata lists are absent (first: {missing[0]})")
    names = tuple(str(k) for k in range(K)) + (("novel",) if (yte == K).any() else ())
    return RawDataset(
        "stream51", "images", CroppedImages(ptr, [b for _, b, _, _ in train]), ytr,
        CroppedImages(pte, [b for _, b, _, _ in test]), yte, names,
        _folder_fingerprint("stream51", base, [base / STREAM51_TRAIN, base / STREAM51_TEST,
                                               *ptr, *pte]),
        train_instance=inst, train_frame=frame,
        meta={"path": str(base), "n_novel_test": int((yte == K).sum()), "ratio": STREAM51_RATIO})


# ---------------------------------------------------------------- CORe50


def _core50_pickle(path: Path) -> Any:
    try:  # Python 2 pickles: str as latin-1 text; the restricted unpickler
        return safe_load(path, encoding="latin1")
    except OSError:
        raise
    except Exception as e:
        raise ValueError(f"{path}: not a readable CORe50 pickle ({type(e).__name__}: {e})"
                         ) from None


def _core50_files(base: Path) -> tuple[Path, Path]:
    """(the folder of the pickles, the folder the paths are relative to)."""
    for frames in (base, base / "core50_128x128"):
        if (base / "paths.pkl").is_file() and (frames / "s1").is_dir():
            return base, frames
    return base, base


def _core50_table(path: Path, table: Any, scenario: str) -> list:
    runs = table.get(scenario) if isinstance(table, dict) else None
    if not (isinstance(runs, list | tuple) and runs
            and all(isinstance(r, list | tuple) and len(r) >= 2 for r in runs)):
        raise ValueError(f"{path}: no scenario {scenario!r} of runs of batches (the last one "
                         "the test set)")
    return runs


def _core50_paths(base: Path) -> tuple[list[str], np.ndarray]:
    """paths.pkl as text, and (session, object, frame) of each from its file name."""
    raw = _core50_pickle(base / "paths.pkl")
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"{base / 'paths.pkl'}: expected a list of frame paths")
    paths = [p.decode() if isinstance(p, bytes) else p for p in raw]
    sof = np.empty((len(paths), 3), np.int64)
    for i, p in enumerate(paths):
        m = CORE50_FILE.search(str(p))
        parts = Path(str(p)).parts
        if m is None or len(parts) < 3:
            raise ValueError(f"{base / 'paths.pkl'}: entry {i} {str(p)[:60]!r} is not "
                             "s<session>/o<object>/C_<ss>_<oo>_<fff>.png")
        s, o, f = (int(g) for g in m.groups())
        if parts[-3] != f"s{s}" or parts[-2] != f"o{o}":
            raise ValueError(f"{base / 'paths.pkl'}: entry {i} {p!r}: its folders say "
                             f"{parts[-3]}/{parts[-2]}, its name session {s} object {o}")
        sof[i] = s, o, f
    return paths, sof


def _ints(path: Path, v: Any, what: str) -> np.ndarray:
    a = np.asarray(v)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError(f"{path}: {what} is not a list of integers")
    return a.astype(np.int64)


def load_core50(root: str | Path | None = None, *, categories: bool = False) -> RawDataset:
    """CORe50 from ``root`` (default ``data_root()/core50``); see the module docstring.
    ``categories``: the 10 categories as the classes (``core50-cat``) instead of 50 objects."""
    name = "core50-cat" if categories else "core50"
    spec = DATASETS[name]
    base = Path(root) if root is not None else data_root() / "core50"
    if not all((base / f).is_file() for f in ("paths.pkl", "labels.pkl", "LUP.pkl")):
        raise _missing(spec, [base], " (no paths.pkl, labels.pkl and LUP.pkl)")
    base, frames = _core50_files(base)
    paths, sof = _core50_paths(base)
    lup = _core50_table(base / "LUP.pkl", _core50_pickle(base / "LUP.pkl"), "ni")
    labels = _core50_table(base / "labels.pkl", _core50_pickle(base / "labels.pkl"), "ni")
    test = _ints(base / "LUP.pkl", lup[0][-1], "the test batch of run 0")
    if not test.size or test.min() < 0 or test.max() >= len(paths):
        raise ValueError(f"{base / 'LUP.pkl'}: the test batch indexes frames outside the "
                         f"{len(paths)} of paths.pkl")
    sessions = sorted({int(s) for s in sof[test, 0]})
    if sessions != list(CORE50_TEST_SESSIONS):
        raise ValueError(f"{base / 'LUP.pkl'}: the test batch (the last of each run) holds "
                         f"sessions {sessions}; CORe50's test set is sessions "
                         f"{list(CORE50_TEST_SESSIONS)}")
    ytest = _ints(base / "labels.pkl", labels[0][-1], "the test labels of run 0")
    obj = sof[:, 1] - 1  # objects 1..50 -> labels 0..49
    if len(ytest) != len(test) or not np.array_equal(ytest, obj[test]):
        raise ValueError(f"{base / 'labels.pkl'}: the test labels of run 0 are not the objects "
                         "their file names say (labels.pkl and LUP.pkl must list the same "
                         "frames)")
    is_test = np.isin(sof[:, 0], CORE50_TEST_SESSIONS)
    tr = np.flatnonzero(~is_test)  # the training sessions, in paths.pkl's order
    te = test
    y = obj // 5 if categories else obj
    n_classes = 10 if categories else 50
    if y.min() < 0 or y.max() >= n_classes:
        raise ValueError(f"{base / 'paths.pkl'}: objects outside 1..50")
    inst = (sof[tr, 1] - 1) * 100 + sof[tr, 0]  # an object in one session: one video
    ptr = [frames / paths[i] for i in tr]
    pte = [frames / paths[i] for i in te]
    missing = [p for p in ptr + pte if not p.is_file()]
    if missing:
        raise _missing(spec, [frames], f": {len(missing)} of the {len(ptr) + len(pte)} frames "
                       f"paths.pkl lists are absent (first: {missing[0]})")
    from ciosl.data.loaders import FileImages

    names = (tuple(CORE50_CATEGORIES) if categories
             else tuple(f"o{k + 1} ({CORE50_CATEGORIES[k // 5]})" for k in range(50)))
    return RawDataset(
        name, "images", FileImages(ptr), y[tr], FileImages(pte), y[te], names,
        _folder_fingerprint(name, base, [base / "paths.pkl", base / "LUP.pkl",
                                         base / "labels.pkl", *ptr, *pte]),
        train_instance=inst.astype(np.int64), train_frame=sof[tr, 2],
        meta={"path": str(base), "paths_index": tr})


CORE50_CATEGORIES = ("plug adapter", "mobile phone", "scissors", "light bulb", "can",
                     "glasses", "ball", "marker", "cup", "remote control")


def official_ordering(root: str | Path | None, scenario: str, run: int, *,
                      categories: bool = False, max_events: int | None = None) -> Ordering:
    """CORe50's official ``scenario`` (ni, nc, nic) of ``run`` (0-9) as an ``Ordering`` over
    ``load_core50``'s training set: base init on the first batch, then each batch in the listed
    order, a testing event after base init and after each batch. NC / NIC test on the classes
    seen so far, NI on every class."""
    if scenario not in CORE50_SCENARIOS:
        raise ValueError(f"unknown CORe50 scenario {scenario!r}; valid: {CORE50_SCENARIOS}")
    base = Path(root) if root is not None else data_root() / "core50"
    base, _ = _core50_files(base)
    paths, sof = _core50_paths(base)
    runs = _core50_table(base / "LUP.pkl", _core50_pickle(base / "LUP.pkl"), scenario)
    if not 0 <= run < len(runs):
        raise ValueError(f"{base / 'LUP.pkl'}: scenario {scenario} has runs 0..{len(runs) - 1},"
                         f" not {run}")
    tr = np.flatnonzero(~np.isin(sof[:, 0], CORE50_TEST_SESSIONS))
    position = np.full(len(paths), -1, np.int64)
    position[tr] = np.arange(len(tr))
    batches = []
    for b, idx in enumerate(runs[run][:-1]):
        idx = _ints(base / "LUP.pkl", idx, f"{scenario} run {run} batch {b}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(paths) or (position[idx] < 0).any()):
            raise ValueError(f"{base / 'LUP.pkl'}: {scenario} run {run} batch {b} lists a frame "
                             "outside the training sessions")
        batches.append(position[idx])
    obj = sof[tr, 1] - 1
    y = obj // 5 if categories else obj
    seen: list[int] = []
    event_classes = []
    for bt in batches:
        seen += [int(c) for c in dict.fromkeys(y[bt].tolist()) if c not in seen]
        event_classes.append(tuple(seen))
    events = np.cumsum([0] + [len(bt) for bt in batches[1:]]).astype(np.int64)
    kept = _pick_events(len(events), max_events)
    return Ordering(
        scenario, run, np.sort(batches[0]), np.concatenate(batches[1:]).astype(np.int64),
        events[kept], None if scenario == "ni" else tuple(event_classes[t] for t in kept),
        tuple(seen))
