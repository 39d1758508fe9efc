"""A long development stream: every digits training image rendered along a short random
trajectory (rotation, scale, shift, brightness, pixel noise; ``video.render``), 40 frames each,
at 16x16: 57,480 training samples (Fashion-MNIST's 60,000 is the length it stands in for) and
1,800 test samples (5 frames of each test image), standardised like the ``pixels`` extractor.

Written as a ``features:`` file, so that any learner runs on it:

    python benchmarks/long_digits.py /tmp/long-digits.npz
    ciosl run --dataset features:/tmp/long-digits.npz --ordering iid --method ciosl \\
        --buffer 1000 --offline-epochs 2 --seeds 0,1,2

(``--offline-epochs 2`` keeps the offline reference cheap; compare methods paired, on the same
seeds.) Deterministic: the same file on every machine (seed 7).
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import ndimage

from ciosl.data.datasets import load_digits
from ciosl.data.features import standardize
from ciosl.data.video import render

TRAIN_FRAMES, TEST_FRAMES, SEED = 40, 5, 7


def frames(images: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` rendered 16x16 frames of every 8x8 image, image after image. (len * n, 16, 16)"""
    out = []
    for im in images:
        big = ndimage.zoom(im.astype(np.float64), 2.0, order=1, mode="nearest", grid_mode=True)
        out.append(render(big, rng, n))
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the .npz to write")
    args = ap.parse_args()
    src, rng = load_digits(), np.random.default_rng(SEED)
    train = frames(src.train_x.images, TRAIN_FRAMES, rng)
    test = frames(src.test_x.images, TEST_FRAMES, rng)
    flat = lambda x: x.reshape(len(x), -1).astype(np.float32) / 255.0  # noqa: E731
    train_z, test_z = standardize(flat(train), flat(test))
    np.savez(args.out, train_z=train_z, train_y=np.repeat(src.train_y, TRAIN_FRAMES),
             test_z=test_z, test_y=np.repeat(src.test_y, TEST_FRAMES))
    print(f"{args.out}: {len(train_z)} training and {len(test_z)} test samples, "
          f"{train_z.shape[1]} features")


if __name__ == "__main__":
    main()
