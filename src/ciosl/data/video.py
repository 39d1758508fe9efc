"""Temporally ordered object streams made from still images (iCubWorld 1.0 look-alikes).

Each class gets ``n_instances`` object instances; an instance is one source image of the
training split (chosen deterministically, all distinct). Its training "video" is one smooth
trajectory of ``n_train`` frames and its test video an independent trajectory of ``n_test``
frames (iCubWorld records separate test sequences). Along a trajectory the rotation, scale,
translation and brightness of the source image follow a sum of a few low-frequency sinusoids,
and every frame gets a little Gaussian noise. Generation is seeded (``VIDEO_SEED``), so the
frames are identical on every machine; the seed is part of the fingerprint.
"""

from __future__ import annotations

import hashlib

import numpy as np
from scipy import ndimage

from ciosl.data.types import ArrayImages, RawDataset

VIDEO_SEED = 20240607
VIDEO_VERSION = "v1"  # bump when the generator changes: it is part of the fingerprint

# half-ranges around the neutral value of each transform parameter
ROTATION_DEG = 30.0
SCALE = (0.85, 1.15)
SHIFT = 0.15  # fraction of the image size
BRIGHTNESS = (0.7, 1.2)
NOISE_STD = 4.0  # on the 0..255 scale
FREQ = (0.003, 0.012)  # cycles per frame: 0.6..2.4 cycles over 200 frames


def smooth_trajectory(rng: np.random.Generator, n: int, k: int = 3) -> np.ndarray:
    """A smooth signal in [-1, 1]: a random sum of ``k`` low-frequency sinusoids. (n,)"""
    freq = rng.uniform(*FREQ, size=k)
    phase = rng.uniform(0, 2 * np.pi, size=k)
    amp = rng.uniform(0.3, 1.0, size=k)
    t = np.arange(n)[:, None]
    return (amp * np.sin(2 * np.pi * freq * t + phase)).sum(1) / amp.sum()


def render(source: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` frames of one image along one random smooth trajectory. (n, H, W) uint8."""
    h, w = source.shape
    s = lambda: smooth_trajectory(rng, n)  # noqa: E731
    theta = np.deg2rad(ROTATION_DEG) * s()
    scale = (SCALE[0] + SCALE[1]) / 2 + (SCALE[1] - SCALE[0]) / 2 * s()
    ty, tx = SHIFT * h * s(), SHIFT * w * s()
    bright = (BRIGHTNESS[0] + BRIGHTNESS[1]) / 2 + (BRIGHTNESS[1] - BRIGHTNESS[0]) / 2 * s()
    # inverse map: output pixel p -> source pixel c + R(-theta) (p - c - t) / scale
    cy, cx = (h - 1) / 2, (w - 1) / 2
    yy, xx = np.meshgrid(np.arange(h) - cy, np.arange(w) - cx, indexing="ij")  # (H, W)
    dy = yy[None] - ty[:, None, None]  # (n, H, W)
    dx = xx[None] - tx[:, None, None]
    cos, sin, inv = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None], 1 / scale
    src_y = cy + inv[:, None, None] * (cos * dy - sin * dx)
    src_x = cx + inv[:, None, None] * (sin * dy + cos * dx)
    frames = ndimage.map_coordinates(
        source.astype(np.float64), [src_y, src_x], order=1, mode="constant", cval=0.0
    )  # (n, H, W)
    frames = frames * bright[:, None, None] + rng.normal(0, NOISE_STD, size=frames.shape)
    return np.clip(np.rint(frames), 0, 255).astype(np.uint8)


def make_video_dataset(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    class_names: tuple[str, ...],
    *,
    n_instances: int = 3,
    n_train: int = 200,
    n_test: int = 67,
    upsample: float = 1,
    seed: int = VIDEO_SEED,
) -> RawDataset:
    """Build the object-stream dataset from a still-image training split (n, H, W) uint8.

    ``upsample`` enlarges the source images first (bilinear, by that factor; digits' 8x8 ->
    16x16 so that rotations and sub-pixel shifts stay visible, or -> 28x28, Fashion-MNIST's
    size). Train frames are stored class-major, instance after instance, in temporal order;
    ``train_instance`` is a global id (``class * n_instances + j``) and ``train_frame`` the
    index inside that instance's video.
    ``meta['test_instance']`` gives the instance of each test frame.
    """
    rng = np.random.default_rng(seed)
    train_x, test_x, train_inst, test_inst, sources = [], [], [], [], []
    for c in range(len(class_names)):
        chosen = rng.choice(np.flatnonzero(labels == c), size=n_instances, replace=False)
        sources.extend(int(i) for i in chosen)
        for j, idx in enumerate(chosen):
            img = images[idx].astype(np.float64)
            if upsample > 1:
                img = ndimage.zoom(img, upsample, order=1, mode="nearest", grid_mode=True)
            inst = c * n_instances + j
            train_x.append(render(img, rng, n_train))
            test_x.append(render(img, rng, n_test))
            train_inst.append(np.full(n_train, inst))
            test_inst.append(np.full(n_test, inst))
    train_instance = np.concatenate(train_inst).astype(np.int64)
    test_instance = np.concatenate(test_inst).astype(np.int64)
    tr, te = np.concatenate(train_x), np.concatenate(test_x)
    fp = hashlib.sha256(f"{name}|{VIDEO_VERSION}|seed={seed}|".encode())
    for a in (tr, te, train_instance):
        fp.update(a.tobytes())
    return RawDataset(
        name=name,
        kind="images",
        train_x=ArrayImages(tr),
        train_y=train_instance // n_instances,
        test_x=ArrayImages(te),
        test_y=test_instance // n_instances,
        class_names=tuple(class_names),
        fingerprint=fp.hexdigest(),
        train_instance=train_instance,
        train_frame=np.tile(np.arange(n_train, dtype=np.int64), len(sources)),
        meta={"test_instance": test_instance, "source_indices": tuple(sources), "seed": seed},
    )
