"""Where and how the frozen extractors run: device, backend, CPU threads, the ONNX export.

- **Device** (``--device auto|cpu|cuda``, env ``CIOSL_DEVICE``): ``auto`` takes CUDA when torch
  sees it. On CUDA the torch module runs there (inputs moved to it, features back to numpy).
- **Backend** on the CPU (``--backend auto|onnxruntime|torch``, env ``CIOSL_BACKEND``): ``auto`` runs the project's own
  module exported to ONNX under ONNX Runtime, and falls back to the torch module (the reference)
  when onnxruntime is missing or fails. Their features differ by float rounding (measured
  <= 3e-5 on the raw 1280-d features, ``benchmarks/extract_time.py``), so the feature cache keys
  them apart (``backend_fields``).
- **Threads** (``--threads N``): under ONNX Runtime, N single-threaded workers, each on its own
  batch (no barrier inside a batch: when another process takes a core, the workers slow down by
  their share instead of spinning in waits); default: the cores this process may use. Under
  torch, N intra-op threads; default 1 (torch's barriers are what made two threads slower than
  one on a busy machine).

The export specialises ``Conv2dSame``'s TensorFlow padding to the input size (constant pads,
which ONNX Runtime fuses into the convolutions; computed from the traced shape they stay separate
``Pad`` nodes that break its blocked layout) and is cached in ``<cache>/onnx/``, keyed by
what produced it (``producer``: the network, its weights id and the hash of its tensors, the
module's and the exporter's source, the exporter's settings, the input size, the opset, the
torch, onnx and onnxruntime versions; recorded in the entry's manifest). A model, cached or
fresh, is used only after it matched the torch module on a probe batch (``probe_check``); the
cache reads regular files only, within caps (``cached_onnx``).
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import logging
import math
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ciosl.fileio import atomic_write_bytes, cache_root, kind_of

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "onnxruntime", "torch")
OPSET = 17
EXPORT_VERSION = 1  # bump when the export changes the graph
CUDA_BATCH = 256


# ---------------------------------------------------------------------------- choices


def resolve_device(device: str | None = None) -> str:
    """``"cpu"`` or ``"cuda"``. ``None`` reads ``CIOSL_DEVICE`` (default ``auto``); ``auto``
    takes CUDA when ``torch.cuda.is_available()``. Raises a one-line ``ValueError`` naming the
    flag (or the variable) for an unknown value or an unavailable device."""
    where = "--device" if device is not None else "CIOSL_DEVICE"
    value = (device if device is not None else os.environ.get("CIOSL_DEVICE", "")).strip().lower()
    value = value or "auto"
    if value not in DEVICES:
        raise ValueError(f"{where} {value!r}: expected one of {', '.join(DEVICES)}")
    cuda = torch.cuda.is_available()
    if value == "auto":
        return "cuda" if cuda else "cpu"
    if value == "cuda" and not cuda:
        raise ValueError(f"{where} cuda: no CUDA device here (torch.cuda.is_available() is "
                         f"False); use {where} cpu or auto")
    return value


# onnx and onnxruntime are the package's [onnx] extra (pyproject.toml): `pip install -e .`, all
# that `make demo` installs, leaves them out (digits' pixel features need neither).
ONNX_MISSING = ("onnx and onnxruntime are not installed (the [onnx] extra): "
                'pip install -e ".[onnx]" in the clone, or pip install onnx onnxruntime')


def onnxruntime_available() -> bool:
    try:
        import onnx  # noqa: F401  (the exporter needs it)
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def require_onnxruntime(what: str) -> None:
    """A one-line ``ValueError`` naming ``what`` needs them and the extra that installs them,
    when onnx or onnxruntime is missing."""
    if not onnxruntime_available():
        raise ValueError(f"{what}: {ONNX_MISSING}")


def backend_choice(backend: str | None) -> tuple[str, str]:
    """(value, where it came from): ``backend``, else ``CIOSL_BACKEND``, else ``auto``."""
    where = "--backend" if backend is not None else "CIOSL_BACKEND"
    value = (backend if backend is not None else os.environ.get("CIOSL_BACKEND", ""))
    return value.strip().lower() or "auto", where


def resolve_backend(backend: str | None, device: str) -> str:
    """``"onnxruntime"`` or ``"torch"``. ``None`` reads ``CIOSL_BACKEND`` (default ``auto``);
    ``auto`` takes ONNX Runtime on the CPU when it is installed; on CUDA the torch module runs
    (ONNX Runtime's CPU build has no GPU)."""
    value, where = backend_choice(backend)
    if value not in BACKENDS:
        raise ValueError(f"{where} {value!r}: expected one of {', '.join(BACKENDS)}")
    if value == "auto":
        return "onnxruntime" if device == "cpu" and onnxruntime_available() else "torch"
    if value == "onnxruntime":
        if device != "cpu":
            raise ValueError(f"{where} onnxruntime runs on the CPU only; use --device cpu")
        require_onnxruntime(f"{where} onnxruntime")
    return value


def available_cores() -> int:
    """The cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None, backend: str) -> int:
    """CPU threads of an extraction: ``threads`` if given (>= 1), else every available core as
    ONNX Runtime workers, or 1 torch thread (see the module docstring)."""
    if threads is None:
        return available_cores() if backend == "onnxruntime" else 1
    if int(threads) < 1:
        raise ValueError(f"--threads {threads}: expected an integer >= 1")
    return int(threads)


def ort_batch(size: int) -> int:
    """Images per ONNX Runtime call at input side ``size``: small maps stay in cache
    (tuned with benchmarks/extract_time.py)."""
    return 16 if size <= 96 else 4


def backend_fields(backend: str, device: str, size: int) -> dict:
    """What the feature-cache key adds for a path whose features differ from the reference
    (torch on the CPU, which adds nothing: its entries keep their keys)."""
    if device != "cpu":
        return {"device": device}
    if backend == "onnxruntime":
        return {"backend": "onnxruntime", "batch": ort_batch(size), "export": EXPORT_VERSION}
    return {}


# ---------------------------------------------------------------------------- export


class _StaticPadConv(nn.Module):
    """A convolution with its input padding fixed for one input size (a constant ``F.pad``)."""

    def __init__(self, conv: nn.Conv2d, pads: tuple[int, int, int, int]):
        super().__init__()
        self.conv, self.pads = conv, tuple(int(p) for p in pads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        if any(self.pads):
            x = F.pad(x, self.pads)
        return F.conv2d(x, c.weight, c.bias, c.stride, 0, c.dilation, c.groups)


class _Embed(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.embed(x)  # (b, 1280)


def _same_pads(conv: nn.Conv2d, h: int, w: int) -> tuple[int, int, int, int]:
    """TensorFlow "same" padding (left, right, top, bottom), as ``Conv2dSame`` computes it."""
    pads = []
    for n, k, s in ((w, conv.kernel_size[1], conv.stride[1]), (h, conv.kernel_size[0],
                                                                 conv.stride[0])):
        total = max((math.ceil(n / s) - 1) * s + k - n, 0)
        pads += [total // 2, total - total // 2]
    return tuple(pads)


def specialise(model: nn.Module, size: int) -> nn.Module:
    """A copy of ``model`` (frozen, eval) with every ``Conv2dSame`` replaced by a convolution
    whose padding is fixed for (size, size) inputs; the same function of its input."""
    from ciosl.data.efficientnet import Conv2dSame

    model = copy.deepcopy(model).eval()  # the exporter folds batch norms into weights in place
    shapes: dict[str, tuple[int, int]] = {}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, name=name: shapes.__setitem__(name, tuple(args[0].shape[-2:])))
        for name, m in model.named_modules() if isinstance(m, Conv2dSame)]
    with torch.inference_mode():
        model.embed(torch.zeros(1, 3, size, size))
    for h in hooks:
        h.remove()
    for name, (h, w) in shapes.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        conv = getattr(parent, child)
        setattr(parent, child, _StaticPadConv(conv, _same_pads(conv, h, w)))
    return model


def export_onnx(model: nn.Module, size: int) -> bytes:
    """The module's ``embed`` at (b, 3, size, size) as ONNX bytes, batch axis dynamic, with
    every constant zero ``Pad`` folded into the convolution it feeds (``fold_pads``)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = EXPORTER
        torch.onnx.export(_Embed(specialise(model, size)),
                          (torch.zeros(e["example_batch"], 3, size, size),), buf,
                          dynamo=e["dynamo"], input_names=e["input_names"],
                          output_names=e["output_names"], dynamic_axes=e["dynamic_axes"],
                          opset_version=OPSET)
    return fold_pads(buf.getvalue())


def fold_pads(model_bytes: bytes) -> bytes:
    """Constant-fold the graph (ONNX Runtime's basic level: standard ONNX ops only), then move
    each zero ``Pad`` on the spatial axes into the ``pads`` of the one ``Conv`` it feeds (ONNX
    convolutions take asymmetric pads): one op instead of two, and no layout change between.
    The same function; a ``Pad`` that does not fit is left as it is."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.optimized_model_filepath = str(Path(tmp) / "basic.onnx")
            so.log_severity_level = 3
            ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
            graph_model = onnx.load(so.optimized_model_filepath)
    g = graph_model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    consumers: dict[str, list] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    drop = []
    for node in g.node:
        if node.op_type != "Pad" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
        value = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        pads = inits[node.input[1]].astype(np.int64).tolist()  # (begin x4, end x4), NCHW
        after = consumers.get(node.output[0], [])
        if (mode != b"constant" or (value is not None and np.any(value != 0)) or len(pads) != 8
                or any(pads[i] != 0 for i in (0, 1, 4, 5)) or min(pads) < 0
                or len(after) != 1 or after[0].op_type != "Conv"):
            continue
        conv = after[0]
        old = next((list(a.ints) for a in conv.attribute if a.name == "pads"), [0, 0, 0, 0])
        if any(a.name == "auto_pad" and a.s not in (b"", b"NOTSET") for a in conv.attribute):
            continue
        new = [old[0] + pads[2], old[1] + pads[3], old[2] + pads[6], old[3] + pads[7]]
        kept = [a for a in conv.attribute if a.name != "pads"]
        del conv.attribute[:]
        conv.attribute.extend([*kept, helper.make_attribute("pads", new)])
        conv.input[0] = node.input[0]
        drop.append(node)
    for node in drop:
        g.node.remove(node)
    return graph_model.SerializeToString()


EXPORTER = {"dynamo": False, "input_names": ["x"], "output_names": ["z"],
            "dynamic_axes": {"x": {0: "b"}, "z": {0: "b"}}, "example_batch": 2,
            "fold_pads": True}  # export_onnx's settings, in the cache entry's key
MAX_ONNX_BYTES = 2**30  # an exported extractor is ~15 MB
MAX_MANIFEST_BYTES = 2**16
PROBE_IMAGES = 4  # images of the probe batch that checks an ONNX model against its module
PROBE_TOLERANCE = 1e-3  # relative: the two paths differ by float rounding (<= 3e-5 measured)


def params_digest(model: nn.Module) -> str:
    """sha256 of the module's parameters and buffers as they are (names, dtypes, shapes,
    values): the weights the export computes with, whatever file they came from."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def source_digest(model: nn.Module) -> str:
    """sha256 of the source of every class of the module that is not torch's (torch's are
    covered by its version) and of this module's export code: a change to either is another
    export."""
    import inspect

    import ciosl

    h = hashlib.sha256(ciosl.__version__.encode())
    classes = sorted({type(m) for m in model.modules()
                      if not type(m).__module__.startswith("torch.")},
                     key=lambda c: f"{c.__module__}.{c.__qualname__}")
    for obj in (*classes, _StaticPadConv, _Embed, _same_pads, specialise, export_onnx,
                fold_pads):
        try:
            text = inspect.getsource(obj)
        except (OSError, TypeError):  # no source (a class made at run time): its name
            text = f"{obj.__module__}.{obj.__qualname__}"
        h.update(text.encode())
    return h.hexdigest()


