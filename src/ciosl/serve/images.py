"""Images sent to a server started with ``--extractor``: decoded with Pillow (PNG, JPEG, WebP;
grey, palette and alpha converted to RGB), then the frozen extractor with the feature cache's
preprocessing. The features are the extractor's raw pre-logit outputs: a served stream has no
train split to standardise them by, as the benchmark's cached features are."""

from __future__ import annotations

import io
import re

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

    def decode(self, blobs: list[bytes], max_pixels: int | None = None) -> list[np.ndarray]:
        return decode(blobs, max_pixels)

    def __call__(self, blobs: list[bytes], max_pixels: int | None = None) -> np.ndarray:
        imgs = decode(blobs, max_pixels)
        with torch.inference_mode():
            if self.call is not None:
                return np.ascontiguousarray(self.call(self.prepare(imgs)), dtype=np.float32)
            z = self.model.embed(self.prepare(imgs))  # (n, 1280) pre-logit features
        return np.ascontiguousarray(z.reshape(len(imgs), -1).numpy(), dtype=np.float32)


def decode(blobs: list[bytes], max_pixels: int | None = None) -> list[np.ndarray]:
    """The images as RGB arrays. Every image's size is read from its header first, and the
    request is refused before anything is decoded when one image holds more than
    ``MAX_PIXELS`` or all of them more than ``max_pixels`` (a 2 KB PNG can hold 16 million)."""
    from PIL import Image

    opened, total = [], 0
    try:
        for i, blob in enumerate(blobs):
            try:
                img = Image.open(io.BytesIO(blob))
            except Exception as e:
                raise ValueError(f"images[{i}]: not a PNG, JPEG or WebP image "
                                 f"({_reason(e)})") from None
            opened.append(img)
            if img.format not in ("PNG", "JPEG", "WEBP"):
                raise ValueError(f"images[{i}]: not a PNG, JPEG or WebP image (format "
                                 f"{img.format})")
            pixels = img.width * img.height
            if pixels > MAX_PIXELS:
                raise ValueError(f"images[{i}]: {img.width}x{img.height} pixels, at most "
                                 f"{MAX_PIXELS} per image")
            total += pixels
            if max_pixels is not None and total > max_pixels:
                raise ValueError(f"images: {total} pixels in images[0..{i}], at most "
                                 f"{max_pixels} per request (nothing decoded)")
        out = []
        for i, img in enumerate(opened):
            try:
                out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
            except Exception as e:
                raise ValueError(f"images[{i}]: not a PNG, JPEG or WebP image "
                                 f"({_reason(e)})") from None
        return out
    finally:
        for img in opened:
            img.close()


def _reason(e: Exception) -> str:
    """An exception in words, without the memory address a reader's repr puts in it (``cannot
    identify image file <_io.BytesIO object at 0x7f...>``)."""
    text = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text and text[0] else type(e).__name__
