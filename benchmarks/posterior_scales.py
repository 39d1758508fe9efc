"""Are CIOSL's posterior scales learned from the data? Quantiles of sigma per layer after base
init and after the stream, and the first layer's sigma split by how informative its input is.

One run of one (dataset, ordering, seed) at default settings (``--set k=v`` to change them):
the learner is fit on the base-init samples, its sigmas are summarised, then it learns the
stream and they are summarised again. The input columns are ranked by their mean square over
the training set (standardised features: about 1 for a varying pixel, about 0 for a pixel that
is (nearly) constant, whose std was floored): "constant" = columns with E[z^2] < 0.05,
"informative" = columns with E[z^2] >= 0.5. A data-driven posterior keeps the weights of
constant inputs at their prior scale while the informative ones shrink.

Run: ``python benchmarks/posterior_scales.py --dataset fashion-mnist --ordering class_iid``
(``--limit N`` stops the stream after N samples).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ciosl.data.datasets import get_spec
from ciosl.data.features import get_features
from ciosl.data.orderings import make_ordering
from ciosl.evaluation.experiment import parse_assignments, resolve_settings
from ciosl.learners import get_method

QS = (0.01, 0.1, 0.5, 0.9, 0.99)


def summary(learner, col_ms: np.ndarray) -> list[tuple[str, np.ndarray, float]]:
    """(name, sigma quantiles, prior sigma) per tensor, then W1 by input informativeness."""
    net = learner.net
    sig = net.views(net.sigma())
    prior = net.views(net.prec0.rsqrt())
    names = [f"{k}{i + 1}" for i in range(net.n_layers) for k in ("W", "b")]
    rows = [(n, np.quantile(s.reshape(-1).numpy(), QS), float(p.reshape(-1)[0]))
            for n, s, p in zip(names, sig, prior, strict=True)]
    W1 = sig[0].numpy()  # (256, d)
    for label, cols in (("W1 constant in", col_ms < 0.05), ("W1 informative in", col_ms >= 0.5)):
        if cols.any():
            rows.append((f"{label} ({int(cols.sum())} cols)",
                         np.quantile(W1[:, cols].reshape(-1), QS), rows[0][2]))
    return rows


def show(title: str, rows) -> None:
    print(f"\n{title}")
    print(f"| tensor | prior sigma | {' | '.join(f'q{int(q * 100)}' for q in QS)} |")
    print("|---|---|" + "---|" * len(QS))
    for name, q, p in rows:
        print(f"| {name} | {p:.4f} | " + " | ".join(f"{v:.4f}" for v in q) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--ordering", default="class_iid")
    ap.add_argument("--method", default="ciosl")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec, cls = get_spec(args.dataset), get_method(args.method)
    settings = resolve_settings(cls, spec, args.ordering, None, parse_assignments(args.set))
    fs = get_features(args.dataset, "pixels")
    order = make_ordering(args.ordering, fs.train_y, seed=args.seed,
                          base_fraction=spec.base_fraction,
                          classes_per_step=spec.classes_per_step,
                          instances=fs.train_instance, frames=fs.train_frame)
    col_ms = (fs.train_z.astype(np.float64) ** 2).mean(0)
    learner = cls(**settings, seed=args.seed)
    learner.fit_base(fs.train_z[order.base], fs.train_y[order.base])
    show(f"{args.method} on {args.dataset} / {args.ordering}, seed {args.seed}: after base init "
         f"({len(order.base)} samples)", summary(learner, col_ms))
    stream = order.stream[:args.limit]
    for i in stream:
        learner.learn_one(fs.train_z[i], fs.train_y[i])
    show(f"after the stream ({len(stream)} samples)", summary(learner, col_ms))
    acc = learner.score(fs.test_z, fs.test_y)
    print(f"\ntest accuracy after the stream: {100 * acc:.2f} %")


if __name__ == "__main__":
    main()