def producer(model: nn.Module, network: str, weights_id: str, size: int) -> dict:
    """What an exported model is a function of: the network, its weights (their id and the
    hash of the tensors the module holds), the module's source, the input size and the
    exporter (its settings, opset, and the versions of torch, onnx and onnxruntime)."""
    import onnx
    import onnxruntime as ort

    return {"network": network, "weights": weights_id, "params": params_digest(model),
            "source": source_digest(model), "size": size, "opset": OPSET,
            "export": EXPORT_VERSION, "exporter": EXPORTER, "torch": torch.__version__,
            "onnx": onnx.__version__, "onnxruntime": ort.__version__}


def onnx_path(network: str, weights_id: str, size: int, cache_dir: Path | None = None,
              fields: dict | None = None) -> Path:
    """``<cache>/onnx/<network>-<size>-<digest of fields>.onnx``, ``fields`` being
    ``producer``'s (without them: the network, weights id, size and versions only)."""
    fields = fields or {"network": network, "weights": weights_id, "size": size,
                        "opset": OPSET, "export": EXPORT_VERSION, "torch": torch.__version__}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir or cache_root()) / "onnx" / f"{network}-{size}-{digest}.onnx"


def entry_path(model: nn.Module, network: str, weights_id: str, size: int,
               cache_dir: Path | None = None) -> Path:
    """Where ``cached_onnx`` keeps this module's export."""
    return onnx_path(network, weights_id, size, cache_dir,
                     producer(model, network, weights_id, size))


