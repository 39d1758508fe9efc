"""Where and how the extractors run (ciosl.data.runtime): device and backend selection, the
one-line errors, threads, the ONNX export and its cache, the torch fallback, cache keys kept
apart per path, progress lines without a terminal, and the offline reference's device."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime  # noqa: F401  (the [onnx] extra, in [dev]: the suite fails without it)
import pytest
import torch

from ciosl.cli import main
from ciosl.data import efficientnet, features, runtime
from ciosl.data.mobilenet import MobileNetV2, frozen
from ciosl.data.types import ArrayImages, RawDataset


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CIOSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CIOSL_DEVICE", raising=False)
    monkeypatch.delenv("CIOSL_BACKEND", raising=False)


@pytest.fixture(scope="module")
def lite0():
    return efficientnet.load_efficientnet_lite0()


def toy(n: int = 12, m: int = 5, side: int = 20) -> RawDataset:
    rng = np.random.default_rng(0)
    return RawDataset("toy", "images", ArrayImages(rng.integers(0, 256, (n, side, side), np.uint8)),
                      rng.integers(0, 2, n), ArrayImages(rng.integers(0, 256, (m, side, side),
                                                                      np.uint8)),
                      rng.integers(0, 2, m), ("a", "b"), "fp-toy")


# ---------------------------------------------------------------------------- selection


def test_device_selection(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.resolve_device(None) == "cpu"
    assert runtime.resolve_device("auto") == "cpu"
    assert runtime.resolve_device(" CPU ") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.resolve_device("auto") == "cuda"
    assert runtime.resolve_device(None) == "cuda"
    assert runtime.resolve_device("cpu") == "cpu"
    monkeypatch.setenv("CIOSL_DEVICE", "cpu")
    assert runtime.resolve_device(None) == "cpu"  # the variable, when no flag is given
    assert runtime.resolve_device("cuda") == "cuda"  # the flag wins


def test_an_unavailable_or_unknown_device_is_one_line_naming_the_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^--device cuda: no CUDA device here") as e:
        runtime.resolve_device("cuda")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"^--device 'gpu': expected one of auto, cpu, cuda$"):
        runtime.resolve_device("gpu")
    monkeypatch.setenv("CIOSL_DEVICE", "cuda")
    with pytest.raises(ValueError, match=r"^CIOSL_DEVICE cuda: no CUDA device here"):
        runtime.resolve_device(None)


@pytest.mark.parametrize("argv", [
    ["features", "--dataset", "digits", "--extractor", "efficientnet_lite0", "--device", "cuda"],
    ["run", "--dataset", "digits", "--method", "ncm", "--runs", "1", "--device", "cuda"],
])
def test_cli_refuses_cuda_without_one_in_one_line(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = main([*argv, "--cache", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "--device cuda" in err
    assert not (tmp_path / "c" / "features").exists()  # refused before any work


def test_backend_selection(monkeypatch):
    assert runtime.resolve_backend(None, "cpu") == "onnxruntime"
    assert runtime.resolve_backend("auto", "cuda") == "torch"  # ONNX Runtime's build: CPU only
    assert runtime.resolve_backend("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="^--backend onnxruntime runs on the CPU only"):
        runtime.resolve_backend("onnxruntime", "cuda")
    with pytest.raises(ValueError, match="^--backend 'tvm': expected one of"):
        runtime.resolve_backend("tvm", "cpu")
    monkeypatch.setenv("CIOSL_BACKEND", "torch")  # when no flag is given
    assert runtime.resolve_backend(None, "cpu") == "torch"
    assert runtime.resolve_backend("auto", "cpu") == "onnxruntime"
    monkeypatch.setenv("CIOSL_BACKEND", "fast")
    with pytest.raises(ValueError, match="^CIOSL_BACKEND 'fast': expected one of"):
        runtime.resolve_backend(None, "cpu")
    monkeypatch.delenv("CIOSL_BACKEND")
    monkeypatch.setattr(runtime, "onnxruntime_available", lambda: False)
    assert runtime.resolve_backend("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match=r'^--backend onnxruntime: onnx and onnxruntime are not '
                       r'installed \(the \[onnx\] extra\): pip install -e "\.\[onnx\]"'):
        runtime.resolve_backend("onnxruntime", "cpu")


def test_threads_default_to_every_available_core_as_workers_and_one_torch_thread(monkeypatch):
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert runtime.available_cores() == 3
    assert runtime.resolve_threads(None, "onnxruntime") == 3
    assert runtime.resolve_threads(None, "torch") == 1
    assert runtime.resolve_threads(2, "torch") == 2
    with pytest.raises(ValueError, match=r"^--threads 0: expected an integer >= 1$"):
        runtime.resolve_threads(0, "onnxruntime")


# ---------------------------------------------------------------------------- export


def test_export_folds_every_pad_and_agrees_with_the_module(lite0, tmp_path):
    import onnx

    data = runtime.export_onnx(lite0, 40)  # 40: asymmetric TF pads on the stride-2 layers
    ops = [n.op_type for n in onnx.load_from_string(data).graph.node]
    assert "Pad" not in ops and ops.count("Conv") == 49
    runner = runtime.ort_runner(lite0, "efficientnet_lite0", "w", 40, 1, tmp_path)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(5, 3, 40, 40)).astype(np.float32))
    with torch.inference_mode():
        ref = lite0.embed(x).numpy()
    assert np.abs(runner(x) - ref).max() <= 1e-4
    assert np.abs(ref).max() > 0.1  # features that could disagree


def test_mobilenet_export_agrees_with_the_module(tmp_path):
    torch.manual_seed(0)
    model = MobileNetV2()
    model = frozen(model, model.state_dict(), "random", "a mobilenet_v2")
    runner = runtime.ort_runner(model, "mobilenet_v2", "random", 32, 2, tmp_path)
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(3, 3, 32, 32)).astype(np.float32))
    with torch.inference_mode():
        ref = model.embed(x).numpy()
    scale = np.abs(ref).max()
    assert scale > 0 and np.abs(runner(x) - ref).max() <= 1e-4 * max(1.0, scale)


def test_the_export_is_cached_verified_and_redone_when_damaged(lite0, tmp_path, monkeypatch):
    calls = []
    real = runtime.export_onnx
    monkeypatch.setattr(runtime, "export_onnx", lambda m, s: calls.append(s) or real(m, s))
    a = runtime.cached_onnx(lite0, "efficientnet_lite0", "w1", 24, tmp_path)
    b = runtime.cached_onnx(lite0, "efficientnet_lite0", "w1", 24, tmp_path)
    assert a == b and calls == [24]  # the second came from the file
    runtime.cached_onnx(lite0, "efficientnet_lite0", "w2", 24, tmp_path)  # other weights
    runtime.cached_onnx(lite0, "efficientnet_lite0", "w1", 28, tmp_path)  # another size
    assert calls == [24, 24, 28]
    path = runtime.entry_path(lite0, "efficientnet_lite0", "w1", 24, tmp_path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert runtime.cached_onnx(lite0, "efficientnet_lite0", "w1", 24, tmp_path) == a
    assert calls == [24, 24, 28, 24]


def test_run_batches_covers_every_image_once_in_place():
    runner = runtime.Runner(lambda x: x, batch=3, workers=2, backend="b", device="cpu")
    spans = []
    got = dict(runtime.run_batches(runner, 10, lambda s, e: spans.append((s, e)) or (s, e)))
    assert sorted(spans) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert got == {0: 3, 3: 6, 6: 9, 9: 10}


# ---------------------------------------------------------------------------- extraction


def raw_features(monkeypatch) -> list[np.ndarray]:
    """Capture the networks' raw features (before standardisation) of each extraction."""
    seen = []
    real = features.standardize
    monkeypatch.setattr(features, "standardize",
                        lambda a, b: seen.append(np.concatenate([a, b])) or real(a, b))
    return seen


