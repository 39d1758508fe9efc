"""Damaged, odd or hostile data files (Fashion-MNIST, CIFAR, ``features:PATH`` .npz, zip bombs):
each is refused in one line naming the file and what is wrong, before anything is allocated or
cached from it."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    QUICK,
    cli,
    one_line_error,
    run_args,
    zip_bomb,
)

# ---------------------------------------------------------------------------- damaged files
# (id, writes the bad file(s) and returns the `ciosl` arguments, fragment); the one line names
# the file, and nothing is cached from it


def fashion_with(tmp: Path, damage) -> list[str]:
    from dataset_files import write_fashion

    folder = tmp / "fashion"
    write_fashion(folder, n=20)
    damage(folder)
    return ["features", "--dataset", "fashion-mnist", "--data", str(folder), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def cifar_with(tmp: Path, damage) -> list[str]:
    from dataset_files import write_cifar

    folder = tmp / "c" / "cifar-10-batches-py"
    write_cifar(folder, n=4)
    damage(folder)
    return ["features", "--dataset", "cifar10", "--data", str(tmp / "c"), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def features_file(tmp: Path, data: bytes) -> list[str]:
    path = tmp / "feats.npz"
    path.write_bytes(data)
    return run_args(tmp, "--dataset", f"features:{path}", "--ordering", "iid")


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


class Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('ran')",))


def npz_bytes(**arrays) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def odd_npy_member(header_shape: str) -> bytes:
    """A .npz whose train_z.npy header declares ``header_shape`` over 16 bytes of data."""
    import io
    import zipfile

    header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + header_shape + ", }"
    header = header.ljust(118) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(16)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train_z.npy", npy)
    return buf.getvalue()


FILE_CASES = [
    ("truncated-gz", lambda t: fashion_with(
        t, lambda f: truncate(f / "t10k-images-idx3-ubyte.gz", 40)),
     "t10k-images-idx3-ubyte.gz: corrupt or truncated gzip file"),
    ("not-gzip", lambda t: fashion_with(
        t, lambda f: (f / "train-labels-idx1-ubyte.gz").write_bytes(b"plain bytes, no gzip")),
     "train-labels-idx1-ubyte.gz: corrupt or truncated gzip file (BadGzipFile"),
    ("cifar-refused-global", lambda t: cifar_with(
        t, lambda f: (f / "data_batch_2").write_bytes(__import__("pickle").dumps(Evil()))),
     "data_batch_2: not a readable CIFAR pickle (UnpicklingError: refused to unpickle global "
     "builtins.exec"),
    ("cifar-truncated", lambda t: cifar_with(t, lambda f: truncate(f / "test_batch", 100)),
     "test_batch: not a readable CIFAR pickle (UnpicklingError"),
    ("npz-random-bytes", lambda t: features_file(t, np.random.default_rng(0).bytes(3000)),
     "feats.npz: not a readable features .npz: not a zip archive"),
    ("npz-truncated", lambda t: features_file(t, npz_bytes(train_z=np.ones((50, 3)))[:400]),
     "feats.npz: not a readable features .npz"),
    ("npz-declares-1e12-rows", lambda t: features_file(t, odd_npy_member("(1000000000000, 4)")),
     "array train_z.npy declares shape (1000000000000, 4) of float32 (16000000000000 bytes) "
     "but holds 16 bytes"),
    ("npz-zero-width-dtype", lambda t: features_file(
        t, odd_npy_member("(4,)").replace(b"'<f4'", b"'|V0'")),
     "feats.npz: not a readable features .npz"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in FILE_CASES],
                         ids=[c[0] for c in FILE_CASES])
def test_damaged_files_get_one_line_naming_the_file(setup, fragment, tmp_path, capsys,
                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line
    assert not (tmp_path / "cache" / "features").exists() or not any(
        (tmp_path / "cache" / "features").iterdir())
    assert not (tmp_path / "PWNED").exists()


def cifar_batch(folder: Path, name: str, images: int, labels) -> None:
    import pickle

    data = np.zeros((images, 3072), np.uint8)
    (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": list(labels)}))


def fashion_images(folder: Path, stem: str, shape: tuple) -> None:
    import gzip

    from dataset_files import idx_bytes

    (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(shape, np.uint8))))


LOADER_CASES = [
    ("cifar-misaligned", lambda t: cifar_with(t, lambda f: cifar_batch(f, "data_batch_3", 40,
                                                                          range(30))),
     "data_batch_3: 40 images but labels of shape (30,)"),
    ("cifar-label-minus-one", lambda t: cifar_with(t, lambda f: cifar_batch(f, "test_batch", 4,
                                                                           [0, -1, 2, 3])),
     "test_batch: labels must be in 0..9, found -1..3"),
    ("cifar-label-too-big", lambda t: cifar_with(t, lambda f: cifar_batch(f, "data_batch_1", 4,
                                                                          [0, 10, 2, 3])),
     "data_batch_1: labels must be in 0..9, found 0..10"),
    ("cifar-meta-names", lambda t: cifar_with(t, lambda f: (f / "batches.meta").write_bytes(
        __import__("pickle").dumps({b"label_names": [b"a", b"b"]}))),
     "batches.meta: expected 10 class names under b'label_names', got 2"),
    ("fashion-test-images-20x20", lambda t: fashion_with(
        t, lambda f: fashion_images(f, "t10k-images-idx3-ubyte", (10, 20, 20))),
     "inconsistent Fashion-MNIST files (t10k-images-idx3-ubyte: (10, 20, 20), expected "
     "(n, 28, 28)"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in LOADER_CASES],
                         ids=[c[0] for c in LOADER_CASES])
def test_dataset_loaders_check_counts_shapes_and_labels(setup, fragment, tmp_path, capsys):
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line
    assert not (tmp_path / "cache" / "features").exists() or not any(
        (tmp_path / "cache" / "features").iterdir())


BOMB_CASES = [
    ("npz-inflating-1000x", lambda t: features_file(t, zip_bomb("train_z.npy")),
     "would inflate to 83886080 bytes (over 50 times the file's size): refused as a zip bomb"),
    ("cifar-bytes-of-a-size", lambda t: cifar_with(t, lambda f: (f / "data_batch_1").write_bytes(
        b"\x80\x02cbuiltins\nbytes\nJ\x00\x10\x00\x00\x85R.")),
     "data_batch_1: not a readable CIFAR pickle (UnpicklingError: refused bytes(4096)"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in BOMB_CASES],
                         ids=[c[0] for c in BOMB_CASES])
def test_memory_bombs_are_refused_before_allocating(setup, fragment, tmp_path, capsys):
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line


# ---------------------------------------------------------------------------- data
def features_npz(tmp: Path, **arrays) -> Path:
    rng = np.random.default_rng(0)
    base = {"train_z": rng.normal(size=(40, 4)), "train_y": np.repeat(np.arange(4), 10),
            "test_z": rng.normal(size=(8, 4)), "test_y": np.repeat(np.arange(4), 2)}
    path = tmp / "feats.npz"
    np.savez(path, **{**base, **arrays})
    return path


def with_value(value: float, row: int = 5, col: int = 2, split: str = "train"):
    def make(tmp: Path) -> list[str]:
        z = np.random.default_rng(0).normal(size=(40 if split == "train" else 8, 4))
        z[row, col] = value
        return run_on(tmp, features_npz(tmp, **{f"{split}_z": z}))
    return make


def run_on(tmp: Path, path: Path) -> list[str]:
    return ["run", *QUICK, "--dataset", f"features:{path}", "--ordering", "iid", "--method",
            "ncm", "--cache", str(tmp / "cache"), "--out", str(tmp / "out")]


def duplicate_member(tmp: Path) -> list[str]:
    path = features_npz(tmp)
    extra = io.BytesIO()
    np.save(extra, np.zeros((40, 4)))
    with zipfile.ZipFile(path, "a") as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("train_z.npy", extra.getvalue())
    return run_on(tmp, path)


def zero_width(tmp: Path) -> list[str]:
    return run_on(tmp, features_npz(tmp, train_z=np.zeros((40, 0)), test_z=np.zeros((8, 0))))


def empty_fashion_test_split(tmp: Path) -> list[str]:
    from dataset_files import write_fashion

    folder = tmp / "fashion"
    write_fashion(folder, n=20)
    import gzip

    from dataset_files import idx_bytes

    for stem, shape in (("t10k-images-idx3-ubyte", (0, 28, 28)), ("t10k-labels-idx1-ubyte", (0,))):
        for old in folder.glob(f"{stem}*"):
            old.unlink()
        (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(shape, np.uint8))))
    return ["features", "--dataset", "fashion-mnist", "--data", str(folder), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def data_elsewhere(tmp: Path, monkeypatch) -> list[str]:
    """Fashion-MNIST present in $CIOSL_DATA, a --data folder that does not exist."""
    from dataset_files import write_fashion

    write_fashion(tmp / "home" / "fashion-mnist", n=20)
    monkeypatch.setenv("CIOSL_DATA", str(tmp / "home"))
    return ["features", "--dataset", "fashion-mnist", "--data", str(tmp / "nonexistent"),
            "--extractor", "pixels", "--cache", str(tmp / "cache")]


def data_empty_folder(tmp: Path, monkeypatch) -> list[str]:
    from dataset_files import write_fashion

    write_fashion(tmp / "home" / "fashion-mnist", n=20)
    monkeypatch.setenv("CIOSL_DATA", str(tmp / "home"))
    (tmp / "empty").mkdir()
    return ["features", "--dataset", "fashion-mnist", "--data", str(tmp / "empty"),
            "--extractor", "pixels", "--cache", str(tmp / "cache")]


DATA_CASES = [  # (id, argv maker, fragment); {tmp} is the test's folder
    ("nan-at-row-5", with_value(np.nan), "{tmp}/feats.npz: train_z row 5 has NaN or infinite"),
    ("inf-in-test-row-3", with_value(-np.inf, row=3, split="test"),
     "{tmp}/feats.npz: test_z row 3 has NaN or infinite"),
    ("finite-1e39", with_value(1e39, row=7, col=1),
     "{tmp}/feats.npz: train_z row 7 has feature 1 = 1e+39, beyond +-1e+12: too large"),
    ("zero-width", zero_width, "{tmp}/feats.npz: train_z has 0 features per sample"),
    ("duplicate-member", duplicate_member,
     "{tmp}/feats.npz: damaged features .npz: member(s) 'train_z.npy' stored twice"),
    ("empty-test-split", empty_fashion_test_split,
     "Dataset 'fashion-mnist' ({tmp}/fashion) has no test samples"),
    ("data-does-not-exist", data_elsewhere, "--data {tmp}/nonexistent: no such folder"),
    ("data-without-the-files", data_empty_folder,
     "fashion-mnist: data not found (looked in: {tmp}/empty)"),
    ("features-cache-unwritable", lambda tmp: [
        "features", "--dataset", "digits", "--extractor", "pixels", "--cache", "/proc/nope",
        "--rebuild"], "/proc/nope/features/digits-pixels-"),
    ("features-cache-unwritable-no-rebuild", lambda tmp: [
        "features", "--dataset", "digits", "--extractor", "pixels", "--cache", "/proc/nope"],
     "/proc/nope/features/digits-pixels-"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in DATA_CASES],
                         ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_refused_in_one_line_naming_where(make, fragment, tmp_path, capsys,
                                                      monkeypatch):
    import inspect

    argv = make(tmp_path, monkeypatch) if len(inspect.signature(make).parameters) > 1 else make(
        tmp_path)
    line = one_line_error(*cli(capsys, argv))
    assert fragment.format(tmp=tmp_path) in line, line
    assert not list((tmp_path / "out").glob("*.json"))
    if "cache-unwritable" in fragment or "/proc/nope" in fragment:
        assert "cannot write the feature cache entry" in line
