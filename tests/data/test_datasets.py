"""Dataset registry, loaders, downloads and the safe unpickler, on small files written here."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import pickle
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ciosl.data import datasets as ds
from ciosl.data.download import ChecksumError, DownloadError, download_url, extract_tar
from ciosl.data.safe_pickle import safe_load
from ciosl.data.types import DatasetSpec, ImageSource, RawDataset
from dataset_files import idx_bytes, write_cifar, write_fashion

REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test sees an empty $CIOSL_DATA and no mirror override."""
    monkeypatch.setenv("CIOSL_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("CIOSL_MIRROR", raising=False)


@pytest.fixture
def server(tmp_path):
    """A local HTTP server on 127.0.0.1 serving tmp_path/www; yields (folder, base URL)."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- registry


def test_specs_follow_the_protocol_table():
    assert set(ds.DATASETS) == {"digits", "fashion-mnist", "cifar10", "cifar100", "imagenet100",
                                "icubworld1", "digits-video", "digits-video-28",
                                "fashion-mnist-video", "digits-instances",
                                "fashion-mnist-instances", "stream51", "core50",
                                "core50-cat"}
    table = {"cifar10": (0.02, 2, 1000), "cifar100": (0.10, 10, 1000),
             "imagenet100": (0.10, 10, 1000), "icubworld1": (0.10, 2, 180),
             "fashion-mnist": (0.02, 2, 1000), "digits": (0.10, 2, 100),
             "digits-video": (0.10, 2, 180), "digits-video-28": (0.10, 2, 180),
             "fashion-mnist-video": (0.10, 2, 180), "digits-instances": (0.10, 2, 34),
             "fashion-mnist-instances": (0.10, 2, 180)}
    for name, (base, step, buffer) in table.items():
        s = ds.get_spec(name)
        assert (s.base_fraction, s.classes_per_step, s.buffer) == (base, step, buffer)
        temporal = name in ("icubworld1", "digits-video", "digits-video-28",
                            "fashion-mnist-video", "digits-instances", "fashion-mnist-instances")
        assert ("instance" in s.orderings) == temporal and "class_iid" in s.orderings
    assert ds.get_spec("imagenet100").offline_epochs == 100
    assert ds.get_spec("digits").default_extractor == "pixels"
    assert ds.get_spec("cifar100").default_extractor == "mobilenet_v2"
    assert ds.get_spec("fashion-mnist-instances").default_extractor == "efficientnet_lite0"
    assert len(ds.IMAGENET100) == len(set(ds.IMAGENET100)) == 100
    assert ds.IMAGENET100[0] == "n01632777" and ds.IMAGENET100[-1] == "n12267677"


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="cifar10.*digits-video.*features:"):
        ds.get_spec("cifar11")
    with pytest.raises(ValueError, match="unknown dataset"):
        ds.load_dataset("nope")


def test_absent_dataset_says_how_to_get_it(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz"):
        ds.load_dataset("cifar10")
    with pytest.raises(FileNotFoundError, match="robotology"):
        ds.load_dataset("icubworld1")
    monkeypatch.setattr(ds, "FASHION_SYSTEM_DIR", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="needs fashion-mnist.*dataset-fashion-mnist"):
        ds.load_dataset("fashion-mnist-video")


def test_data_root_and_status(tmp_path, monkeypatch):
    assert ds.data_root() == tmp_path / "data"
    monkeypatch.delenv("CIOSL_DATA")
    assert ds.data_root() == Path.home() / ".cache" / "ciosl" / "data"
    monkeypatch.setenv("CIOSL_DATA", str(tmp_path / "data"))
    status = {spec.name: (ok, where) for spec, ok, where in ds.dataset_status()}
    assert status["digits"][0] and not status["cifar10"][0] and status["cifar10"][1] is None
    write_cifar(tmp_path / "data" / "cifar10" / "cifar-10-batches-py", n=4)
    status = {spec.name: (ok, where) for spec, ok, where in ds.dataset_status()}
    assert status["cifar10"][0] and status["cifar10"][1].endswith("cifar-10-batches-py")


# ---------------------------------------------------------------- digits


def test_digits():
    d = ds.load_dataset("digits")
    assert isinstance(d, RawDataset) and isinstance(d.train_x, ImageSource)
    xtr, xte = d.train_x.get_batch(np.arange(len(d.train_x))), d.test_x.get_batch([0, 1])
    assert xtr.shape == (1437, 8, 8) and xte.shape == (2, 8, 8) and len(d.test_x) == 360
    assert xtr.dtype == np.uint8 and xtr.max() == 255
    assert d.train_y.dtype == np.int64 and d.class_names == tuple("0123456789")
    train_counts, test_counts = np.bincount(d.train_y), np.bincount(d.test_y)
    assert np.all(np.abs(test_counts - 0.2 * (train_counts + test_counts)) <= 1)  # stratified
    again = ds.load_dataset("digits")
    assert again.fingerprint == d.fingerprint and np.array_equal(again.test_y, d.test_y)


# ---------------------------------------------------------------- Fashion-MNIST / IDX


@pytest.mark.parametrize("gz", [True, False])
def test_idx_parsing(tmp_path, gz):
    write_fashion(tmp_path / "f", n=20, gz=gz)
    d = ds.load_dataset("fashion-mnist", root=tmp_path / "f")
    assert len(d.train_x) == 20 and len(d.test_x) == 10
    assert d.train_x.get_batch([3]).shape == (1, 28, 28) and d.train_y[13] == 3
    assert d.class_names[0] == "T-shirt/top" and d.class_names[9] == "Ankle boot"
    write_fashion(tmp_path / "g", n=20, gz=gz, seed=1)
    assert ds.load_dataset("fashion-mnist", root=tmp_path / "g").fingerprint != d.fingerprint


def test_idx_rejects_truncated_and_bad_magic(tmp_path):
    data = idx_bytes(np.zeros((5, 28, 28)))
    (tmp_path / "cut").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        ds.read_idx(tmp_path / "cut")
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data[:100]))
    with pytest.raises(ValueError, match="truncated"):
        ds.read_idx(tmp_path / "cut.gz")
    (tmp_path / "magic").write_bytes(b"\x00\x00\x0d\x01" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        ds.read_idx(tmp_path / "magic")


# CI installs dataset-fashion-mnist (make data), so there the real-data tests never skip.
@pytest.mark.skipif(not REAL_FASHION.is_dir() and not os.environ.get("CI"),
                    reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist():
    d = ds.load_dataset("fashion-mnist")
    assert len(d.train_x) == 60000 and len(d.test_x) == 10000
    assert np.array_equal(np.bincount(d.train_y), [6000] * 10)
    assert d.train_x.get_batch([0]).dtype == np.uint8


# ---------------------------------------------------------------- CIFAR + safe unpickler


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_pickles(tmp_path, protocol):
    first = write_cifar(tmp_path / "c" / "cifar-10-batches-py", n=6, protocol=protocol)
    d = ds.load_dataset("cifar10", root=tmp_path / "c")
    assert len(d.train_x) == 30 and len(d.test_x) == 6 and d.class_names[3] == "class3"
    x = d.train_x.get_batch([0])
    assert x.shape == (1, 32, 32, 3) and np.array_equal(x[0], first)  # CHW rows -> HWC
    assert d.train_y.dtype == np.int64 and d.train_y.max() < 10


def test_cifar100_pickles(tmp_path):
    write_cifar(tmp_path / "data" / "cifar100" / "cifar-100-python", n=8, hundred=True)
    d = ds.load_dataset("cifar100")
    assert len(d.train_x) == 8 and d.n_classes == 100 and d.class_names[99] == "class99"


class Evil:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


def test_malicious_pickle_is_refused(tmp_path):
    folder = tmp_path / "c" / "cifar-10-batches-py"
    write_cifar(folder, n=2)
    sentinel = tmp_path / "SENTINEL"
    (folder / "data_batch_1").write_bytes(pickle.dumps({b"data": Evil(sentinel)}))
    with pytest.raises(pickle.UnpicklingError, match="refused.*(posix|os).system"):
        ds.load_dataset("cifar10", root=tmp_path / "c")
    assert not sentinel.exists()
    (tmp_path / "p").write_bytes(pickle.dumps(io.BytesIO(b"x")))
    with pytest.raises(pickle.UnpicklingError):
        safe_load(tmp_path / "p")


# ---------------------------------------------------------------- downloads


def test_download_checksum(tmp_path, server):
    www, url = server
    (www / "a.bin").write_bytes(b"hello" * 1000)
    good = md5(www / "a.bin")
    dest = download_url(url + "a.bin", tmp_path / "dl" / "a.bin", good)
    assert dest.read_bytes() == b"hello" * 1000
    with pytest.raises(ChecksumError, match="checksum"):
        download_url(url + "a.bin", tmp_path / "dl" / "b.bin", "0" * 32)
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["a.bin"]  # no partial file
    with pytest.raises(DownloadError, match="offline"):
        download_url(url + "missing.bin", tmp_path / "dl" / "c.bin", good)
    assert not (tmp_path / "dl" / "c.bin").exists()


def test_cifar10_download_from_mirror(tmp_path, server, monkeypatch):
    www, url = server
    write_cifar(tmp_path / "src" / "cifar-10-batches-py", n=3)
    archive = www / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setenv("CIOSL_MIRROR", url)
    with pytest.raises(FileNotFoundError):  # never downloads unless asked
        ds.load_dataset("cifar10")
    with pytest.raises(ChecksumError):  # the official md5 rejects this home-made archive
        ds.load_dataset("cifar10", download=True)
    assert not (ds.data_root() / "cifar10" / "cifar-10-python.tar.gz").exists()
    entry = ds.CIFAR["cifar10"]
    monkeypatch.setitem(ds.CIFAR, "cifar10", (entry[0], md5(archive), *entry[2:]))
    d = ds.load_dataset("cifar10", download=True)
    assert len(d.train_x) == 15 and (ds.data_root() / "cifar10" / "cifar-10-batches-py").is_dir()


def test_extract_refuses_escaping_members(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(DownloadError, match="unsafe"):
        extract_tar(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.txt").exists()


# ---------------------------------------------------------------- image folders


def test_imagenet100_subset(tmp_path):
    wnids = [ds.IMAGENET100[50], ds.IMAGENET100[2], ds.IMAGENET100[7]]
    for split, n in (("train", 3), ("val", 2)):
        for w in wnids + ["n99999999"]:  # a folder outside the list is ignored
            (tmp_path / split / w).mkdir(parents=True)
            for i in range(n):
                Image.new("L", (10 + i, 12), color=i).save(tmp_path / split / w / f"{i}.JPEG")
    with pytest.raises(FileNotFoundError, match="97 of the 100"):
        ds.load_dataset("imagenet100", root=tmp_path)
    d = ds.load_dataset("imagenet100", root=tmp_path, allow_subset=True)
    assert d.class_names == (ds.IMAGENET100[2], ds.IMAGENET100[7], ds.IMAGENET100[50])
    assert len(d.train_x) == 9 and len(d.test_x) == 6
    assert list(d.train_y) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    batch = d.train_x.get_batch([0, 2])
    assert [b.shape for b in batch] == [(12, 10, 3), (12, 12, 3)] and batch[0].dtype == np.uint8


def test_icubworld1_natural_order(tmp_path):
    names = ["10.png", "9.png", "100.png", "1.png"]  # natural order: 1, 9, 10, 100
    for c in ("bananas", "cans"):
        for inst in ("inst1", "inst2"):
            for split in ("train", "test"):
                folder = tmp_path / split / c / inst
                folder.mkdir(parents=True)
                for nm in names:
                    Image.new("RGB", (4, 4), color=(int(nm[:-4]), 0, 0)).save(folder / nm)
    for nm in names[:2]:  # a flat test layout next to the instance folders
        Image.new("RGB", (4, 4)).save(tmp_path / "test" / "cans" / nm)
    d = ds.load_dataset("icubworld1", root=tmp_path)
    assert d.class_names == ("bananas", "cans") and len(d.test_x) == 18
    assert list(d.train_instance) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert list(d.train_frame) == [0, 1, 2, 3] * 4 and list(d.train_y) == [0] * 8 + [1] * 8
    reds = [int(im[0, 0, 0]) for im in d.train_x.get_batch(range(4))]
    assert reds == [1, 9, 10, 100]


# ---------------------------------------------------------------- video streams


@pytest.mark.parametrize("name", ["digits-video", "digits-video-28", "fashion-mnist-video"])
def test_video_datasets(name):
    if name == "fashion-mnist-video" and ds._find_fashion(None) is None and not os.environ.get("CI"):
        pytest.skip("fashion-mnist not available")
    d = ds.load_dataset(name)
    assert d.n_classes == 10 and len(d.train_x) == 30 * 200 and len(d.test_x) == 30 * 67
    assert np.array_equal(np.unique(d.train_instance), np.arange(30))
    assert np.array_equal(d.train_y, d.train_instance // 3)
    assert np.array_equal(d.train_frame[:200], np.arange(200)) and d.train_frame.max() == 199
    assert np.array_equal(np.bincount(d.test_y), [201] * 10)
    assert len(set(d.meta["source_indices"])) == 30
    x = d.train_x.get_batch(np.arange(len(d.train_x))).astype(np.float64)
    assert x.shape[1:] == ((16, 16) if name == "digits-video" else (28, 28))
    if name == "digits-video-28":  # its own dataset: not digits-video's cache entry
        assert ds.load_dataset("digits-video").fingerprint != d.fingerprint
    rng = np.random.default_rng(0)
    for inst in (0, 14, 29):
        v = x[d.train_instance == inst]  # (200, H, W) in temporal order
        step = np.abs(np.diff(v, axis=0)).mean()
        i, j = rng.integers(0, 200, (2, 300))
        assert step < 0.5 * np.abs(v[i] - v[j]).mean()
    assert np.abs(x[:200].mean(0) - x[200:400].mean(0)).mean() > 5  # instances differ
    again = ds.load_dataset(name)
    assert again.fingerprint == d.fingerprint
    assert np.array_equal(again.test_x.get_batch([0, 2009]), d.test_x.get_batch([0, 2009]))


# ---------------------------------------------------------------- features:PATH


def test_features_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "f.npz"
    np.savez(path, train_z=rng.normal(size=(12, 5)), train_y=np.array([3, 5, 9] * 4),
             test_z=rng.normal(size=(3, 5)).astype(np.float32), test_y=np.array([9, 3, 5]),
             class_names=np.array(["a", "b", "c"]))
    spec = ds.get_spec(f"features:{path}")
    assert isinstance(spec, DatasetSpec) and spec.orderings == ("iid", "class_iid")
    assert (spec.base_fraction, spec.classes_per_step, spec.buffer) == (0.1, 2, 1000)
    assert (spec.default_extractor, spec.offline_epochs, spec.offline_batch_size) == ("none", 50,
                                                                                      128)
    d = ds.load_dataset(f"features:{path}")
    assert d.kind == "features" and d.train_x.dtype == np.float32 and d.train_x.shape == (12, 5)
    assert list(d.test_y) == [2, 0, 1] and d.class_names == ("a", "b", "c")
    np.savez(path, train_z=np.ones((4, 2)), train_y=np.arange(4), test_z=np.ones((2, 2)),
             test_y=np.arange(2), train_instance=np.arange(4), train_frame=np.zeros(4, int))
    assert "class_instance" in ds.get_spec(f"features:{path}").orderings
    d = ds.load_dataset(f"features:{path}")
    assert d.train_instance.dtype == np.int64 and d.class_names == ("0", "1", "2", "3")


@pytest.mark.parametrize("arrays, message", [
    (dict(train_z=np.ones((4, 2)), train_y=np.arange(4), test_z=np.ones((2, 2))), "test_y"),
    (dict(train_z=np.ones((4, 2)), train_y=np.arange(3), test_z=np.ones((2, 2)),
          test_y=np.arange(2)), "4 rows but train_y has 3"),
    (dict(train_z=np.ones((4, 2)), train_y=np.arange(4), test_z=np.ones((2, 3)),
          test_y=np.arange(2)), "2 features, test_z 3"),
    (dict(train_z=np.ones(4), train_y=np.arange(4), test_z=np.ones((2, 2)),
          test_y=np.arange(2)), "2-D"),
    (dict(train_z=np.ones((4, 2)), train_y=np.ones(4) / 2, test_z=np.ones((2, 2)),
          test_y=np.arange(2)), "integer"),
])
def test_bad_features_file(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        ds.load_dataset(f"features:{tmp_path / 'bad.npz'}")
    with pytest.raises(FileNotFoundError):
        ds.load_dataset(f"features:{tmp_path / 'absent.npz'}")
