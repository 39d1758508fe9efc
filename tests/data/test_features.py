"""Frozen extractors (pixels, MobileNetV2) and the on-disk feature cache."""

from __future__ import annotations

import dataclasses
import logging
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch

from ciosl.data import features
from ciosl.data.features import cache_key, extract, get_features, preprocess
from ciosl.data.mobilenet import MobileNetV2, WeightsError, load_mobilenet_v2
from ciosl.data.types import ArrayImages, RawDataset
from helpers import (
    cli,
    one_line_error,
    run_args,
)


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Extraction keeps its ONNX export in the cache root: the tests', never the user's."""
    monkeypatch.setenv("CIOSL_CACHE", str(tmp_path_factory.getbasetemp() / "cache-root"))


def make_raw(
    n: int = 40,
    m: int = 10,
    shape: tuple[int, ...] = (8, 8),
    seed: int = 0,
    fingerprint: str = "fp0",
) -> RawDataset:
    rng = np.random.default_rng(seed)
    train = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    train[:, 0, 0] = 7  # a constant feature
    test = rng.integers(0, 256, (m, *shape), dtype=np.uint8)
    return RawDataset(
        name="toy",
        kind="images",
        train_x=ArrayImages(train),
        train_y=rng.integers(0, 3, n).astype(np.int32),
        test_x=ArrayImages(test),
        test_y=rng.integers(0, 3, m),
        class_names=("a", "b", "c"),
        fingerprint=fingerprint,
        train_instance=np.arange(n) // 5,
        train_frame=np.arange(n) % 5,
    )


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """A randomly initialised (seeded) MobileNetV2 state_dict standing in for ImageNet's."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("w") / "mnv2.pth"
    torch.save(MobileNetV2().state_dict(), path)
    return str(path)


# ---------------------------------------------------------------------------- MobileNetV2


def test_parameter_count_matches_torchvision():
    assert sum(p.numel() for p in MobileNetV2().parameters()) == 3_504_872


def test_state_dict_keys_match_torchvision():
    sd = MobileNetV2().state_dict()
    known = {
        "features.0.0.weight": (32, 3, 3, 3),
        "features.0.1.running_var": (32,),
        "features.0.1.num_batches_tracked": (),
        "features.1.conv.0.0.weight": (32, 1, 3, 3),
        "features.1.conv.1.weight": (16, 32, 1, 1),
        "features.1.conv.2.bias": (16,),
        "features.2.conv.0.0.weight": (96, 16, 1, 1),
        "features.2.conv.1.0.weight": (96, 1, 3, 3),
        "features.2.conv.2.weight": (24, 96, 1, 1),
        "features.17.conv.3.running_mean": (320,),
        "features.18.0.weight": (1280, 320, 1, 1),
        "features.18.1.weight": (1280,),
        "classifier.1.weight": (1000, 1280),
        "classifier.1.bias": (1000,),
    }
    assert {k: tuple(sd[k].shape) for k in known} == known
    assert len(sd) == 314