def test_onnxruntime_and_torch_features_agree_and_are_cached_apart(monkeypatch, tmp_path):
    seen = raw_features(monkeypatch)
    raw = toy()
    cache = tmp_path / "features"
    ort = features.get_features(raw, "efficientnet_lite0@32", cache_dir=cache, progress=False)
    ref = features.get_features(raw, "efficientnet_lite0@32", cache_dir=cache, progress=False,
                                backend="torch")
    assert np.abs(seen[0] - seen[1]).max() <= 1e-4
    assert ort.key != ref.key  # features that differ (by rounding) never share an entry
    assert ref.key == features.cache_key(raw, "efficientnet_lite0@32")  # the reference's key
    assert sorted(p.stem for p in cache.glob("*.npz")) == sorted([ort.key, ref.key])
    # each comes back from its own entry
    again = features.get_features(raw, "efficientnet_lite0@32", cache_dir=cache, progress=False)
    assert len(seen) == 2 and np.array_equal(again.train_z, ort.train_z)
    # threads change the work split, not the features
    two = features.extract(raw, "efficientnet_lite0@32", threads=2, progress=False)
    one = features.extract(raw, "efficientnet_lite0@32", threads=1, progress=False)
    assert np.array_equal(one.train_z, two.train_z) and one.key == ort.key


