"""Which input side does efficientnet_lite0 need on 28x28 sources? A linear probe per side.

A stratified Fashion-MNIST subset (N_TRAIN train / N_TEST test images, seed 0) is embedded at
each side S (``efficientnet_lite0@S``), standardised, and a logistic-regression probe
(scikit-learn, C = 0.1) is fitted on the train part; test accuracy and images/s are printed, next to
the same probe on standardised pixels. Run: ``python benchmarks/extractor_resolution.py``
(about 5 minutes on 2 quiet cores). Needs Fashion-MNIST (``make data``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

from ciosl.data.datasets import load_dataset
from ciosl.data.efficientnet import load_efficientnet_lite0
from ciosl.data.features import efficientnet_input, standardize


def probe(train_z, ytr, test_z, yte) -> float:
    train_z, test_z = standardize(train_z, test_z)
    clf = LogisticRegression(C=0.1, max_iter=3000).fit(train_z, ytr)
    return float((clf.predict(test_z) == yte).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sides", default="32,64,96,128,160,224")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-test", type=int, default=2000)
    args = ap.parse_args()
    raw = load_dataset("fashion-mnist")
    x, y = raw.train_x.images, raw.train_y
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, train_size=args.n_train, test_size=args.n_test,
                              stratify=y, random_state=0)
    model = load_efficientnet_lite0()
    pix = x.reshape(len(x), -1).astype(np.float32) / 255
    print(f"pixels: probe accuracy {probe(pix[tr], y[tr], pix[te], y[te]):.4f}")
    for side in (int(s) for s in args.sides.split(",")):
        t0 = time.perf_counter()
        with torch.inference_mode():
            z = np.concatenate([model.embed(efficientnet_input(x[idx[i:i + 32]], side)).numpy()
                                for idx in (np.concatenate([tr, te]),)
                                for i in range(0, len(idx), 32)])
        secs = time.perf_counter() - t0
        acc = probe(z[: len(tr)], y[tr], z[len(tr):], y[te])
        print(f"efficientnet_lite0@{side}: probe accuracy {acc:.4f}, "
              f"{len(z) / secs:.0f} images/s ({torch.get_num_threads()} threads)", flush=True)


if __name__ == "__main__":
    main()
