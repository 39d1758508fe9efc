"""One extractor opened once, for ``ciosl features`` and ``ciosl serve`` alike: the network,
its preprocessing and the runner that ``ciosl.data.runtime`` chooses for ``--device`` /
``--backend`` / ``--threads`` (``$CIOSL_DEVICE``, ``$CIOSL_BACKEND``).

``features._run`` and ``features._user_backbone`` build their runners with ``torch_path`` and
``onnx_path`` below; ``open_extractor`` builds the same ones for a server (``Extractor``), so a
served image goes through the preprocessing, export and session that the benchmark's features
went through. ``Extractor.pin`` is what a served folder records of it (docs/serve.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ciosl.data import backbones, runtime

logger = logging.getLogger(__name__)


def torch_path(model, device: str, batch: int, threads: int | None
               ) -> tuple[runtime.Runner, int]:
    """(runner, torch intra-op threads) of the torch module: on CUDA, ``threads`` workers
    (default 1) hand their batches to the GPU, one torch thread each; on the CPU one runner
    with ``threads`` intra-op threads (default 1)."""
    if device == "cuda":
        return runtime.torch_runner(model, device, batch,
                                    runtime.resolve_threads(threads, "torch")), 1
    return runtime.torch_runner(model, device, batch), runtime.resolve_threads(threads, "torch")


def onnx_path(bb: backbones.Backbone, device: str, threads: int | None) -> runtime.Runner:
    """The runner of an ``onnx:`` backbone: N single-threaded workers on the CPU (as
    ``runtime.ort_runner``), one on its CUDA provider."""
    runtime.require_onnxruntime(f"extractor {bb.name}")
    workers = runtime.resolve_threads(threads, "onnxruntime")
    session, on_gpu = backbones.onnx_session(bb, device, 1)
    return runtime.Runner(backbones.onnx_call(bb, session), bb.batch or backbones.ONNX_BATCH,
                          1 if on_gpu else workers, "onnxruntime", "cuda" if on_gpu else "cpu")


@dataclass
class Extractor:
    """``prepare(uint8 images) -> input tensor`` and ``forward(tensor) -> (n, d) float32``
    on ``runner``'s path; ``__call__`` is both."""

    name: str  # as given (--extractor)
    label: str
    runner: runtime.Runner
    prepare: Callable
    size: int | None  # the input side (None: the callable's own preprocessing)
    weights: str  # sha256 of the tensors the network computes with
    torch_threads: int = 1
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def backend(self) -> str:
        return self.runner.backend

    @property
    def device(self) -> str:
        return self.runner.device

    def pin(self) -> dict:
        """What a served folder records: the log holds this network's features."""
        return {"extractor": self.name, "size": self.size, "weights": self.weights,
                "backend": self.backend, "device": self.device}

    def forward(self, x: torch.Tensor) -> np.ndarray:
        """(n, d) float32 features of a prepared batch: at most ``runner.batch`` images per
        call, ``runner.workers`` calls at a time (a pool kept for the extractor's life), a batch
        of fewer than ``batch x workers`` images split evenly over the workers."""
        w = self.runner.workers  # a small batch is shared by the workers too (a served one)
        step = max(1, min(self.runner.batch, -(-len(x) // w))) if w > 1 else self.runner.batch
        spans = [(s, min(len(x), s + step)) for s in range(0, len(x), step)]
        with torch.inference_mode():
            if self.runner.workers <= 1 or len(spans) == 1:
                parts = [self.runner(x[s:e]) for s, e in spans]
            else:
                with self._lock:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(self.runner.workers,
                                                        thread_name_prefix="ciosl-extract")
                parts = list(self._pool.map(lambda se: self._call(x[se[0]:se[1]]), spans))
        z = np.concatenate([np.asarray(p, dtype=np.float32).reshape(len(p), -1)
                            for p in parts])
        return np.ascontiguousarray(z, dtype=np.float32)

    def _call(self, x: torch.Tensor) -> np.ndarray:
        with torch.inference_mode():
            return self.runner(x)

    def __call__(self, images) -> np.ndarray:
        with torch.inference_mode():
            return self.forward(self.prepare(images))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)


SERVED = ("a server takes efficientnet_lite0[@S], mobilenet_v2, onnx:PATH[@S] or "
          "module:package.module:callable")


def open_extractor(name: str, weights: str | Path | None = None, how=None,
                   options: backbones.Options | None = None, where: str = "--extractor"
                   ) -> Extractor:
    """The extractor ``name`` on ``how``'s path (``features.execution``: device, backend,
    threads; default: ``$CIOSL_DEVICE`` / ``$CIOSL_BACKEND``, else auto). ONNX Runtime asked
    for by ``auto`` falls back to the torch module, with a warning, when its export fails."""
    from ciosl.data import efficientnet, features
    from ciosl.data.mobilenet import load_mobilenet_v2, weights_id

    how = how or features.execution()
    if backbones.is_user_backbone(name):
        bb = backbones.resolve(name, options)
        how = features._user_execution(bb, how)
        if bb.module is None:
            runner = onnx_path(bb, how.device, how.threads)

            def prepare(b):
                return backbones.normalized_input(b, bb.size, bb.mean, bb.std)
            return Extractor(name, bb.label, runner, prepare, bb.size[0] or None, bb.wid)

        def prepare_module(b):
            if bb.prepare_fn is not None:
                return bb.prepare_fn(b)
            return backbones.normalized_input(b, bb.size, bb.mean, bb.std, how.device)
        runner, threads = torch_path(bb.module, how.device, features.EFFICIENTNET_BATCH,
                                     how.threads)
        return Extractor(name, bb.label, runner, prepare_module, bb.size[0] or None, bb.wid,
                         threads)
    try:
        base, size = features.parse_extractor(name)
    except ValueError as e:
        raise ValueError(f"{where} {name}: {e}; {SERVED}") from None
    if base == "efficientnet_lite0":
        model, network = efficientnet.load_efficientnet_lite0(weights), base
        wid, label = efficientnet.weights_id(weights), f"EfficientNet-Lite0@{size}"
        batch = features.EFFICIENTNET_BATCH

        def prepare_lite(b):
            return features.efficientnet_input(b, size, how.device)
        prepare = prepare_lite
    elif base == "mobilenet_v2":
        model, network = load_mobilenet_v2(weights, progress=False), base
        wid, label, size, batch = weights_id(weights), "MobileNetV2", features.IMAGE_SIZE, 64
        prepare = features.preprocess
    else:
        raise ValueError(f"{where} {name}: {SERVED}")
    model.eval()
    digest = runtime.params_digest(model)
    if how.backend == "onnxruntime":
        try:
            runner = runtime.ort_runner(model, network, wid, size,
                                        runtime.resolve_threads(how.threads, "onnxruntime"),
                                        how.cache_dir)
            return Extractor(name, label, runner, prepare, size, digest)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as e:
            if not how.fallback:
                raise
            logger.warning("ONNX Runtime failed (%s: %s); extracting with torch instead.",
                           type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    runner, threads = torch_path(model, how.device, batch, how.threads)
    return Extractor(name, label, runner, prepare, size, digest, threads)