def test_cache_keys_per_path():
    raw = toy()
    key = lambda **k: features.cache_key(raw, "efficientnet_lite0", **k)  # noqa: E731
    keys = {key(), key(backend="onnxruntime"), key(device="cuda"),
            key(backend="onnxruntime", device="cuda")}
    assert len(keys) == 3  # on CUDA the torch module runs: one entry, whatever the backend
    assert features.cache_key(raw, "pixels", backend="onnxruntime") == features.cache_key(
        raw, "pixels")  # no network, nothing that differs


def test_a_failing_onnxruntime_falls_back_to_torch_with_a_warning(monkeypatch, caplog, tmp_path):
    def broken(*a, **k):
        raise RuntimeError("no session today")

    monkeypatch.setattr(runtime, "ort_runner", broken)
    raw = toy()
    with caplog.at_level(logging.WARNING):
        fs = features.get_features(raw, "efficientnet_lite0@32", cache_dir=tmp_path,
                                   progress=False)
    assert "ONNX Runtime failed (RuntimeError: no session today)" in caplog.text
    assert fs.key == features.cache_key(raw, "efficientnet_lite0@32", backend="torch")
    assert (tmp_path / f"{fs.key}.npz").exists()  # cached under the torch path's key
    with pytest.raises(RuntimeError, match="no session today"):  # asked for by name: an error
        features.extract(raw, "efficientnet_lite0@32", backend="onnxruntime", progress=False)


def test_progress_lines_without_a_terminal(monkeypatch, capsys):
    from ciosl.report import console

    now = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    on_start, on_progress = console.plain_progress("Net@64 (onnxruntime on cpu)", "images",
                                                   rates=True)
    on_start(1000)
    for _ in range(3):  # 10 s apart: only the one 30 s after the start prints
        now[0] += 10.0
        on_progress(100)
    assert capsys.readouterr().err.splitlines() == [
        "Net@64 (onnxruntime on cpu): 300 / 1,000 images (30%), 10 images/s, 1m10s left, "
        "0m30s elapsed"]


