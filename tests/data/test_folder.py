"""``folder:DIR``: layouts, the split rule, image modes, the rules on hidden files, other files
and links, damaged files named before any work, the content-keyed cache, the read-ahead; on
small folders written here."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ciosl.data import features as feat
from ciosl.data import folder as fo
from ciosl.data.datasets import get_spec, load_dataset
from helpers import cli, one_line_error

RNG = np.random.default_rng(0)


def img(path: Path, mode: str = "RGB", size=(6, 5), value=None, **save) -> Path:
    """A small image of ``mode`` at ``path`` (its format from the extension)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = {"RGB": (size[1], size[0], 3), "RGBA": (size[1], size[0], 4), "L": size[::-1],
             "LA": (size[1], size[0], 2)}[mode]
    a = RNG.integers(0, 256, shape, dtype=np.uint8) if value is None else np.full(shape, value,
                                                                                   np.uint8)
    Image.fromarray(a, mode).save(path, **save)
    return path


def tree(root: Path, classes=("b", "a10", "a2"), n=5, split=True) -> Path:
    for c in classes:
        for i in range(n):
            if split:
                img(root / "train" / c / f"{i}.png")
                if i < 2:
                    img(root / "test" / c / f"{i}.png")
            else:
                img(root / c / f"{i}.png")
    return root


def names(src) -> list[str]:
    return [Path(p).name for p in src.paths]


# ---------------------------------------------------------------- layouts


def test_train_test_layout_labels_in_natural_class_order(tmp_path):
    d = load_dataset(f"folder:{tree(tmp_path / 'd')}")
    assert d.class_names == ("a2", "a10", "b")  # natural order: a2 before a10
    assert d.train_y.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert d.test_y.tolist() == [0, 0, 1, 1, 2, 2]
    assert Path(d.train_x.paths[5]).parent.name == "a10"
    assert d.train_instance is None
    assert get_spec(f"folder:{tmp_path / 'd'}").orderings == ("iid", "class_iid")
    x = d.train_x.get_batch([0, 1])
    assert x.shape == (2, 5, 6, 3) and x.dtype == np.uint8


def test_split_rule_is_seeded_stable_and_per_class(tmp_path):
    root = tree(tmp_path / "d", classes=("x", "y"), n=10, split=False)
    d = load_dataset(f"folder:{root}")
    assert d.train_y.tolist().count(0) == 8 and d.test_y.tolist() == [0, 0, 1, 1]
    # the stated rule: the first round(0.2 n) files by sha256("0/<name>") go to test
    for k in (0, 1):
        ranked = sorted(range(10), key=lambda i: fo._split_rank(f"{i}.png"))
        want = sorted(f"{i}.png" for i in ranked[:2])
        got = sorted(Path(p).name for p, y in zip(d.test_x.paths, d.test_y, strict=True)
                     if y == k)
        assert got == want
    before = set(d.test_x.paths)
    img(root / "x" / "new.png")  # one more file: at most one other file crosses the split
    after = set(load_dataset(f"folder:{root}").test_x.paths)
    assert len(before - after) <= 1
    assert load_dataset(f"folder:{root}").test_x.paths == load_dataset(f"folder:{root}").test_x.paths


def test_instance_level_frames_in_file_name_order(tmp_path):
    root = tmp_path / "d"
    for c in ("cup", "pen"):
        for inst in ("o1", "o2"):
            for f in ("f10", "f2", "f1"):
                img(root / "train" / c / inst / f"{f}.jpg")
        img(root / "test" / c / "o1" / "f1.jpg")
    d = load_dataset(f"folder:{root}")
    assert names(d.train_x)[:3] == ["f1.jpg", "f2.jpg", "f10.jpg"]
    assert d.train_instance.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert d.train_frame.tolist() == [0, 1, 2] * 4
    assert d.test_y.tolist() == [0, 1]
    assert get_spec(f"folder:{root}").orderings == ("iid", "class_iid", "instance",
                                                   "class_instance")


