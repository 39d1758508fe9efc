"""MobileNetV2 (width 1.0) with torchvision's exact ``state_dict`` layout, and its weights.

torchvision cannot be imported next to this torch build, so the architecture lives here. Module
names and shapes match ``torchvision.models.mobilenet_v2()`` key for key, so torchvision's
ImageNet checkpoint loads with ``strict=True``. The feature extractor is the convolutional base
followed by a global average pool: ``embed(x)`` maps (b, 3, 224, 224) to (b, 1280).
"""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path

import torch
from torch import nn

WEIGHTS_URL = "https://download.pytorch.org/models/mobilenet_v2-b0353104.pth"
WEIGHTS_HASH = "b0353104"  # sha256 prefix torch.hub checks (the part of the file name after '-')
EMBED_DIM = 1280

# (expansion t, output channels c, repeats n, first stride s), torchvision's table
_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class WeightsError(RuntimeError):
    """The MobileNetV2 weights could not be obtained or do not fit the architecture."""


def _conv_bn_relu(inp: int, out: int, kernel: int = 3, stride: int = 1, groups: int = 1):
    """torchvision's Conv2dNormActivation: keys ``0.weight`` (conv) and ``1.*`` (batch norm)."""
    return nn.Sequential(
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, out: int, stride: int, expand: int):
        super().__init__()
        hidden = inp * expand
        self.use_res_connect = stride == 1 and inp == out
        layers: list[nn.Module] = [_conv_bn_relu(inp, hidden, kernel=1)] if expand != 1 else []
        layers += [
            _conv_bn_relu(hidden, hidden, stride=stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, out, 1, bias=False),  # linear bottleneck
            nn.BatchNorm2d(out),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu(3, 32, stride=2)]
        inp = 32
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                inp = c
        layers.append(_conv_bn_relu(inp, EMBED_DIM, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(EMBED_DIM, num_classes))
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(b, 3, H, W) normalised images -> (b, 1280) globally pooled features."""
        return self.features(x).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.embed(x))  # (b, num_classes)


def weights_id(weights: str | Path | None = None) -> str:
    """Short id of the weights for cache keys: sha256 of the file, or the URL's hash prefix.

    A local copy of torchvision's file gets the same id as the download.
    """
    if weights is None:
        return WEIGHTS_HASH
    from ciosl.fileio import check_regular
    check_regular(weights, "MobileNetV2 weights file", limit=MAX_WEIGHTS_BYTES)  # before hashing
    digest = hashlib.sha256()
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    hexd = digest.hexdigest()
    return WEIGHTS_HASH if hexd.startswith(WEIGHTS_HASH) else hexd[:16]


def _download_state_dict(progress: bool) -> dict[str, torch.Tensor]:
    try:
        return torch.hub.load_state_dict_from_url(
            WEIGHTS_URL, map_location="cpu", progress=progress, check_hash=True, weights_only=True
        )
    except (urllib.error.URLError, OSError) as e:  # URLError, HTTPError, timeouts: all OSError
        raise WeightsError(
            f"Could not download the MobileNetV2 ImageNet weights from {WEIGHTS_URL} ({e}). "
            "Download that file on a machine with internet access and pass it with "
            "--weights PATH (Python: weights=PATH), or put it in torch.hub's checkpoint "
            f"folder ({Path(torch.hub.get_dir()) / 'checkpoints'})."
        ) from e


def load_mobilenet_v2(weights: str | Path | None = None, *, progress: bool = True) -> MobileNetV2:
    """The frozen ImageNet MobileNetV2 in eval mode, from ``weights`` (a local file) or the URL."""
    state = (_download_state_dict(progress) if weights is None
             else read_state_dict(weights, "MobileNetV2"))
    return frozen(MobileNetV2(), state, weights or WEIGHTS_URL, "a torchvision mobilenet_v2",
                  " Pass the file mobilenet_v2-b0353104.pth from torchvision (or its state_dict) "
                  "with --weights.")


MAX_WEIGHTS_BYTES = 2**30  # mobile CNNs' weights are ~15-20 MB; 1 GiB is far beyond any of them


def read_state_dict(path: str | Path, network: str) -> object:
    """``torch.load(path, weights_only=True)`` of a weights file, refusing a FIFO or a device
    (which would block) and naming ``network`` and the file when it cannot be read."""
    from ciosl.fileio import check_regular

    path = check_regular(path, f"{network} weights file", limit=MAX_WEIGHTS_BYTES)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many kinds on a damaged or foreign file
        raise WeightsError(f"Could not read {network} weights from {path}: "
                           f"{weights_problem(e)}") from None


def weights_problem(e: Exception) -> str:
    """What was wrong with a weights file, in one line, without torch's advice to retry with
    ``weights_only=False`` (which would run whatever code the file holds)."""
    text = str(e)
    if "weights only load failed" in text.lower() or "weights_only" in text:
        return ("it is not a plain tensor state_dict (torch.load with weights_only=True "
                "refused it; ciosl never loads weights any other way)")
    lines = text.strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def frozen(model: nn.Module, state: object, source: str | Path, kind: str,
           hint: str = "") -> nn.Module:
    """``model`` with ``state`` loaded (it must fit the architecture key for key and shape for
    shape, else a ``WeightsError`` naming ``source``), frozen, in eval mode."""
    expected = model.state_dict()
    if not isinstance(state, dict):
        raise WeightsError(f"{source}: expected a state_dict, got {type(state).__name__}.")
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or bad:
        raise WeightsError(
            f"{source} is not {kind} state_dict: {len(missing)} missing keys {missing[:3]}, "
            f"{len(unexpected)} unexpected keys {unexpected[:3]}, {len(bad)} shape mismatches "
            f"{bad[:3]}.{hint}"
        )
    model.load_state_dict(state, strict=True)
    model.requires_grad_(False)
    return model.eval()
