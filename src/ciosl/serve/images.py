"""Images sent to a server started with ``--extractor``: encoded files decoded with Pillow (PNG,
JPEG, WebP; grey, palette and alpha converted to RGB) or raw uint8 frames (``inputs.frames``),
prepared in the request's thread and extracted in the batches of ``batching.Batcher`` by the
extractor ``ciosl features`` runs (``ciosl.data.extraction``: same preprocessing, device,
backend and threads). The features are the extractor's raw pre-logit outputs: a served stream
has no train split to standardise them by, as the benchmark's cached features are. The folder
records the extractor (``pin_extractor``: ``DIR/extractor.json``)."""

from __future__ import annotations

import io
import re

import numpy as np
import torch

from ciosl.serve.batching import DEFAULT_IMAGES, DEFAULT_WAIT_MS, Batcher, BatchFailed
from ciosl.serve.inputs import Refused

MAX_PIXELS = 4096 * 4096


class Embedder:
    """``embedder([bytes, ...]) -> (n, d) float32`` features of encoded images, and
    ``embedder.frames(uint8 (n, h, w, 3))`` of raw frames: decoded and prepared in the
    request's thread, extracted in the batches of ``batching.Batcher`` by the extractor that
    ``ciosl features`` runs (``ciosl.data.extraction.open_extractor``: ``how``'s device,
    backend and threads)."""

    def __init__(self, extractor: str, weights: str | None = None, *, how=None,
                 batch_images: int | None = None, batch_wait_ms: float = DEFAULT_WAIT_MS,
                 options=None):
        from ciosl.data.extraction import open_extractor

        self.extractor = open_extractor(extractor, weights, how, options)
        self.name = extractor
        self.batcher = Batcher(self.extractor.forward,
                               batch_images or DEFAULT_IMAGES.get(self.extractor.device, 64),
                               batch_wait_ms)

    def decode(self, blobs: list[bytes], max_pixels: int | None = None) -> list[np.ndarray]:
        return decode(blobs, max_pixels)

    def __call__(self, blobs: list[bytes], max_pixels: int | None = None) -> np.ndarray:
        with self.batcher.arriving():
            imgs = decode(blobs, max_pixels)
            x = self._prepare(imgs, "images")
        return self._run(x)

    def frames(self, frames: np.ndarray) -> np.ndarray:
        """Features of uint8 frames (n, h, w, 3), checked by ``inputs.frames``."""
        with self.batcher.arriving():
            x = self._prepare(frames, "frames")
        return self._run(x)

    def _prepare(self, imgs, field: str) -> torch.Tensor:
        try:
            with torch.inference_mode():
                return self.extractor.prepare(imgs)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as e:
            raise Refused(503, f"{field}: the extractor's preprocessing failed ({_reason(e)})"
                          "; nothing was learned") from None

    def _run(self, x: torch.Tensor) -> np.ndarray:
        try:
            z = self.batcher.run(x)
        except BatchFailed as e:
            raise Refused(503, f"extractor {self.name}: the batch holding this request failed "
                          f"({e}); nothing of it was learned, retry") from None
        if not np.isfinite(z).all():
            raise Refused(503, f"extractor {self.name}: features that are not finite; "
                          "nothing of this request was learned")
        return z

    def close(self) -> None:
        self.batcher.close()
        self.extractor.close()


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


PIN = "extractor.json"


def open_embedder(extractor: str, device: str | None = None, backend: str | None = None,
                  threads: int | None = None, batch_images: int | None = None,
                  batch_wait_ms: float = DEFAULT_WAIT_MS) -> Embedder:
    """``ciosl serve --extractor``'s embedder on ``--device`` / ``--backend`` / ``--threads``
    (``$CIOSL_DEVICE``, ``$CIOSL_BACKEND``), each bad value named in one ``ServeError``."""
    from ciosl.data.features import execution
    from ciosl.serve.folder import ServeError

    if batch_images is not None and not 1 <= batch_images <= 4096:
        raise ServeError(f"--batch-images must be in 1..4096, got {batch_images}")
    if not 0 <= batch_wait_ms <= 1000:
        raise ServeError(f"--batch-wait-ms must be in 0..1000, got {batch_wait_ms}")
    try:
        how = execution(device, backend, threads)
        return Embedder(extractor, how=how, batch_images=batch_images,
                        batch_wait_ms=batch_wait_ms)
    except ValueError as e:
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ServeError(text if text.startswith("--") or text.startswith("CIOSL_")
                         else f"--extractor {extractor}: {text}") from None


def pin_extractor(folder, pin: dict) -> None:
    """Record the extractor in ``FOLDER/extractor.json`` (first start with ``--extractor``),
    or refuse in one line a restart with another one: the log holds the first one's
    features."""
    from pathlib import Path

    from ciosl.fileio import atomic_write_json, load_json
    from ciosl.serve.folder import ServeError

    path = Path(folder) / PIN
    if not path.exists():
        atomic_write_json(path, pin)
        return
    try:
        had = load_json(path, PIN)
    except ValueError as e:
        raise ServeError(f"--dir {folder}: {e}") from None
    if not isinstance(had, dict):
        raise ServeError(f"{path}: not an extractor record")
    names = {"extractor": "--extractor", "size": "input size", "weights": "weights checksum",
             "backend": "--backend", "device": "--device"}
    diff = [k for k in names if had.get(k) != pin.get(k)]
    if diff:
        k = diff[0]
        was, now = had.get(k), pin.get(k)
        if k == "weights":
            was, now = str(was)[:12], str(now)[:12]
        raise ServeError(
            f"--dir {folder} holds features of extractor {had.get('extractor')} (size "
            f"{had.get('size')}, {had.get('backend')} on {had.get('device')}); this start's "
            f"{names[k]} is {now}, not {was}: start it with the same extractor, or use "
            "another --dir")
