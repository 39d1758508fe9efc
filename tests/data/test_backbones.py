"""The user's own backbones: ``onnx:PATH[@S]`` (on models the tests export: ciosl's own
EfficientNet-Lite0 with a classifier on top, and tiny ones for the layouts) and
``module:package.module:callable``; features equal efficientnet_lite0's under the same
preprocessing, the pre-logit tensor, --layer, sizes, normalisation, errors, the cache key."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from ciosl.data import backbones as bbs
from ciosl.data import efficientnet, runtime
from ciosl.data import features as feat
from helpers import cli, one_line_error

SIDE = 32
LITE_NORM = bbs.Options(mean=(127 / 255,) * 3, std=(128 / 255,) * 3)  # (x - 127) / 128


class LiteWithHead(nn.Module):
    """ciosl's EfficientNet-Lite0 and a 10-way linear classifier on its 1280 features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = runtime.specialise(efficientnet.load_efficientnet_lite0(None), SIDE)
        self.fc = nn.Linear(1280, 10)

    def forward(self, x):
        return self.fc(self.body.embed(x))


def export(model: nn.Module, path: Path, shape, dynamic=None) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.zeros(*shape),), str(path), dynamo=False,
                          input_names=["img"], output_names=["out"], opset_version=17,
                          dynamic_axes=dynamic)
    return path