@pytest.mark.parametrize("make, fragment", [
    (lambda r: (img(r / "train" / "a" / "1.png"), img(r / "test" / "zz" / "1.png")),
     "test class 'zz' has no train/ folder"),
    (lambda r: (img(r / "a" / "1.png"), img(r / "a" / "inst" / "1.png")),
     "holds both images"),
    (lambda r: (img(r / "a" / "1.png"), img(r / "b" / "i" / "1.png")),
     "some class folders hold instance folders"),
    (lambda r: ((r / "a").mkdir(parents=True), (r / "a" / "x.txt").write_text("")),
     "class 'a' has no training images"),
    (lambda r: r.mkdir(), "no class folders"),
])
def test_bad_layouts_are_one_line_naming_the_folder(tmp_path, capsys, make, fragment):
    root = tmp_path / "d"
    make(root)
    rc, err = cli(capsys, ["features", "--dataset", f"folder:{root}", "--extractor", "pixels",
                           "--cache", str(tmp_path / "c")])
    line = one_line_error(rc, err)
    assert fragment in line and str(root) in line


def test_missing_folder_is_one_line(tmp_path, capsys):
    rc, err = cli(capsys, ["run", "--dataset", f"folder:{tmp_path / 'nope'}", "--method", "ncm",
                           "--out", str(tmp_path / "o")])
    assert "no such folder" in one_line_error(rc, err)


# ---------------------------------------------------------------- image modes


def _palette(path: Path, transparent: bool) -> Path:
    im = Image.new("P", (4, 3), 1)
    im.putpalette([0, 0, 0, 10, 20, 30] + [0] * 762)
    im.save(path, **({"transparency": 1} if transparent else {}))
    return path


def _grey16(path: Path) -> Path:
    Image.fromarray(np.full((3, 4), 0x8000, np.uint16)).save(path)
    return path


def _cmyk(path: Path) -> Path:
    Image.new("CMYK", (4, 3), (0, 0, 0, 0)).save(path, quality=100)
    return path


@pytest.mark.parametrize("kind, make, pixel", [
    ("grey", lambda p: img(p / "g.png", "L", value=77), (77, 77, 77)),
    ("grey jpeg", lambda p: img(p / "g.jpg", "L", value=77, quality=100), (77, 77, 77)),
    ("16-bit grey", lambda p: _grey16(p / "g16.png"), (128, 128, 128)),
    ("palette", lambda p: _palette(p / "p.png", False), (10, 20, 30)),
    ("palette with transparency", lambda p: _palette(p / "pt.png", True), (255, 255, 255)),
    ("RGBA transparent", lambda p: img(p / "a.png", "RGBA", value=0), (255, 255, 255)),
    ("RGBA opaque", lambda p: img(p / "o.png", "RGBA", value=255), (255, 255, 255)),
    ("LA", lambda p: img(p / "la.png", "LA", value=0), (255, 255, 255)),
    ("webp", lambda p: img(p / "w.webp", "RGB", value=40, lossless=True), (40, 40, 40)),
    ("RGBA webp", lambda p: img(p / "w.webp", "RGBA", value=0, lossless=True), (255, 255, 255)),
    ("CMYK jpeg", lambda p: _cmyk(p / "c.jpg"), (255, 255, 255)),
])
def test_modes_become_rgb(tmp_path, kind, make, pixel):
    path = make(tmp_path)
    fo.check_image(path)
    a = fo.decode(path)
    assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3, kind
    assert np.abs(a[0, 0].astype(int) - pixel).max() <= 1, (kind, a[0, 0])


def test_half_transparent_pixel_is_composited_onto_white(tmp_path):
    a = np.zeros((2, 2, 4), np.uint8)
    a[..., 3] = 128  # black at half opacity -> mid grey
    Image.fromarray(a, "RGBA").save(tmp_path / "h.png")
    assert abs(int(fo.decode(tmp_path / "h.png")[0, 0, 0]) - 127) <= 1


# ---------------------------------------------------------------- files, links, hidden


