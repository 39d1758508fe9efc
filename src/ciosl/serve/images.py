"""Images sent to a server started with ``--extractor``: decoded with Pillow (PNG, JPEG, WebP;
grey, palette and alpha converted to RGB), then the frozen extractor with the feature cache's
preprocessing. The features are the extractor's raw pre-logit outputs: a served stream has no
train split to standardise them by, as the benchmark's cached features are."""

from __future__ import annotations

import io

import numpy as np
import torch

MAX_PIXELS = 4096 * 4096


class Embedder:
    """``embedder([bytes, ...]) -> (n, d) float32`` features of encoded images."""

    def __init__(self, extractor: str, weights: str | None = None):
        from ciosl.data import backbones, efficientnet
        from ciosl.data.features import efficientnet_input, parse_extractor, preprocess
        from ciosl.data.mobilenet import load_mobilenet_v2

        self.call = None
        if backbones.is_user_backbone(extractor):  # onnx:PATH[@S] or module:pkg.mod:callable
            bb = backbones.resolve(extractor)
            if bb.module is None:
                session, _ = backbones.onnx_session(bb, "cpu", 1)
                self.call = backbones.onnx_call(bb, session)
            else:
                self.call = lambda x: bb.module.embed(x).numpy()
            self.prepare = bb.prepare_fn or (
                lambda imgs: backbones.normalized_input(imgs, bb.size, bb.mean, bb.std))
            self.name = extractor
            return
        base, size = parse_extractor(extractor)
        if base == "efficientnet_lite0":
            self.model = efficientnet.load_efficientnet_lite0(weights)
            self.prepare = lambda imgs: efficientnet_input(imgs, size)
        elif base == "mobilenet_v2":
            self.model = load_mobilenet_v2(weights, progress=False)
            self.prepare = preprocess
        else:
            raise ValueError(f"--extractor {extractor}: a server takes efficientnet_lite0[@S], "
                             "mobilenet_v2, onnx:PATH[@S] or module:package.module:callable")
        self.model.eval()
        self.name = extractor

    def decode(self, blobs: list[bytes]) -> list[np.ndarray]:
        from PIL import Image

        out = []
        for i, blob in enumerate(blobs):
            try:
                with Image.open(io.BytesIO(blob)) as img:
                    if img.format not in ("PNG", "JPEG", "WEBP"):
                        raise ValueError(f"format {img.format}")
                    if img.width * img.height > MAX_PIXELS:
                        raise ValueError(f"{img.width}x{img.height} pixels, at most "
                                         f"{MAX_PIXELS}")
                    out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
            except Exception as e:
                raise ValueError(f"images[{i}]: not a PNG, JPEG or WebP image "
                                 f"({type(e).__name__}: {e})") from None
        return out

    def __call__(self, blobs: list[bytes]) -> np.ndarray:
        imgs = self.decode(blobs)
        with torch.inference_mode():
            if self.call is not None:
                return np.ascontiguousarray(self.call(self.prepare(imgs)), dtype=np.float32)
            z = self.model.embed(self.prepare(imgs))  # (n, 1280) pre-logit features
        return np.ascontiguousarray(z.reshape(len(imgs), -1).numpy(), dtype=np.float32)
