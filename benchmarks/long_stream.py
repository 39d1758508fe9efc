"""Long-stream benchmark: a learner fed a stream of a million samples, one at a time.

Two sources:

- ``real`` (default): the frozen efficientnet_lite0 features of Fashion-MNIST's train split,
  standardised as the protocol does (the feature cache of ``ciosl features --dataset
  fashion-mnist --extractor efficientnet_lite0``). The stream starts with the protocol's
  class-iid ordering (``fit_base`` on the base classes, then the other classes two at a
  time), then revisits samples drawn uniformly from every class seen: samples repeat, the
  stream does not end. Held-out accuracy is measured on the real test split.
- ``synthetic``: ``soak.py``'s stream, 20 Gaussian classes (centres N(0, 2^2) per feature,
  unit noise) arriving over the first 5,000 samples, then revisited uniformly; no base init.

At each report point it prints the held-out accuracy, the time per sample over the window
since the last point, the size of the learner's state and, for the Bayesian heads, what
drifts: the hidden units that never fire on held-out data under the mean weights, the
posterior scales against the prior's, the data's share of the precision, and the Fisher's
scale. ``--out FILE.json`` rewrites a result after every point; ``--checkpoint FILE``
saves the learner there at every point and ``--resume`` goes on from it (the stream is a
pure function of the seed and the position, so a resumed run is the run).

    python benchmarks/long_stream.py --method ciosl                 # 1M real samples
    python benchmarks/long_stream.py --source synthetic --dim 1280 --method tinyer
    python benchmarks/long_stream.py --method ncm --samples 250000 --out ncm.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ciosl.learners import get_method

DEFAULT_POINTS = "10000,50000,100000,250000,500000,1000000"
BLOCK = 1000  # the stream is drawn in blocks, each from its own generator (resumable)


@dataclass
class Stream:
    """A stream that is a pure function of (seed, position): ``block(b)`` gives samples
    b * BLOCK ... (b + 1) * BLOCK - 1 as (Z, y)."""

    base_z: np.ndarray | None
    base_y: np.ndarray | None
    test_z: np.ndarray
    test_y: np.ndarray
    block: object  # callable (b) -> (Z (n, d) float32, y (n,) int64)
    first_pass: int  # samples of the class-incremental first pass


def real_stream(seed: int, extractor: str) -> Stream:
    """Fashion-MNIST features: the protocol's class-iid ordering, then uniform revisits."""
    from ciosl.data.datasets import get_spec
    from ciosl.data.features import get_features
    from ciosl.data.orderings import make_ordering

    fs = get_features("fashion-mnist", extractor)
    spec = get_spec("fashion-mnist")
    order = make_ordering("class_iid", fs.train_y, seed=seed, base_fraction=spec.base_fraction,
                          classes_per_step=spec.classes_per_step)
    first, X, Y = order.stream, fs.train_z, fs.train_y
    pool = np.concatenate([order.base, order.stream])  # every class seen once the pass is over

    def block(b: int) -> tuple[np.ndarray, np.ndarray]:
        pos = np.arange(b * BLOCK, (b + 1) * BLOCK)
        idx = np.empty(BLOCK, np.int64)
        inside = pos < len(first)
        idx[inside] = first[pos[inside]]
        rng = np.random.default_rng([seed, 1, b])
        idx[~inside] = pool[rng.integers(0, len(pool), int((~inside).sum()))]
        return X[idx], Y[idx]

    return Stream(X[order.base], Y[order.base], fs.test_z, fs.test_y, block, len(first))


def synthetic_stream(seed: int, dim: int, classes: int, arrival: int) -> Stream:
    """soak.py's stream: Gaussian classes arriving over ``arrival`` samples, then revisited."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 2.0, (classes, dim)).astype(np.float32)
    test_z = (np.repeat(centers, 50, axis=0) + rng.normal(size=(50 * classes, dim))).astype(
        np.float32)
    test_y = np.repeat(np.arange(classes), 50)

    def block(b: int) -> tuple[np.ndarray, np.ndarray]:
        r = np.random.default_rng([seed, 2, b])
        pos = np.arange(b * BLOCK, (b + 1) * BLOCK)
        seen = np.minimum(classes, 1 + pos * classes // max(1, arrival))
        y = (r.random(BLOCK) * seen).astype(np.int64)
        return (centers[y] + r.normal(size=(BLOCK, dim))).astype(np.float32), y

    return Stream(None, None, test_z, test_y, block, arrival)


def make(method: str, source: str, overrides: list[str], buffer: int | None):
    """The learner with the protocol's settings for fashion-mnist class-iid (``real``) or the
    constructor's (``synthetic``, as soak.py), then ``--set`` values."""
    from ciosl.data.datasets import get_spec
    from ciosl.evaluation.experiment import resolve_settings

    cls = get_method(method)
    sets = dict(o.split("=", 1) for o in overrides)
    names = {s.name for s in cls.settings()}
    if source == "real":
        settings = resolve_settings(cls, get_spec("fashion-mnist"), "class_iid", buffer, sets)
    else:
        settings = resolve_settings(cls, get_spec("fashion-mnist"), "class_iid", None, sets)
        settings = {k: v for k, v in settings.items() if k in sets}  # the constructor's
        if "buffer" in names and "buffer" not in sets:
            settings["buffer"] = 1000 if buffer is None else buffer
    return cls(**settings)