def test_hidden_other_files_and_links(tmp_path, caplog):
    root = tree(tmp_path / "d", classes=("a", "b"), n=3)
    outside = img(tmp_path / "elsewhere" / "x.png")
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    (root / "train" / "a" / "x.gif").write_bytes(b"GIF89a")
    img(root / "train" / "a" / ".hidden.png")
    img(root / "train" / ".cache" / "1.png")  # a hidden class folder
    os.symlink(outside, root / "train" / "a" / "out.png")  # leaves DIR: skipped
    os.symlink(root / "train" / "b" / "0.png", root / "train" / "a" / "in.png")  # followed
    os.symlink(tmp_path / "missing.png", root / "train" / "a" / "dangling.png")
    os.symlink(root / "train" / "a", root / "train" / "a" / "loop")  # a folder met twice
    with caplog.at_level(logging.WARNING, logger="ciosl.data.folder"):
        d = load_dataset(f"folder:{root}")
    assert d.class_names == ("a", "b")
    assert names(d.train_x)[:4] == ["0.png", "1.png", "2.png", "in.png"]
    assert len(d.train_x) == 7
    text = caplog.text
    assert "skipped 2 file(s) that are not" in text and "notes.txt" in text
    assert "skipped 2 link(s) leading outside" in text


# ---------------------------------------------------------------- damaged files


def _truncated(path: Path, keep: float = 0.5, **save) -> Path:
    img(path, size=(32, 32), **save)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