def test_state_dict_round_trips_strict(weights):
    model = load_mobilenet_v2(weights)
    saved = torch.load(weights, weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_wrong_weights_give_clear_error(tmp_path):
    path = tmp_path / "bad.pth"
    torch.save({"fc.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(WeightsError, match="not a torchvision mobilenet_v2 state_dict"):
        load_mobilenet_v2(path)
    with pytest.raises(WeightsError, match="314 missing keys"):
        extract(make_raw(4, 2), "mobilenet_v2", weights=str(path), progress=False)


def test_offline_error_mentions_weights_option(monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(WeightsError, match="--weights PATH") as info:
        load_mobilenet_v2()
    assert "could not download" in str(info.value).lower()


# ---------------------------------------------------------------------------- extractors


def test_pixels_standardized_with_train_stats():
    raw = make_raw()
    fs = extract(raw, "pixels")
    assert fs.train_z.shape == (40, 64) and fs.test_z.shape == (10, 64)
    assert fs.train_z.dtype == np.float32 and fs.train_z.flags.c_contiguous
    assert fs.train_y.dtype == np.int64 and fs.train_instance.dtype == np.int64
    np.testing.assert_allclose(fs.train_z.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(fs.train_z.std(0)[1:], 1, atol=1e-4)
    assert np.all(fs.train_z[:, 0] == 0)  # constant feature: centred, not blown up
    x = raw.train_x.images.reshape(40, -1) / 255.0
    xt = raw.test_x.images.reshape(10, -1) / 255.0
    std = np.maximum(x.std(0), 0.05)
    np.testing.assert_allclose(fs.test_z, (xt - x.mean(0)) / std, atol=1e-4)
    # a rare bright value on an almost always dark pixel stays bounded: |z| <= 1 / 0.05
    assert np.abs(fs.test_z).max() <= 20 + 1e-4


def test_pixels_bound_rare_values_on_near_constant_pixels():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (200, 4, 4), dtype=np.uint8)
    images[:, 0, 0] = 0
    images[0, 0, 0] = 255  # one bright value on a border pixel that is dark in 199 images
    raw = dataclasses.replace(make_raw(), train_x=ArrayImages(images),
                              train_y=np.arange(200) % 3, train_instance=None, train_frame=None,
                              test_x=ArrayImages(images[:10]))
    fs = extract(raw, "pixels")
    assert np.abs(fs.train_z).max() <= 20 + 1e-4
    assert fs.train_z[0, 0] > 10  # still clearly an outlier, just not ~ 200


class MixedSizes:
    """An ImageSource whose images differ in size (returns lists)."""

    def __init__(self, n: int):
        self.imgs = [np.full((6 + i % 3, 7, 3), 10 * i, np.uint8) for i in range(n)]

    def __len__(self) -> int:
        return len(self.imgs)

    def get_batch(self, idx):
        return [self.imgs[i] for i in idx]


def test_pixels_refuses_mixed_sizes():
    raw = dataclasses.replace(make_raw(), train_x=MixedSizes(5))
    with pytest.raises(ValueError, match="mobilenet_v2"):
        extract(raw, "pixels")


def test_preprocess_resizes_to_224_and_normalizes():
    gray = np.full((2, 10, 12), 128, np.uint8)
    x = preprocess(gray)
    assert x.shape == (2, 3, 224, 224)
    expected = (128 / 255 - torch.tensor(features.IMAGENET_MEAN)) / torch.tensor(
        features.IMAGENET_STD
    )
    torch.testing.assert_close(x[0, :, 100, 100], expected)
    assert preprocess(MixedSizes(3).get_batch([0, 1, 2])).shape == (3, 3, 224, 224)


def test_mobilenet_features_shape_finite_deterministic(weights, monkeypatch):
    seen = []
    model = load_mobilenet_v2(weights)
    model.features[0].register_forward_pre_hook(lambda mod, inp: seen.append(inp[0].shape))
    monkeypatch.setattr(features, "load_mobilenet_v2", lambda *a, **k: model)
    raw = make_raw(3, 2, shape=(16, 20, 3))
    a = extract(raw, "mobilenet_v2", weights=weights, batch_size=2, progress=False)
    b = extract(raw, "mobilenet_v2", weights=weights, batch_size=3, progress=False)
    assert a.train_z.shape == (3, 1280) and a.test_z.shape == (2, 1280)
    assert a.train_z.dtype == np.float32 and np.isfinite(a.train_z).all()
    assert np.abs(a.train_z).sum() > 0
    np.testing.assert_allclose(a.train_z, b.train_z, rtol=1e-5, atol=1e-6)
    assert all(s[1:] == (3, 224, 224) for s in seen)
    gray = extract(make_raw(2, 1, shape=(9, 9)), "mobilenet_v2", weights=weights, progress=False)
    assert gray.train_z.shape == (2, 1280)


# ---------------------------------------------------------------------------- cache


@pytest.fixture
def counted(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = features.extract

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(features, "extract", counting)
    return calls


def assert_same(a, b) -> None:
    assert a.key == b.key and a.class_names == b.class_names
    for k in ("train_z", "train_y", "test_z", "test_y", "train_instance", "train_frame"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
        assert getattr(a, k).dtype == getattr(b, k).dtype


def test_cache_hit(tmp_path, counted):
    raw = make_raw()
    first = get_features(raw, "pixels", cache_dir=tmp_path)
    second = get_features(raw, "pixels", cache_dir=tmp_path)
    assert len(counted) == 1
    assert_same(first, second)
    assert [p.name for p in tmp_path.iterdir()] == [f"{first.key}.npz"]  # no temp files left
    get_features(raw, "pixels", cache_dir=tmp_path, rebuild=True)
    assert len(counted) == 2


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_arrays(path: Path) -> None:  # a valid zip whose arrays fail the sha256
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["train_z"] = arrays["train_z"] + 1
    np.savez(path, **arrays)


@pytest.mark.parametrize("damage", [truncate, flip_byte, edit_arrays])
def test_damaged_cache_entry_is_rebuilt(tmp_path, counted, caplog, damage):
    raw = make_raw()
    first = get_features(raw, "pixels", cache_dir=tmp_path)
    damage(tmp_path / f"{first.key}.npz")
    with caplog.at_level(logging.WARNING, logger="ciosl.data.features"):
        again = get_features(raw, "pixels", cache_dir=tmp_path)
    assert len(counted) == 2 and "rebuilding" in caplog.text
    assert_same(first, again)
    assert_same(first, get_features(raw, "pixels", cache_dir=tmp_path))
    assert len(counted) == 2


def test_stale_entry_is_detected(tmp_path):
    fs = get_features(make_raw(), "pixels", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="stale"):
        features.load_features(tmp_path / f"{fs.key}.npz", "other-key")


def test_key_depends_on_fingerprint_extractor_weights(tmp_path, weights):
    raw = make_raw()
    other = tmp_path / "other.pth"
    other.write_bytes(b"x")
    keys = {
        cache_key(raw, "pixels"),
        cache_key(dataclasses.replace(raw, fingerprint="fp1"), "pixels"),
        cache_key(raw, "mobilenet_v2"),
        cache_key(raw, "mobilenet_v2", weights),
        cache_key(raw, "mobilenet_v2", str(other)),
    }
    assert len(keys) == 5
    assert cache_key(raw, "pixels") == cache_key(make_raw(), "pixels")
    assert get_features(raw, "pixels", cache_dir=tmp_path).key == cache_key(raw, "pixels")


def test_feature_datasets_and_bad_extractors():
    raw = make_raw()
    z = RawDataset(
        name="f",
        kind="features",
        train_x=np.ones((4, 3)),
        train_y=np.zeros(4),
        test_x=np.ones((2, 3)),
        test_y=np.zeros(2),
        class_names=("a",),
        fingerprint="f",
    )
    fs = get_features(z)
    assert fs.extractor == "none" and fs.train_z.dtype == np.float32 and fs.dim == 3
    with pytest.raises(ValueError, match="unknown extractor .*valid choices"):
        extract(raw, "resnet")
    with pytest.raises(ValueError, match="holds images"):
        extract(raw, "none")


def test_digits_end_to_end(tmp_path):
    from ciosl.data import datasets

    raw = datasets.load_dataset("digits")  # ships with scikit-learn: always present
    fs = get_features("digits", cache_dir=tmp_path, progress=False)  # default: pixels
    assert fs.train_z.shape == (len(raw.train_y), 64) and fs.dataset == "digits"
    assert fs.key == get_features("digits", "pixels", cache_dir=tmp_path).key


# ---------------------------------------------------------------------------- weights files


def test_weights_files_beyond_any_mobile_network_are_refused_unread(tmp_path, capsys):
    big = tmp_path / "big.pth"
    with open(big, "wb") as f:
        f.truncate(2**30 + 1)  # sparse: nothing to read
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--extractor", "efficientnet_lite0",
                                                "--weights", str(big))))
    assert line == (f"error: --weights {big}: {2**30 + 1} bytes, more than the {2**30} this "
                    "reader accepts")
    line = one_line_error(*cli(capsys, ["features", "--dataset", "digits", "--extractor",
                                        "efficientnet_lite0", "--weights", str(big), "--cache",
                                        str(tmp_path / "c")]))
    assert "weights file" in line and "more than the 1073741824 this reader accepts" in line


def test_unreadable_weights_get_no_advice_to_load_them_unsafely(tmp_path, capsys):
    import torch

    junk = tmp_path / "junk.pth"
    torch.save({"w": np.arange(3)}, junk)  # a NumPy array: refused by weights_only=True
    line = one_line_error(*cli(capsys, ["features", "--dataset", "digits", "--extractor",
                                        "efficientnet_lite0", "--weights", str(junk), "--cache",
                                        str(tmp_path / "c")]))
    assert f"Could not read EfficientNet-Lite0 weights from {junk}: " in line
    assert line.endswith("it is not a plain tensor state_dict (torch.load with weights_only=True "
                         "refused it; ciosl never loads weights any other way)")
    assert "can still be loaded" not in line and "trust the source" not in line


# ---------------------------------------------------------------------------- features refused


def _runner(kind: str, backend: str):
    """A runner whose features are all alike (``constant``) or hold a NaN (``nan``)."""
    from ciosl.data import runtime

    def call(x):
        z = np.full((len(x), 1280), 0.25, np.float32)
        if kind == "nan":
            z[min(3, len(z) - 1), 5] = np.nan
        return z

    return lambda *a, **k: runtime.Runner(call, 8, 1, backend, "cpu")


def _alike(raw: RawDataset) -> RawDataset:
    same = np.repeat(raw.train_x.get_batch(np.arange(1)), len(raw.train_y), axis=0)
    return dataclasses.replace(raw, train_x=ArrayImages(same))


REFUSED_FEATURES = [  # (extractor, backend, what goes wrong, the message)
    ("pixels-images-alike", "pixels", None, "alike",
     "extractor 'pixels' gave the same features for all 40 train images"),
    ("efficientnet-torch-constant", "efficientnet_lite0@32", "torch", "constant",
     "extractor EfficientNet-Lite0@32 (torch on cpu) gave the same features for all 40 train "
     "images"),
    ("efficientnet-torch-nan", "efficientnet_lite0@32", "torch", "nan",
     "extractor EfficientNet-Lite0@32 (torch on cpu) gave NaN or infinite features for train "
     "image 3 (5 of 40 images)"),
    ("efficientnet-onnxruntime-constant", "efficientnet_lite0@32", "onnxruntime", "constant",
     "extractor EfficientNet-Lite0@32 (onnxruntime on cpu) gave the same features"),
    ("mobilenet-torch-constant", "mobilenet_v2", "torch", "constant",
     "extractor MobileNetV2 (torch on cpu) gave the same features for all 40 train images"),
]


@pytest.mark.parametrize(("extractor", "backend", "wrong", "message"),
                         [c[1:] for c in REFUSED_FEATURES], ids=[c[0] for c in REFUSED_FEATURES])
def test_features_alike_or_not_finite_are_refused_naming_the_extractor_and_never_cached(
        extractor, backend, wrong, message, tmp_path, monkeypatch):
    from ciosl.data import runtime

    raw = make_raw()
    if wrong == "alike":
        raw = _alike(raw)
    else:
        name = "ort_runner" if backend == "onnxruntime" else "torch_runner"
        monkeypatch.setattr(runtime, name, _runner(wrong, backend))
        monkeypatch.setattr(features, "load_mobilenet_v2", lambda *a, **k: MobileNetV2())
    with pytest.raises(ValueError) as info:
        get_features(raw, extractor, cache_dir=tmp_path, progress=False, backend=backend)
    assert message in str(info.value) and "refused, nothing cached" in str(info.value)
    assert not list(tmp_path.glob("*.npz"))


def test_a_poisoned_feature_cache_entry_is_not_used(tmp_path, caplog):
    raw = make_raw()
    real = get_features(raw, "pixels", cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.npz")
    poisoned = dataclasses.replace(real, train_z=np.zeros_like(real.train_z))
    features.save_features(poisoned, path)  # a valid entry, checksum and all
    with caplog.at_level(logging.WARNING):
        again = get_features(raw, "pixels", cache_dir=tmp_path, progress=False)
    assert "gave the same features for all 40 train images" in caplog.text
    assert f"Feature cache entry {path} is unreadable" in caplog.text
    assert np.array_equal(again.train_z, real.train_z)
    assert np.array_equal(features.load_features(path, real.key).train_z, real.train_z)


def test_an_onnx_path_giving_features_alike_falls_back_to_torch(tmp_path, monkeypatch, caplog):
    from ciosl.data import runtime

    monkeypatch.setattr(runtime, "ort_runner", _runner("constant", "onnxruntime"))
    raw = make_raw(n=12, m=4)
    with caplog.at_level(logging.WARNING):
        fs = get_features(raw, "efficientnet_lite0@32", cache_dir=tmp_path, progress=False)
    assert "ONNX Runtime failed (ValueError: extractor EfficientNet-Lite0@32 (onnxruntime on " \
           "cpu) gave the same features" in caplog.text
    assert fs.key == cache_key(raw, "efficientnet_lite0@32")  # the torch path's entry
    assert np.ptp(fs.train_z, axis=0).max() > 0


def test_ciosl_features_on_images_all_alike_is_one_line_naming_the_extractor(tmp_path, capsys):
    folder = tmp_path / "fashion"
    folder.mkdir()
    image = np.random.default_rng(0).integers(0, 256, (28, 28)).astype(np.uint8)
    for split, count in (("train", 20), ("t10k", 10)):
        images = np.repeat(image[None], count, axis=0)  # every image the same
        for stem, a in ((f"{split}-images-idx3-ubyte", images),
                        (f"{split}-labels-idx1-ubyte", np.arange(count) % 10)):
            header = bytes([0, 0, 0x08, a.ndim]) + np.asarray(a.shape, ">u4").tobytes()
            (folder / stem).write_bytes(header + a.astype(np.uint8).tobytes())
    line = one_line_error(*cli(capsys, ["features", "--dataset", "fashion-mnist", "--data",
                                        str(folder), "--extractor", "pixels", "--cache",
                                        str(tmp_path / "cache")]))
    assert line.startswith("error: extractor 'pixels' gave the same features for all 20 train "
                           "images (an extractor that ignores its input, or images that are "
                           "all alike): refused, nothing cached")
    assert not list((tmp_path / "cache").rglob("*.npz"))


def _rows(change=None) -> np.ndarray:
    z = np.full((10, 4), 0.5, np.float32)
    if change:
        change(z)
    return z


CHECKED_IN_BLOCKS = [  # (features of 10 images, checked 3 rows at a time; None: accepted)
    ("all-alike", _rows(), "gave the same features for all 10 train images"),
    ("nan-in-a-later-block", _rows(lambda z: (z.__setitem__((7, 1), np.nan),
                                              z.__setitem__((9, 0), np.inf))),
     "gave NaN or infinite features for train image 7 (2 of 10 images)"),
    ("one-image-differs-in-the-last-block", _rows(lambda z: z.__setitem__((9, 3), 0.25)), None),
]


@pytest.mark.parametrize(("z", "message"), [c[1:] for c in CHECKED_IN_BLOCKS],
                         ids=[c[0] for c in CHECKED_IN_BLOCKS])
def test_extracted_features_are_checked_block_by_block(z, message, monkeypatch):
    monkeypatch.setattr(features, "CHECK_ROWS", 3)
    if message is None:
        features.check_extracted(z, "'x'", "train")
        return
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        features.check_extracted(z, "'x'", "train")
