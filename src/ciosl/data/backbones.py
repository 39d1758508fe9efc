"""The user's own backbones: ``onnx:PATH[@S]`` (any ONNX image model under ONNX Runtime) and
``module:package.module:callable`` (a torch ``nn.Module`` and its preprocessing).

``onnx:PATH``
  - Input: the graph's first input that is not a weight, NCHW (``(b, 3, H, W)``) or NHWC
    (``(b, H, W, 3)``), told apart by where the 3 is. Its side comes from the model's input shape,
    or from ``@S`` (required when the model's shape is dynamic; refused when it differs from a
    fixed one).
  - Normalisation: images are resized (bilinear, antialiased) to the input size, scaled to
    [0, 1], then ``(x - mean) / std`` per RGB channel. ``mean`` and ``std`` come from the flags
    (``--mean``, ``--std``), else from a sidecar file ``PATH.json`` (``{"mean": [r, g, b],
    "std": [r, g, b], "layer": NAME}``, every key optional), else ImageNet's
    (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225).
  - Features: the pre-logit features; which tensor is taken: docs/design.md, "Module notes".
  - Where: ONNX Runtime's CPU provider; under ``--device cuda`` its CUDA provider when that
    build is installed (else the CPU, with a warning).
  - Cache key: the sha256 of the model file, the input size, mean, std and the tensor.

``module:package.module:callable``
  ``callable()`` returns ``(module, preprocessing)``: a torch ``nn.Module`` whose output (b, d)
  (or (b, C, H, W), averaged) are the features, and either a dict ``{"size": S or [H, W],
  "mean": [...], "std": [...]}`` (the same resize and normalisation as ``onnx:``; mean/std
  default to ImageNet's) or a callable taking a uint8 batch (b, H, W, 3) and returning the
  module's input tensor. It runs under torch on the CPU or on CUDA (``--device``). Cache key:
  the callable's name, the sha256 of every tensor of the module's ``state_dict`` and the
  preprocessing (a callable's qualified name).

Both standardise their features with the train split's statistics, like efficientnet_lite0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ciosl.data import runtime
from ciosl.errors import echo

logger = logging.getLogger(__name__)

ONNX_PREFIX = "onnx:"
MODULE_PREFIX = "module:"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ONNX_BATCH = 16
_HEAD_TAIL = ("Softmax", "LogSoftmax", "Identity", "Add")


def is_user_backbone(extractor: str | None) -> bool:
    return bool(extractor) and str(extractor).startswith((ONNX_PREFIX, MODULE_PREFIX))


@dataclass(frozen=True)
class Options:
    """What the flags add to a user's backbone: ``mean`` / ``std`` (None: the sidecar's, else
    ImageNet's) and ``layer`` (None: the pre-logit tensor)."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layer: str | None = None


def options_from_flags(extractor: str | None, mean: str | None, std: str | None,
                       layer: str | None) -> Options | None:
    """``--mean`` / ``--std`` / ``--layer`` as ``Options`` (None when none is given); refused
    with an extractor that is not ``onnx:``."""
    if mean is None and std is None and layer is None:
        return None
    if not (extractor or "").startswith(ONNX_PREFIX):
        raise ValueError(f"--mean, --std and --layer apply to an onnx:PATH extractor, not "
                         f"{echo(extractor or 'the dataset default')}")
    return Options(parse_triple(mean, "--mean"), parse_triple(std, "--std"), layer)


def parse_triple(text: str | None, flag: str) -> tuple[float, ...] | None:
    """``"0.5,0.5,0.5"`` -> (0.5, 0.5, 0.5); one value is used for the three channels."""
    if text is None:
        return None
    try:
        vals = tuple(float(v) for v in str(text).split(","))
    except ValueError:
        raise ValueError(f"{flag} {echo(text)}: expected 3 numbers like 0.5,0.5,0.5") from None
    if len(vals) == 1:
        vals = vals * 3
    if len(vals) != 3 or not all(np.isfinite(vals)):
        raise ValueError(f"{flag} {echo(text)}: expected 3 finite numbers like 0.5,0.5,0.5")
    if flag == "--std" and min(vals) <= 0:
        raise ValueError(f"{flag} {echo(text)}: a std must be > 0")
    return vals