@pytest.mark.parametrize("kind, make", [
    ("text named .png", lambda p: (p.write_text("hello"), p)[1]),
    ("empty .jpg", lambda p: (p.with_suffix(".jpg").write_bytes(b""), p.with_suffix(".jpg"))[1]),
    ("truncated png", lambda p: _truncated(p)),
    ("truncated jpeg", lambda p: _truncated(p.with_suffix(".jpg"), quality=95)),
    ("truncated webp", lambda p: _truncated(p.with_suffix(".webp"))),
    ("gif named .png", lambda p: (Image.new("P", (3, 3)).save(p, format="GIF"), p)[1]),
])
def test_damaged_file_named_in_one_line_before_any_work(tmp_path, capsys, monkeypatch, kind,
                                                        make):
    root = tree(tmp_path / "d", classes=("a", "b"), n=3)
    bad = make(root / "train" / "b" / "zz.png")
    calls = []
    monkeypatch.setattr(feat, "_pixels", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(feat, "_embed_all", lambda *a, **k: calls.append(1))
    rc, err = cli(capsys, ["features", "--dataset", f"folder:{root}", "--extractor", "pixels",
                           "--cache", str(tmp_path / "c")])
    line = one_line_error(rc, err)
    assert str(bad) in line and "does not decode" in line, kind
    assert calls == [] and not (tmp_path / "c").exists()


def test_jpeg_with_data_after_its_end_marker_is_accepted(tmp_path):
    path = img(tmp_path / "x.jpg", quality=90)
    path.write_bytes(path.read_bytes() + b"trailing camera data")
    fo.check_image(path)  # decoded in full to decide: it decodes


# ---------------------------------------------------------------- cache


def test_cache_keyed_by_content(tmp_path, monkeypatch):
    root = tree(tmp_path / "d", classes=("a", "b"), n=3)
    name, cache = f"folder:{root}", tmp_path / "cache"
    runs = []
    real = feat.extract
    monkeypatch.setattr(feat, "extract", lambda *a, **k: runs.append(1) or real(*a, **k))
    first = feat.get_features(name, "pixels", cache_dir=cache, progress=False)
    again = feat.get_features(name, "pixels", cache_dir=cache, progress=False)
    assert len(runs) == 1 and again.key == first.key
    np.testing.assert_array_equal(again.train_z, first.train_z)
    target = root / "train" / "a" / "1.png"
    st = target.stat()
    img(target, value=3)  # new content, and its time moved on
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    changed = feat.get_features(name, "pixels", cache_dir=cache, progress=False)
    assert len(runs) == 2 and changed.key != first.key
    assert not np.array_equal(changed.train_z, first.train_z)
    (root / "test" / "b" / "0.png").unlink()  # a removed file
    assert feat.get_features(name, "pixels", cache_dir=cache, progress=False).key not in (
        first.key, changed.key)


# ---------------------------------------------------------------- streaming


def test_reads_ahead_a_bounded_number_of_batches(tmp_path, monkeypatch):
    paths = [img(tmp_path / f"{i}.png") for i in range(40)]
    decoded = []
    real = fo.decode
    monkeypatch.setattr(fo, "decode", lambda p: decoded.append(p) or real(p))
    src = fo.FolderImages(paths)
    first = src.get_batch(np.arange(0, 4))
    fo.pool().submit(lambda: None).result()  # the pool is alive
    assert first.shape == (4, 5, 6, 3)
    assert len(src._ahead) == fo.READ_AHEAD  # the next spans, no more
    for s in range(4, 40, 4):
        batch = src.get_batch(np.arange(s, s + 4))
        np.testing.assert_array_equal(batch[0], real(paths[s]))
        assert len(src._ahead) <= fo.READ_AHEAD
    for f in list(src._ahead.values()):
        f.result()
    assert sorted(decoded) == sorted(str(p) for p in paths)  # each file decoded once


def test_concurrent_readers_decode_each_file_once_per_pass(tmp_path, monkeypatch):
    paths = [img(tmp_path / f"{i}.png") for i in range(30)]
    decoded = []
    real = fo.decode
    monkeypatch.setattr(fo, "decode", lambda p: decoded.append(p) or real(p))
    src = fo.FolderImages(paths)
    # the order in which the workers of an extraction may ask: neighbours swapped
    for start in (3, 0, 9, 6, 12, 18, 15, 21, 27, 24):
        batch = src.get_batch(np.arange(start, min(30, start + 3)))
        np.testing.assert_array_equal(batch[0], real(paths[start]))
    for f in list(src._ahead.values()):
        f.result()
    assert sorted(decoded) == sorted(str(p) for p in paths)  # none twice
    src.get_batch(np.arange(0, 3))  # a second pass reads them again
    for f in list(src._ahead.values()):
        f.result()
    assert len(decoded) == 30 + 3 + 3 * fo.READ_AHEAD


def test_images_of_different_sizes_come_as_a_list(tmp_path):
    a, b = img(tmp_path / "a.png", size=(4, 4)), img(tmp_path / "b.png", size=(5, 3))
    out = fo.FolderImages([a, b]).get_batch([1, 0])
    assert isinstance(out, list) and [x.shape for x in out] == [(3, 5, 3), (4, 4, 3)]


def test_efficientnet_features_of_a_folder(tmp_path):
    root = tree(tmp_path / "d", classes=("a", "b"), n=2)
    fs = feat.get_features(f"folder:{root}", "efficientnet_lite0@32", cache_dir=tmp_path / "c",
                           progress=False, backend="torch")
    assert fs.train_z.shape == (4, 1280) and fs.test_z.shape == (4, 1280)
    ref = feat.efficientnet.load_efficientnet_lite0(None)
    x = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in
                  load_dataset(f"folder:{root}").train_x.paths])
    import torch

    with torch.inference_mode():
        raw = ref.embed(feat.efficientnet_input(x, 32)).numpy()
    mean, std = raw.mean(0), np.maximum(raw.std(0), feat.PIXEL_STD_FLOOR)
    np.testing.assert_allclose(fs.train_z, (raw - mean) / std, atol=1e-4)




def test_run_streams_a_folder_in_the_instance_ordering(tmp_path, capsys):
    root = tmp_path / "d"
    for c in ("w", "x", "y", "z"):
        for inst in ("i1", "i2"):
            for f in range(6):
                img(root / c / inst / f"f{f}.png", "L", size=(8, 8))
    rc, err = cli(capsys, ["run", "--dataset", f"folder:{root}", "--ordering", "instance",
                           "--method", "ncm", "--extractor", "pixels", "--runs", "1", "--quiet",
                           "--no-offline", "--cache", str(tmp_path / "c"),
                           "--out", str(tmp_path / "out")])
    assert rc == 0, err
    (result,) = (tmp_path / "out").rglob("*.json")
    assert "folder" in result.name and "instance" in result.name