def manifest_path(path: Path) -> Path:
    """The entry's manifest: what produced the model, and its sha256."""
    return path.with_suffix(".json")


_VERIFIED: set[tuple[str, str]] = set()  # (model sha256, params digest) checked this process


def probe_check(model: nn.Module, model_bytes: bytes, size: int, where: str) -> None:
    """Compare the ONNX model with the torch module on a probe batch of ``PROBE_IMAGES``
    random inputs (fresh ones every process); ``ValueError`` naming ``where`` when it does not
    compute what the module computes. Once per model and module in a process."""
    memo = (hashlib.sha256(model_bytes).hexdigest(), params_digest(model))
    if memo in _VERIFIED:
        return
    x = torch.from_numpy(np.random.default_rng().uniform(
        -1, 1, (PROBE_IMAGES, 3, size, size)).astype(np.float32))
    with torch.inference_mode():
        ref = model.embed(x).float().numpy()  # (b, d)
    try:
        got = ort_session(model_bytes, 1).run(None, {"x": x.numpy()})[0]
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # onnxruntime's own errors (bad protobuf, wrong input name, ...)
        raise ValueError(f"{where}: ONNX Runtime cannot run it on the probe batch "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    scale = max(1.0, float(np.abs(ref).max()))
    if got.shape != ref.shape:
        raise ValueError(f"{where}: answers features of shape {got.shape[1:]} where the torch "
                         f"module answers {ref.shape[1:]}")
    diff = float(np.abs(got - ref).max()) if np.isfinite(got).all() else math.inf
    if not diff <= PROBE_TOLERANCE * scale:
        raise ValueError(f"{where}: does not compute what the torch module computes (max "
                         f"difference {diff:.3g} on a probe batch of {PROBE_IMAGES} images, "
                         f"features up to {scale:.3g})")
    _VERIFIED.add(memo)


def _read_entry(path: Path, fields: dict) -> bytes | None:
    """The cached model at ``path`` when its manifest records ``fields`` and its sha256, read
    as regular files within caps; None when there is none, or it is stale or damaged (logged);
    ``OSError`` when something other than a regular file is there."""
    from ciosl.fileio import load_json, read_bytes

    man = manifest_path(path)
    if not os.path.lexists(path) and not os.path.lexists(man):
        return None
    for p in (path, man):  # a FIFO would block a reader, /dev/zero never end
        try:
            mode = os.stat(p).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise OSError(errno.EEXIST, f"ONNX cache: not a regular file ({kind_of(mode)})",
                          str(p))
    try:
        manifest = load_json(man, "ONNX cache manifest", MAX_MANIFEST_BYTES)
        data = read_bytes(path, "ONNX cache file", MAX_ONNX_BYTES)
    except (OSError, ValueError) as e:
        logger.warning("ONNX cache entry %s is unreadable (%s); exporting again.", path, e)
        return None
    if not isinstance(manifest, dict) or manifest.get("producer") != json.loads(
            json.dumps(fields)):
        logger.warning("ONNX cache entry %s was made by something else than this network, "
                       "weights, source and exporter; exporting again.", path)
        return None
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        logger.warning("ONNX cache file %s does not match its checksum; exporting again.", path)
        return None
    return data


def cached_onnx(model: nn.Module, network: str, weights_id: str, size: int,
                cache_dir: Path | None = None) -> bytes:
    """The exported network, from ``<cache>/onnx/`` when an entry made by the same producer
    (``producer``: weights, module source, exporter settings and versions) is there, else
    exported and written there (a cache that cannot be written costs the cache, not the run).
    Either way the model is checked against the torch module on a probe batch before it is
    used (``probe_check``): a cached file that fails is exported again; a fresh export that
    fails is a ``ValueError``. The cache reads regular files only, up to a cap: anything else
    in an entry's place (a FIFO, a link to a device) is named in one warning, not read and not
    replaced, and the model is exported for this run."""
    fields = producer(model, network, weights_id, size)
    path = onnx_path(network, weights_id, size, cache_dir, fields)  # entry_path's
    writable = True
    try:
        data = _read_entry(path, fields)
    except OSError as e:
        logger.warning("%s: %s: not read and not replaced (remove it); exporting the network "
                       "for this run.", e.filename, e.strerror)
        data, writable = None, False
    if data is not None:
        try:
            probe_check(model, data, size, f"ONNX cache file {path}")
            return data
        except ValueError as e:
            logger.warning("%s; exporting again.", e)
    data = export_onnx(model, size)
    probe_check(model, data, size, f"the ONNX export of {network} at {size}x{size}")
    if writable:
        try:
            atomic_write_bytes(path, data)
            atomic_write_bytes(manifest_path(path), (json.dumps(
                {"producer": fields, "sha256": hashlib.sha256(data).hexdigest()},
                indent=1) + "\n").encode())
        except OSError as e:
            logger.warning("Could not write ONNX cache file %s (%s).", path, e)
    return data


def ort_session(model_bytes: bytes, threads: int = 1):
    """An ONNX Runtime CPU session: full graph optimisation, ``threads`` intra-op threads,
    no spin-waiting (a thread that waits yields its core to whoever needs it)."""
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, session_options(threads),
                                providers=["CPUExecutionProvider"])