class Tiny(nn.Module):
    def __init__(self, nhwc=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.nhwc = nhwc
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def lite_onnx(tmp_path_factory):
    return export(LiteWithHead(), tmp_path_factory.mktemp("m") / "lite.onnx",
                  (2, 3, SIDE, SIDE), {"img": {0: "b"}, "out": {0: "b"}})


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("imgs") / "d"
    rng = np.random.default_rng(1)
    for split, n in (("train", 3), ("test", 1)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(
                    root / split / c / f"{i}.png")
    return f"folder:{root}"


def features(name, extractor, tmp, **kw):
    return feat.get_features(name, extractor, cache_dir=tmp / "cache", progress=False, **kw)


# ---------------------------------------------------------------- onnx:PATH


def test_onnx_lite0_with_a_classifier_gives_efficientnet_lite0s_features(lite_onnx, images,
                                                                         tmp_path):
    bb = bbs.resolve(f"onnx:{lite_onnx}", LITE_NORM)
    assert bb.size == (SIDE, SIDE) and bb.layout == "NCHW"
    assert "final Gemm" in bb.why  # the pre-logit tensor, not the logits
    got = features(images, f"onnx:{lite_onnx}", tmp_path, options=LITE_NORM)
    ref = features(images, f"efficientnet_lite0@{SIDE}", tmp_path, backend="torch")
    assert got.train_z.shape == ref.train_z.shape == (6, 1280)
    np.testing.assert_allclose(got.train_z, ref.train_z, atol=2e-3)
    np.testing.assert_allclose(got.test_z, ref.test_z, atol=2e-3)
    # the raw features too, before standardisation
    session, _ = bbs.onnx_session(bb, "cpu", 1)
    x = np.random.default_rng(2).integers(0, 256, (3, 20, 24, 3), dtype=np.uint8)
    with torch.inference_mode():
        want = efficientnet.load_efficientnet_lite0(None).embed(
            feat.efficientnet_input(x, SIDE)).numpy()
    z = bbs.onnx_call(bb, session)(bbs.normalized_input(x, bb.size, bb.mean, bb.std))
    np.testing.assert_allclose(z, want, atol=1e-4)


def test_the_run_says_which_tensor_and_layer_picks_another(lite_onnx, images, tmp_path,
                                                           capsys):
    rc, err = cli(capsys, ["features", "--dataset", images, "--extractor", f"onnx:{lite_onnx}",
                           "--cache", str(tmp_path / "c")])
    assert rc == 0, err
    assert "features = tensor" in err and "final Gemm" in err
    assert "ImageNet's mean and std, the default" in err
    logits = bbs.resolve(f"onnx:{lite_onnx}", bbs.Options(layer="out"))
    assert logits.tensor == "out"
    fs = features(images, f"onnx:{lite_onnx}", tmp_path, options=bbs.Options(layer="out"))
    assert fs.train_z.shape == (6, 10)


def test_sidecar_normalisation_equals_the_flags_and_the_default_is_imagenet(
        lite_onnx, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(lite_onnx.read_bytes())
    plain = bbs.resolve(f"onnx:{model}")
    assert (plain.mean, plain.std) == (bbs.IMAGENET_MEAN, bbs.IMAGENET_STD)
    Path(f"{model}.json").write_text(json.dumps({"mean": [0.5, 0.4, 0.3], "std": [0.2] * 3}))
    side = bbs.resolve(f"onnx:{model}")
    flags = bbs.resolve(f"onnx:{model}", bbs.Options((0.5, 0.4, 0.3), (0.2, 0.2, 0.2)))
    assert (side.mean, side.std) == (flags.mean, flags.std) == ((0.5, 0.4, 0.3), (0.2,) * 3)
    assert side.key_fields() == flags.key_fields() != plain.key_fields()


def test_dynamic_size_needs_at_s_and_layouts_and_fixed_batches(tmp_path, images):
    dyn = export(Tiny(), tmp_path / "dyn.onnx", (1, 3, 16, 16),
                 {"img": {0: "b", 2: "h", 3: "w"}, "out": {0: "b"}})
    with pytest.raises(ValueError, match=r"input size is dynamic.*@S"):
        bbs.resolve(f"onnx:{dyn}")
    assert bbs.resolve(f"onnx:{dyn}@24").size == (24, 24)
    nhwc = export(Tiny(nhwc=True), tmp_path / "nhwc.onnx", (1, 16, 16, 3), {"img": {0: "b"}})
    one = export(Tiny(), tmp_path / "one.onnx", (1, 3, 16, 16))  # batch fixed at 1
    b_nhwc, b_one = bbs.resolve(f"onnx:{nhwc}"), bbs.resolve(f"onnx:{one}")
    assert (b_nhwc.layout, b_one.layout, b_one.batch) == ("NHWC", "NCHW", 1)
    x = np.random.default_rng(0).integers(0, 256, (5, 16, 16, 3), dtype=np.uint8)
    zs = []
    for bb in (b_nhwc, b_one):
        session, _ = bbs.onnx_session(bb, "cpu", 1)
        zs.append(bbs.onnx_call(bb, session)(bbs.normalized_input(x, bb.size, bb.mean, bb.std)))
    with torch.inference_mode():
        t = Tiny()
        want = torch.relu(t.conv(bbs.normalized_input(x, (16, 16), bbs.IMAGENET_MEAN,
                                                      bbs.IMAGENET_STD))).mean(dim=(2, 3))
    for z in zs:  # the input of the final Gemm: the pooled conv features, 5 rows
        np.testing.assert_allclose(z, want.numpy(), atol=1e-5)


def test_cache_is_keyed_by_the_models_content(tmp_path, images, monkeypatch):
    model = export(Tiny(seed=0), tmp_path / "t.onnx", (1, 3, 16, 16), {"img": {0: "b"}})
    runs, real = [], feat.extract
    monkeypatch.setattr(feat, "extract", lambda *a, **k: runs.append(1) or real(*a, **k))
    a = features(images, f"onnx:{model}", tmp_path)
    b = features(images, f"onnx:{model}", tmp_path)
    assert len(runs) == 1 and a.key == b.key
    export(Tiny(seed=1), model, (1, 3, 16, 16), {"img": {0: "b"}})  # new weights, same path
    c = features(images, f"onnx:{model}", tmp_path)
    assert len(runs) == 2 and c.key != a.key


@pytest.mark.parametrize("kind, argv, fragment", [
    ("missing file", lambda t, m: ["--extractor", f"onnx:{t}/none.onnx"], "no such ONNX file"),
    ("not onnx", lambda t, m: ["--extractor", f"onnx:{t}/junk.onnx"], "not an ONNX model"),
    ("bad mean", lambda t, m: ["--extractor", f"onnx:{m}", "--mean", "a,b"], "--mean 'a,b'"),
    ("zero std", lambda t, m: ["--extractor", f"onnx:{m}", "--std", "0,1,1"], "std must be > 0"),
    ("mean without onnx", lambda t, m: ["--extractor", "pixels", "--mean", "0.5"],
     "apply to an onnx:PATH extractor"),
    ("unknown layer", lambda t, m: ["--extractor", f"onnx:{m}", "--layer", "nope"],
     "--layer 'nope': no such tensor"),
    ("size differs", lambda t, m: ["--extractor", f"onnx:{m}@64"], "takes 32x32 inputs"),
    ("bad module", lambda t, m: ["--extractor", "module:no_such_mod:make"],
     "ModuleNotFoundError"),
])
def test_errors_are_one_line(tmp_path, capsys, images, lite_onnx, kind, argv, fragment):
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    rc, err = cli(capsys, ["features", "--dataset", images, "--cache", str(tmp_path / "c"),
                           *argv(tmp_path, lite_onnx)])
    assert fragment in one_line_error(rc, err), kind


# ---------------------------------------------------------------- module:callable

USER = '''
import torch
from torch import nn
from ciosl.data import efficientnet


class Lite(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = efficientnet.load_efficientnet_lite0(None)

    def forward(self, x):
        return self.net.embed(x)


def make():
    return Lite(), {"size": 32, "mean": [127 / 255] * 3, "std": [128 / 255] * 3}


def make_perturbed():
    m = Lite()
    with torch.no_grad():
        m.net._conv_stem.weight[0, 0, 0, 0] += 1.0
    return m, {"size": 32, "mean": [127 / 255] * 3, "std": [128 / 255] * 3}


def make_own_prep():
    def prep(batch):
        return efficientnet.normalize(
            torch.nn.functional.interpolate(torch.as_tensor(batch).float().permute(0, 3, 1, 2),
                                            size=(32, 32), mode="bilinear", antialias=True,
                                            align_corners=False))
    return Lite(), prep


def not_a_pair():
    return 3


def no_size():
    return Lite(), {"mean": [0.5] * 3}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "bb47_user.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bb47_user"
    sys.modules.pop("bb47_user", None)


def test_module_callable_equals_efficientnet_lite0(user_module, images, tmp_path,
                                                   monkeypatch):
    ref = features(images, f"efficientnet_lite0@{SIDE}", tmp_path, backend="torch")
    runs, real = [], feat.extract
    monkeypatch.setattr(feat, "extract", lambda *a, **k: runs.append(1) or real(*a, **k))
    got = features(images, f"module:{user_module}:make", tmp_path)
    np.testing.assert_allclose(got.train_z, ref.train_z, atol=1e-4)
    own = features(images, f"module:{user_module}:make_own_prep", tmp_path)
    np.testing.assert_allclose(own.train_z, ref.train_z, atol=1e-4)
    again = features(images, f"module:{user_module}:make", tmp_path)
    other = features(images, f"module:{user_module}:make_perturbed", tmp_path)
    assert len(runs) == 3  # `make` a second time came from the cache
    assert again.key == got.key and len({got.key, own.key, other.key}) == 3
    assert bbs.resolve(f"module:{user_module}:make").wid != bbs.resolve(
        f"module:{user_module}:make_perturbed").wid


@pytest.mark.parametrize("callable_, fragment", [
    ("not_a_pair", "must return (nn.Module, preprocessing), got int"),
    ("no_size", "the preprocessing must be a callable or a dict with keys size"),
    ("missing", "AttributeError"),
])
def test_module_callable_that_returns_the_wrong_thing(user_module, images, tmp_path, capsys,
                                                      callable_, fragment):
    rc, err = cli(capsys, ["features", "--dataset", images, "--cache", str(tmp_path / "c"),
                           "--extractor", f"module:{user_module}:{callable_}"])
    assert fragment in one_line_error(rc, err)


@pytest.mark.parametrize("kind, sidecar, fragment", [
    ("not json", "{oops", "m.onnx.json: not a JSON file"),
    ("other key", '{"scale": 255}', "m.onnx.json: expected an object with keys mean, std, layer"),
    ("short mean", '{"mean": [0.5, 0.5]}', "m.onnx.json: mean must be 3 numbers"),
    ("no such layer", '{"layer": "nope"}', "--layer 'nope': no such tensor"),
])
def test_bad_sidecar_is_one_line_naming_it(tmp_path, capsys, images, lite_onnx, kind, sidecar,
                                           fragment):
    model = tmp_path / "m.onnx"
    model.write_bytes(lite_onnx.read_bytes())
    Path(f"{model}.json").write_text(sidecar)
    rc, err = cli(capsys, ["features", "--dataset", images, "--cache", str(tmp_path / "c"),
                           "--extractor", f"onnx:{model}"])
    assert fragment in one_line_error(rc, err), kind


def test_sidecar_layer_picks_the_tensor(tmp_path, lite_onnx):
    model = tmp_path / "m.onnx"
    model.write_bytes(lite_onnx.read_bytes())
    Path(f"{model}.json").write_text('{"layer": "out"}')
    bb = bbs.resolve(f"onnx:{model}")
    assert bb.tensor == "out" and "m.onnx.json's layer" in bb.why
    assert bbs.resolve(f"onnx:{model}", bbs.Options(layer=bbs.resolve(
        f"onnx:{lite_onnx}").tensor)).why == "--layer"  # the flag wins over the sidecar


@pytest.mark.parametrize("extra, fragment", [
    (["--layer", "nope"], "--layer 'nope': no such tensor"),
    (["--std", "-1"], "--std '-1': a std must be > 0"),
])
def test_run_refuses_a_bad_onnx_extractor_before_any_work(tmp_path, capsys, images, lite_onnx,
                                                          extra, fragment):
    rc, err = cli(capsys, ["run", "--dataset", images, "--method", "ncm", "--extractor",
                           f"onnx:{lite_onnx}", *extra, "--cache", str(tmp_path / "c"),
                           "--out", str(tmp_path / "o")])
    assert fragment in one_line_error(rc, err)
    assert not (tmp_path / "c").exists()


def test_run_refuses_a_malformed_module_extractor(tmp_path, capsys, images):
    rc, err = cli(capsys, ["run", "--dataset", images, "--method", "ncm", "--extractor",
                           "module:nocolon", "--out", str(tmp_path / "o")])
    assert "expected module:package.module:callable" in one_line_error(rc, err)


def test_run_streams_onnx_features(tmp_path, capsys, images, lite_onnx):
    rc, err = cli(capsys, ["run", "--dataset", images, "--method", "ncm", "--extractor",
                           f"onnx:{lite_onnx}", "--layer", "out", "--runs", "1", "--quiet",
                           "--ordering", "iid",
                           "--no-offline", "--cache", str(tmp_path / "c"),
                           "--out", str(tmp_path / "o")])
    assert rc == 0, err
    assert "features = tensor 'out' (--layer)" in err.replace("\n", " ")
    (result,) = (tmp_path / "o").rglob("*.json")
    assert "onnx" in result.name