def _norm(values, what: str, where: str, default: tuple[float, ...]) -> tuple[float, ...]:
    if values is None:
        return default
    if (not isinstance(values, list | tuple) or len(values) != 3
            or not all(isinstance(v, int | float) and np.isfinite(v) for v in values)):
        raise ValueError(f"{where}: {what} must be 3 numbers (R, G, B on the 0..1 scale), got "
                         f"{echo(values)}")
    if what == "std" and min(values) <= 0:
        raise ValueError(f"{where}: a std must be > 0, got {echo(values)}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class Backbone:
    """A resolved user backbone: what the extraction and the cache key need."""

    name: str  # the extractor string
    label: str  # for the progress line
    wid: str  # weights id: the model's hash
    size: tuple[int, int]  # (H, W) of the input, or (0, 0) for a callable preprocessing
    mean: tuple[float, ...]
    std: tuple[float, ...]
    tensor: str  # which output (onnx) or "forward"
    layout: str = "NCHW"
    batch: int | None = None  # a fixed batch size of the model's input, None: any
    path: str = ""
    prepare_fn: Callable | None = None
    module: nn.Module | None = None
    why: str = ""  # how the tensor was chosen

    def key_fields(self) -> dict:
        return {"backbone": self.name.split("@")[0] if self.name.startswith(ONNX_PREFIX)
                else self.name, "weights": self.wid, "size": list(self.size),
                "mean": list(self.mean), "std": list(self.std), "tensor": self.tensor,
                "layout": self.layout}

    def describe(self) -> str:
        if self.name.startswith(ONNX_PREFIX):
            norm = ("ImageNet's mean and std, the default" if (self.mean, self.std) == (
                IMAGENET_MEAN, IMAGENET_STD) else f"mean {list(self.mean)}, std {list(self.std)}")
            return (f"{self.name}: features = tensor {self.tensor!r} ({self.why}), input "
                    f"{self.layout} {self.size[0]}x{self.size[1]}, {norm}")
        return f"{self.name}: features = the module's output"


def split_size(spec: str, name: str) -> tuple[str, int | None]:
    """``PATH@S`` -> (PATH, S); a path whose '@' is not followed by digits keeps it."""
    base, at, size = spec.rpartition("@")
    if not at or not size.isdigit():
        return spec, None
    if not 16 <= int(size) <= 4096:
        raise ValueError(f"extractor {echo(name)}: the side after '@' must be in 16..4096, got "
                         f"{size}")
    return base, int(size)


# ---------------------------------------------------------------------------- onnx


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


def _pre_logit(graph) -> tuple[str, str]:
    """(tensor, why) of a graph's features: the input of its final classifier, else its first
    output."""
    inits = {t.name for t in graph.initializer}
    consts = inits | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    made = {o: n for n in graph.node for o in n.output}
    out = graph.output[0].name
    node = made.get(out)
    while node is not None and node.op_type in _HEAD_TAIL:
        data = [i for i in node.input if i and i not in consts]
        if node.op_type == "Add" and len(data) != 1:
            break
        node = made.get(data[0]) if data else None
    if node is not None and node.op_type in ("Gemm", "MatMul"):
        data = [i for i in node.input[:2] if i not in consts]
        if len(data) == 1:
            return data[0], f"the input of the final {node.op_type} {node.name or '(unnamed)'}"
    return out, "the model's output (no final Gemm or MatMul)"


def load_onnx(name: str, options: Options) -> Backbone:
    """Resolve ``onnx:PATH[@S]`` (module docstring). Raises a one-line ``ValueError`` naming
    the file, the flag or the value."""
    runtime.require_onnxruntime(f"extractor {name}")
    import onnx
    spec, size = split_size(name[len(ONNX_PREFIX):], name)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"extractor {name}: no such ONNX file {path}")
    data = path.read_bytes()
    try:
        model = onnx.load_from_string(data)
    except Exception as e:
        raise ValueError(f"{path}: not an ONNX model ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None
    side = _sidecar(path)
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    if not inputs or not g.output:
        raise ValueError(f"{path}: the model has no input or no output")
    dims = _dims(inputs[0])
    if len(dims) != 4 or 3 not in (dims[1], dims[3]):
        raise ValueError(f"{path}: input {inputs[0].name!r} has shape {dims}; an image model "
                         "takes (b, 3, H, W) or (b, H, W, 3)")
    layout = "NCHW" if dims[1] == 3 else "NHWC"
    hw = dims[2:] if layout == "NCHW" else dims[1:3]
    fixed = all(isinstance(v, int) and v > 0 for v in hw)
    if size is not None:
        if fixed and tuple(hw) != (size, size):
            raise ValueError(f"extractor {name}: the model takes {hw[0]}x{hw[1]} inputs, not "
                             f"{size}x{size}")
        hw = (size, size)
    elif not fixed:
        raise ValueError(f"extractor {name}: the model's input size is dynamic ({dims}); give "
                         f"it as onnx:{spec}@S")
    layer = options.layer or side.get("layer")
    if layer is not None:
        known = ({o for n in g.node for o in n.output} | {o.name for o in g.output})
        if layer not in known:
            some = [o for n in g.node for o in n.output][-8:]
            raise ValueError(f"--layer {echo(layer)}: no such tensor in {path} (the last "
                             f"ones: {', '.join(some)})")
        tensor, why = layer, "--layer" if options.layer else f"{path}.json's layer"
    else:
        tensor, why = _pre_logit(g)
    b = dims[0] if isinstance(dims[0], int) and dims[0] > 0 else None
    return Backbone(
        name, f"ONNX {path.name}", hashlib.sha256(data).hexdigest()[:32], tuple(hw),
        options.mean or _norm(side.get("mean"), "mean", f"{path}.json", IMAGENET_MEAN),
        options.std or _norm(side.get("std"), "std", f"{path}.json", IMAGENET_STD),
        tensor, layout, b, str(path), why=why)


def _sidecar(path: Path) -> dict:
    side = Path(f"{path}.json")
    if not side.is_file():
        return {}
    try:
        found = json.loads(side.read_text())
    except (ValueError, OSError) as e:
        raise ValueError(f"{side}: not a JSON file ({e})") from None
    if not isinstance(found, dict) or set(found) - {"mean", "std", "layer"}:
        raise ValueError(f"{side}: expected an object with keys mean, std, layer; got "
                         f"{echo(found)}")
    return found


def onnx_session(bb: Backbone, device: str, threads: int):
    """An ONNX Runtime session whose only output is ``bb.tensor``; the CUDA provider under
    ``device == "cuda"`` when installed."""
    runtime.require_onnxruntime(f"extractor {bb.name}")
    import onnx
    import onnxruntime as ort

    model = onnx.load(bb.path)
    if bb.tensor not in {o.name for o in model.graph.output}:
        del model.graph.output[:]
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(bb.tensor))
    so = runtime.session_options(threads)
    providers = ["CPUExecutionProvider"]
    if device == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        else:
            logger.warning("--device cuda: this onnxruntime has no CUDA provider "
                           "(pip install onnxruntime-gpu); %s runs on the CPU", bb.name)
    session = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
    return session, session.get_providers()[0] == "CUDAExecutionProvider"