def session_options(threads: int):
    """ONNX Runtime's options for every session of ciosl: full graph optimisation, ``threads``
    intra-op threads, one inter-op thread, no spin-waiting, errors only in its log."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


# ---------------------------------------------------------------------------- running


class Runner:
    """``embed(batch)`` for one network on one path: ``__call__(x) -> (b, d) float32 numpy``,
    with ``batch`` images per call and ``workers`` calls at a time."""

    def __init__(self, call: Callable[[torch.Tensor], np.ndarray], batch: int, workers: int,
                 backend: str, device: str):
        self.call, self.batch, self.workers = call, batch, workers
        self.backend, self.device = backend, device

    def __call__(self, x: torch.Tensor) -> np.ndarray:
        return self.call(x)


def torch_runner(model: nn.Module, device: str, batch: int, workers: int = 1) -> Runner:
    """The reference path: the torch module, on ``device`` (features back on the CPU). On CUDA,
    ``workers`` threads each hand their own batch to the GPU. The batches arrive there as uint8
    images and are resized there (``features.efficientnet_input``): fashion-mnist on an H200,
    27,794 images/s end to end with one worker, 21,571 with 4, 11,419 with 16 (resized on the
    CPU: 6,416 with one, 15,415 with 4; ONNX Runtime on its 16 cores: 14,295)."""
    if device == "cpu":
        return Runner(lambda x: model.embed(x).numpy(), batch, 1, "torch", device)
    model = copy.deepcopy(model).to(device)

    def call(x: torch.Tensor) -> np.ndarray:
        # cuDNN would run the convolutions in TF32 (10-bit mantissa) by default: features
        # 4e-2 away from the CPU's at side 64 (benchmarks/gpu_check.py); in float32 they agree
        # to float rounding. benchmark: one input size per run, so cuDNN's choice is kept.
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                        allow_tf32=False):
            if not x.is_cuda:
                x = x.pin_memory().to(device, non_blocking=True)
            return model.embed(x).float().cpu().numpy()

    return Runner(call, max(batch, CUDA_BATCH), workers, "torch", device)


def ort_runner(model: nn.Module, network: str, weights_id: str, size: int, workers: int,
               cache_dir: Path | None = None) -> Runner:
    """The network under ONNX Runtime: one session of one intra-op thread, ``workers`` calls
    at a time (``InferenceSession.run`` may be called from several threads)."""
    session = ort_session(cached_onnx(model, network, weights_id, size, cache_dir), 1)

    def call(x: torch.Tensor) -> np.ndarray:
        return session.run(None, {"x": np.ascontiguousarray(x.numpy(), dtype=np.float32)})[0]

    return Runner(call, ort_batch(size), workers, "onnxruntime", "cpu")


def run_batches(runner: Runner, n: int, job: Callable[[int, int], tuple[int, np.ndarray]],
                ) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``job(start, stop)`` over [0, n) in ``runner.batch`` steps, as they finish, with
    ``runner.workers`` of them at a time (at most twice that many queued)."""
    spans = [(s, min(n, s + runner.batch)) for s in range(0, n, runner.batch)]
    if runner.workers <= 1:
        for s, e in spans:
            yield job(s, e)
        return
    with ThreadPoolExecutor(runner.workers) as pool:
        pending, it = [], iter(spans)
        for s, e in it:
            pending.append(pool.submit(job, s, e))
            if len(pending) >= 2 * runner.workers:
                yield pending.pop(0).result()
        for f in pending:
            yield f.result()