@torch.no_grad()
def bayes_diagnostics(learner, Z: np.ndarray) -> dict:
    """What drifts in a Bayesian head (``learner.net`` a ``bnn.BayesMLP``), on held-out rows
    Z under the mean weights: per hidden layer the share of units that never fire; per layer
    the median posterior scale over the prior's, the median data share of the precision
    (evidence * Fbar / precision) and the mean Fbar; the mean top softmax."""
    net = learner.net
    out: dict = {}
    h = torch.from_numpy(np.ascontiguousarray(Z[:2000]))
    for i in range(net.n_layers - 1):
        h = torch.relu(torch.nn.functional.linear(h, net.mu_l[2 * i], net.mu_l[2 * i + 1]))
        out[f"dead_l{i + 1}"] = float((h.max(0).values <= 0).float().mean())
    prec = net.views(net.precision())
    prior = net.views(net.prec0)
    data = net.views(net.fisher * net._fisher_weight())
    fisher = net.views(net.fisher)
    for i in range(net.n_layers):
        W = 2 * i
        out[f"sigma_ratio_l{i + 1}"] = float((prior[W] / prec[W]).sqrt().median())
        out[f"data_share_l{i + 1}"] = float((data[W] / prec[W]).median())
        out[f"fbar_l{i + 1}"] = float(fisher[W].mean())
        out[f"mu_norm_l{i + 1}"] = float(net.mu_l[W].norm())
    P = torch.from_numpy(learner.predict_proba(Z[:2000]))
    out["confidence"] = float(P.max(1).values.mean())
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="ciosl")
    p.add_argument("--source", choices=("real", "synthetic"), default="real")
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--report-at", default=DEFAULT_POINTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="K=V")
    p.add_argument("--buffer", type=int, default=None)
    p.add_argument("--extractor", default="efficientnet_lite0")
    p.add_argument("--dim", type=int, default=1280, help="synthetic: feature width")
    p.add_argument("--classes", type=int, default=20, help="synthetic: classes")
    p.add_argument("--arrival", type=int, default=5000, help="synthetic: arrival samples")
    p.add_argument("--out", type=Path, help="result JSON, rewritten at every report point")
    p.add_argument("--checkpoint", type=Path, help="learner saved here at every report point")
    p.add_argument("--resume", action="store_true", help="go on from --checkpoint")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    stream = (real_stream(args.seed, args.extractor) if args.source == "real" else
              synthetic_stream(args.seed, args.dim, args.classes, args.arrival))
    points = sorted({int(x) for x in args.report_at.split(",") if 0 < int(x) <= args.samples})
    result = {"method": args.method, "source": args.source, "seed": args.seed,
              "settings": args.set, "samples": args.samples, "first_pass": stream.first_pass,
              "dim": int(stream.test_z.shape[1]), "points": []}
    cls = get_method(args.method)
    done = 0
    if args.resume and args.checkpoint and args.checkpoint.exists():
        learner = cls.load(args.checkpoint)
        old = json.loads(args.out.read_text()) if args.out and args.out.exists() else None
        if old:
            result["points"] = old["points"]
        done = learner.n_seen_ - (0 if stream.base_y is None else len(stream.base_y))
        print(f"resumed at {done} stream samples")
    else:
        learner = make(args.method, args.source, args.set, args.buffer)
        if stream.base_z is not None:
            t = time.perf_counter()
            learner.fit_base(stream.base_z, stream.base_y)
            print(f"fit_base: {len(stream.base_y)} samples in {time.perf_counter() - t:.1f} s")
    if done % BLOCK:
        raise SystemExit(f"checkpoint at {done} samples, not at a block boundary")
    def bayes() -> bool:  # the state is built on the first sample
        return hasattr(learner, "net") and hasattr(learner.net, "fisher")

    print(f"{args.method} on {args.source} (d={result['dim']}): {args.samples} samples, "
          f"first pass {stream.first_pass}")
    print(f"{'samples':>9} {'accuracy':>9} {'ms/sample':>10} {'state MiB':>10}"
          + "  diagnostics (Bayesian heads)", flush=True)
    t_learn, n_learn = 0.0, 0
    for b in range(done // BLOCK, math.ceil(args.samples / BLOCK)):
        Z, y = stream.block(b)
        n = min(BLOCK, args.samples - b * BLOCK)
        for i in range(n):
            t = time.perf_counter()
            learner.learn_one(Z[i], int(y[i]))
            t_learn += time.perf_counter() - t
            n_learn += 1
            pos = b * BLOCK + i + 1
            if pos not in points:
                continue
            row = {"samples": pos, "accuracy": float(learner.score(stream.test_z, stream.test_y)),
                   "ms_per_sample": 1000 * t_learn / n_learn,
                   "state_mib": learner.memory_bytes() / 2**20}
            if bayes():
                row.update(bayes_diagnostics(learner, stream.test_z))
            result["points"] = [r for r in result["points"] if r["samples"] < pos] + [row]
            extra = "  ".join(f"{k} {v:.3g}" for k, v in row.items() if k not in
                              ("samples", "accuracy", "ms_per_sample", "state_mib"))
            print(f"{pos:>9} {row['accuracy']:>9.4f} {row['ms_per_sample']:>10.3f} "
                  f"{row['state_mib']:>10.2f}  {extra}", flush=True)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=1) + "\n")
            if args.checkpoint:
                learner.save(args.checkpoint)
            t_learn, n_learn = 0.0, 0
    pts = {r["samples"]: r["accuracy"] for r in result["points"]}
    if 100_000 in pts and len(pts) > 1:
        last = max(pts)
        print(f"accuracy at {last} - accuracy at 100000: {pts[last] - pts[100_000]:+.4f}")


if __name__ == "__main__":
    main()