def pool_features(z: np.ndarray, layout: str = "NCHW") -> np.ndarray:
    """(b, d) as it is; (b, C, H, W) (or NHWC) averaged over space; anything else flattened."""
    z = np.asarray(z, dtype=np.float32)
    if z.ndim == 4:
        return z.mean(axis=(2, 3) if layout == "NCHW" else (1, 2))
    return z.reshape(len(z), -1)


def onnx_call(bb: Backbone, session) -> Callable[[torch.Tensor], np.ndarray]:
    """``x`` (b, 3, H, W) -> features (b, d); a model of fixed batch gets padded batches."""
    in_name = next(i.name for i in session.get_inputs())
    out_layout = bb.layout  # a 4-D feature map is laid out as the input

    def call(x: torch.Tensor) -> np.ndarray:
        a = np.ascontiguousarray((x.permute(0, 2, 3, 1) if bb.layout == "NHWC" else x).numpy(),
                                 dtype=np.float32)
        if bb.batch is None:
            return pool_features(session.run([bb.tensor], {in_name: a})[0], out_layout)
        outs = []
        for s in range(0, len(a), bb.batch):
            part = a[s:s + bb.batch]
            pad = np.zeros((bb.batch - len(part), *part.shape[1:]), np.float32)
            z = session.run([bb.tensor], {in_name: np.concatenate([part, pad])})[0]
            outs.append(pool_features(z, out_layout)[:len(part)])
        return np.concatenate(outs)

    return call