def test_an_extraction_without_a_terminal_prints_plain_progress(monkeypatch, capsys):
    from ciosl import progress

    monkeypatch.setattr(progress, "PLAIN_PROGRESS_SECONDS", 0.0)  # a line per batch
    features.extract(toy(n=40), "efficientnet_lite0@32", threads=1)
    lines = [x for x in capsys.readouterr().err.splitlines() if " left, " in x]
    batch = runtime.ort_batch(32)
    assert len(lines) == -(-40 // batch) + 1  # the train batches, then the one test batch
    assert lines[-1].startswith("EfficientNet-Lite0@32 (onnxruntime on cpu): 45 / 45 images "
                                "(100%), ")
    assert " images/s, 0m00s left, " in lines[-1]


# ---------------------------------------------------------------------------- offline reference


def test_the_offline_reference_trains_where_asked_and_keeps_the_cpu_cache_key(tmp_path,
                                                                               monkeypatch):
    from ciosl.data.orderings import make_ordering
    from ciosl.data.types import FeatureSet
    from ciosl.evaluation import protocol

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    fs = FeatureSet("blobs", "none", rng.normal(size=(60, 4)).astype(np.float32) + y[:, None],
                    y, rng.normal(size=(15, 4)).astype(np.float32), np.repeat(np.arange(3), 5),
                    ("a", "b", "c"), "blobs-key")
    order = make_ordering("iid", y, seed=0, base_fraction=0.2, classes_per_step=1)
    settings = protocol.OfflineSettings(epochs=2, batch_size=16)
    devices = []
    real = protocol.train_offline
    monkeypatch.setattr(protocol, "train_offline",
                        lambda *a, **k: devices.append(k["device"]) or real(*a, **k))
    a = protocol.offline_accuracy(fs, order, 1, settings, tmp_path)
    b = protocol.offline_accuracy(fs, order, 1, settings, tmp_path, device="cpu")
    assert a == b and devices == ["cpu"]  # the default is the CPU and the same cache entry
    monkeypatch.setattr(protocol, "train_offline", lambda *a, **k: devices.append(k["device"])
                        or real(*a, **{**k, "device": "cpu"}))
    protocol.offline_accuracy(fs, order, 1, settings, tmp_path, device="cuda")
    assert devices == ["cpu", "cuda"]  # another device: its own entry, trained there
    assert len(list((tmp_path / "offline").glob("*.json"))) == 2


def test_the_offline_learner_retrains_on_the_device_it_is_given(monkeypatch):
    from ciosl.learners import offline

    devices = []
    real = offline.train_offline
    monkeypatch.setattr(offline, "train_offline", lambda *a, **k: devices.append(k["device"])
                        or real(*a, **{**k, "device": "cpu"}))
    rng = np.random.default_rng(0)
    Z, y = rng.normal(size=(30, 3)).astype(np.float32), np.repeat(np.arange(3), 10)
    learner = offline.Offline(epochs=1, seed=0)
    monkeypatch.delenv("CIOSL_DEVICE", raising=False)
    # the first calls on a machine without CUDA (on a GPU machine auto would take it)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    learner.fit_base(Z, y)
    learner.predict(Z)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    learner.device = "cuda"  # what the runner sets from --device
    learner.learn_one(Z[0], 0)
    learner.predict(Z)
    assert devices == ["cpu", "cuda"]
    learner.device = None  # $CIOSL_DEVICE, else auto: CUDA when torch sees it
    learner.learn_one(Z[1], 1)
    learner.predict(Z)
    assert devices == ["cpu", "cuda", "cuda"]


def test_on_cuda_threads_sets_the_workers_handing_batches_to_the_gpu(monkeypatch):
    """The CUDA path's wiring (measured on an H200 by benchmarks/gpu_check.py; no GPU here):
    the runner gets ``--threads`` workers, default 1, and torch keeps one thread each."""
    from ciosl.data import features
    from ciosl.data.types import ArrayImages

    made, threads_seen = [], []
    real_runner = runtime.torch_runner
    monkeypatch.setattr(runtime, "torch_runner", lambda model, device, batch, workers=1:
                        made.append((device, workers)) or real_runner(model, "cpu", batch))
    model = torch.nn.Identity()
    model.embed = lambda x: threads_seen.append(torch.get_num_threads()) or x.flatten(1)[:, :4]
    images = np.random.default_rng(0).integers(0, 256, (5, 8, 8), np.uint8)  # alike: refused
    src = {"train": ArrayImages(images)}
    for threads, workers in ((None, 1), (3, 3)):
        how = features.Execution("cuda", "torch", threads)
        out, backend = features._run("x", model, "efficientnet_lite0", lambda: "w", 8,
                                     lambda b: features.efficientnet_input(b, 8), src, 2,
                                     False, how)
        assert backend == "torch" and out["train"].shape == (5, 4)
        assert made[-1] == ("cuda", workers)
    assert set(threads_seen) == {1}


# ---------------------------------------------------------------------------- the ONNX cache's trust


class Tiny(torch.nn.Module):
    """A small network with ``embed``, exported in a second: the cache's mechanics, not the
    features (``test_a_replaced_export_is_caught_end_to_end`` runs EfficientNet-Lite0)."""

    def __init__(self, seed: int = 0, constant: bool = False, width: int = 16):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.constant = constant

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.nn.functional.relu(self.conv(x)).mean((2, 3))  # (b, 16)
        return z * 0 + 0.5 if self.constant else z


def tiny(**kw) -> torch.nn.Module:
    return Tiny(**kw).eval().requires_grad_(False)


def rewrite_manifest(path, data: bytes) -> None:
    """What the red team did: the model replaced, its checksum rewritten to match."""
    import hashlib
    import json

    man = runtime.manifest_path(path)
    manifest = json.loads(man.read_text())
    manifest["sha256"] = hashlib.sha256(data).hexdigest()
    man.write_text(json.dumps(manifest))
    path.write_bytes(data)


REPLACED_CASES = [  # (what takes the export's place, the warning's words)
    ("constant-model", lambda: runtime.export_onnx(tiny(constant=True), 16),
     "does not compute what the torch module computes"),
    ("other-weights", lambda: runtime.export_onnx(tiny(seed=1), 16),
     "does not compute what the torch module computes"),
    ("other-input-size", lambda: runtime.export_onnx(tiny(), 24),
     "ONNX Runtime cannot run it on the probe batch"),
    ("not-a-model", lambda: b"\x08\x07" * 100, "ONNX Runtime cannot run it on the probe batch"),
]


@pytest.mark.parametrize(("replacement", "words"), [c[1:] for c in REPLACED_CASES],
                         ids=[c[0] for c in REPLACED_CASES])
def test_a_replaced_export_with_a_matching_checksum_is_caught_and_exported_again(
        replacement, words, tmp_path, monkeypatch, caplog):
    model, calls, bad = tiny(), [], replacement()
    real = runtime.export_onnx
    monkeypatch.setattr(runtime, "export_onnx", lambda m, s: calls.append(s) or real(m, s))
    good = runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    path = runtime.entry_path(model, "tiny", "w", 16, tmp_path)
    rewrite_manifest(path, bad)
    runtime._VERIFIED.clear()  # a new process
    with caplog.at_level(logging.WARNING):
        again = runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    assert again == good and len(calls) == 2  # the replacement was not used: exported again
    assert f"ONNX cache file {path}: {words}" in caplog.text and "exporting again" in caplog.text
    assert path.read_bytes() == good  # and the entry holds the real export again


BINDING_CASES = [  # (what changes, how): each is another entry
    ("weights-values", lambda m, mp: m.conv.weight.add_(1e-3)),
    ("weights-id", None),
    ("module-source", lambda m, mp: mp.setattr(runtime, "source_digest", lambda _: "edited")),
    ("exporter-settings", lambda m, mp: mp.setitem(runtime.EXPORTER, "example_batch", 3)),
    ("onnxruntime-version", lambda m, mp: mp.setattr(__import__("onnxruntime"), "__version__",
                                                      "0.0")),
]


@pytest.mark.parametrize("change", [c[1] for c in BINDING_CASES],
                         ids=[c[0] for c in BINDING_CASES])
def test_an_entry_is_bound_to_what_produced_it(change, tmp_path, monkeypatch):
    model = tiny()
    before = runtime.entry_path(model, "tiny", "w", 16, tmp_path)
    with torch.no_grad():
        if change is not None:
            change(model, monkeypatch)
    after = runtime.entry_path(model, "tiny", "w" if change else "w2", 16, tmp_path)
    assert after != before


def test_an_entry_whose_manifest_names_another_producer_is_exported_again(tmp_path, caplog):
    import json

    model = tiny()
    runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    path = runtime.entry_path(model, "tiny", "w", 16, tmp_path)
    man = runtime.manifest_path(path)
    manifest = json.loads(man.read_text())
    manifest["producer"]["params"] = "0" * 64  # the entry claims other weights
    man.write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    assert f"ONNX cache entry {path} was made by something else" in caplog.text
    assert json.loads(man.read_text())["producer"]["params"] == runtime.params_digest(model)


def test_a_fresh_export_that_disagrees_with_the_module_is_refused(tmp_path, monkeypatch):
    wrong = runtime.export_onnx(tiny(seed=1), 16)
    monkeypatch.setattr(runtime, "export_onnx", lambda m, s: wrong)  # an exporter gone wrong
    with pytest.raises(ValueError, match=r"the ONNX export of tiny at 16x16: does not compute "
                                         r"what the torch module computes \(max difference"):
        runtime.cached_onnx(tiny(), "tiny", "w", 16, tmp_path)
    assert not list(tmp_path.rglob("*.onnx"))  # nothing cached


def _fifo(p):
    import os

    os.mkfifo(p)


def _dev_zero(p):
    p.symlink_to("/dev/zero")


NOT_REGULAR_CASES = [  # (what is in place of which file of the entry, the warning's words)
    ("fifo-as-model", "model", _fifo, "not a regular file (a FIFO (named pipe))"),
    ("fifo-as-manifest", "manifest", _fifo, "not a regular file (a FIFO (named pipe))"),
    ("dev-zero-link-as-model", "model", _dev_zero, "not a regular file (a character device)"),
    ("dev-zero-link-as-manifest", "manifest", _dev_zero,
     "not a regular file (a character device)"),
    ("folder-as-model", "model", lambda p: p.mkdir(), "not a regular file (a folder)"),
]


@pytest.fixture
def hang_guard():
    """Ends a test that would block for good (a FIFO read): an error, never a hang. Generous:
    a loaded machine never reaches it."""
    import signal

    class Blocked(BaseException):  # no handler of OSError (TimeoutError is one) swallows it
        pass

    def stop(*_):
        raise Blocked("blocked reading the ONNX cache")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(300)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(("which", "make", "words"), [c[1:] for c in NOT_REGULAR_CASES],
                         ids=[c[0] for c in NOT_REGULAR_CASES])
def test_the_onnx_cache_reads_regular_files_only(which, make, words, tmp_path, caplog,
                                                 hang_guard):
    model = tiny()
    path = runtime.entry_path(model, "tiny", "w", 16, tmp_path)
    target = path if which == "model" else runtime.manifest_path(path)
    path.parent.mkdir(parents=True)
    make(target)
    with caplog.at_level(logging.WARNING):
        data = runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    assert data == runtime.export_onnx(model, 16)  # exported for this run
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith(f"{target}: ONNX cache: {words}: not read and not replaced")
    assert target.is_symlink() or not target.is_file()  # left as it was


def test_the_onnx_cache_reads_at_most_its_cap(tmp_path, caplog, monkeypatch):
    model = tiny()
    runtime.cached_onnx(model, "tiny", "w", 16, tmp_path)
    path = runtime.entry_path(model, "tiny", "w", 16, tmp_path)
    monkeypatch.setattr(runtime, "MAX_ONNX_BYTES", 100)
    with caplog.at_level(logging.WARNING):
        assert runtime.cached_onnx(model, "tiny", "w", 16, tmp_path) == path.read_bytes()
    assert f"ONNX cache entry {path} is unreadable (ONNX cache file {path}: larger than the " \
           "100 bytes this reader accepts); exporting again." in caplog.text


def test_a_replaced_export_is_caught_end_to_end(tmp_path, caplog):
    """The red team's case: another valid model, of the same output width, whose features are
    all alike, in place of EfficientNet-Lite0's export, its checksum rewritten to match."""
    raw = toy()
    cache = tmp_path / "cache"
    first = features.get_features(raw, "efficientnet_lite0@32", cache_dir=cache / "features",
                                  progress=False)
    (path,) = (cache / "onnx").glob("*.onnx")
    rewrite_manifest(path, runtime.export_onnx(tiny(constant=True, width=1280), 32))
    runtime._VERIFIED.clear()  # a new process
    with caplog.at_level(logging.WARNING):
        again = features.get_features(raw, "efficientnet_lite0@32",
                                      cache_dir=cache / "features", progress=False,
                                      rebuild=True)
    assert f"ONNX cache file {path}: does not compute what the torch module computes" \
        in caplog.text
    assert again.key == first.key and np.array_equal(again.train_z, first.train_z)
    assert np.ptp(again.train_z, axis=0).max() > 0  # features that differ between images