# ---------------------------------------------------------------------------- module


def weights_hash(module: nn.Module) -> str:
    h = hashlib.sha256()
    for k, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


class _Pooled(nn.Module):
    """A user's module with ``embed``: its output, spatial maps averaged."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.module(x)
        if isinstance(z, tuple | list):
            z = z[0]
        return z.mean(dim=(2, 3)) if z.ndim == 4 else z.reshape(len(z), -1)

    embed = forward


def check_module_name(name: str) -> tuple[str, str]:
    """``module:package.module:callable`` -> (module, callable), else a one-line error."""
    mod_name, _, attr = name[len(MODULE_PREFIX):].partition(":")
    if not mod_name or not attr:
        raise ValueError(f"extractor {echo(name)}: expected module:package.module:callable")
    return mod_name, attr


def load_module(name: str) -> Backbone:
    """Resolve ``module:package.module:callable`` (module docstring); one-line errors."""
    import importlib

    mod_name, attr = check_module_name(name)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        made = obj()
    except (Exception, SystemExit) as e:
        raise ValueError(f"extractor {echo(name)}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'failed'}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ValueError(f"extractor {echo(name)}: the callable must return (nn.Module, "
                         f"preprocessing), got {type(made).__name__}")
    module, pre = made
    module = module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    where = f"extractor {name}"
    if callable(pre):
        fn, size, mean, std = pre, (0, 0), (), ()
        pre_id = f"{getattr(pre, '__module__', '')}.{getattr(pre, '__qualname__', repr(pre))}"
    elif isinstance(pre, dict) and "size" in pre and not set(pre) - {"size", "mean", "std"}:
        s = pre["size"]
        size = (s, s) if isinstance(s, int) else tuple(s)
        if len(size) != 2 or not all(isinstance(v, int) and 1 <= v <= 4096 for v in size):
            raise ValueError(f"{where}: preprocessing size must be an int or [H, W], got "
                             f"{echo(s)}")
        mean = _norm(pre.get("mean"), "mean", where, IMAGENET_MEAN)
        std = _norm(pre.get("std"), "std", where, IMAGENET_STD)
        fn, pre_id = None, ""
    else:
        raise ValueError(f"{where}: the preprocessing must be a callable or a dict with keys "
                         f"size[, mean, std], got {echo(pre)}")
    return Backbone(name, name, weights_hash(module) + pre_id, size, mean, std, "forward",
                    prepare_fn=fn, module=_Pooled(module))


def resolve(name: str, options: Options | None = None) -> Backbone:
    options = options or Options()
    if name.startswith(ONNX_PREFIX):
        return load_onnx(name, options)
    if options.mean or options.std or options.layer:
        raise ValueError(f"--mean, --std and --layer are for onnx: extractors; {name}'s "
                         "preprocessing comes from its callable")
    return load_module(name)


def normalized_input(batch, size: tuple[int, int], mean, std, device: str = "cpu") -> torch.Tensor:
    """uint8 (b, H, W[, 3]) or a list of such images -> (b, 3, h, w) resized (bilinear,
    antialiased), scaled to [0, 1], ``(x - mean) / std`` per channel."""
    if not isinstance(batch, np.ndarray):
        return torch.cat([normalized_input(img[None], size, mean, std, device) for img in batch])
    x = torch.from_numpy(np.ascontiguousarray(batch))
    if device != "cpu":
        x = x.to(device)
    x = x.float()
    if x.ndim == 4 and x.shape[-1] == 1:
        x = x[..., 0]
    if x.ndim == 3:
        x = x[:, None].expand(-1, 3, -1, -1)
    elif x.ndim == 4 and x.shape[-1] == 3:
        x = x.permute(0, 3, 1, 2)
    else:
        raise ValueError(f"Expected images (b, H, W) or (b, H, W, 3), got {tuple(batch.shape)}.")
    if tuple(x.shape[-2:]) != tuple(size):
        x = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True,
                          align_corners=False)
    m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1) * 255.0
    s = torch.tensor(std, device=x.device).view(1, 3, 1, 1) * 255.0
    return (x - m) / s
