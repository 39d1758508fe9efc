"""How long CIOSL takes to learn a whole real stream, one sample at a time, on one core.

The benchmark protocol's fashion-mnist stream (default: the class-iid ordering, seed 0, the
dataset's default pixel features, d = 784; ``--extractor efficientnet_lite0`` for the
pretrained 1280-d features from the feature cache): CIOSL with the settings the protocol gives
it, ``fit_base`` on the ordering's base set (timed apart: it is offline training, 50 epochs), then
``learn_one`` over every stream sample in order. Testing events and the offline reference are
not run: this times learning only. Prints the base init's time, the stream's time and its
median time per sample, and as the last line the stream's time in minutes.

    python benchmarks/stream_time.py                 # fashion-mnist class_iid, pixels
    python benchmarks/stream_time.py --ordering iid --limit 5000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ciosl.data.datasets import get_spec
from ciosl.data.features import get_features
from ciosl.data.orderings import make_ordering
from ciosl.evaluation.experiment import resolve_settings
from ciosl.learners.base import get_method


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--extractor", default=None, help="default: the dataset's")
    p.add_argument("--ordering", default="class_iid")
    p.add_argument("--method", default="ciosl")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="learn only this many stream samples "
                   "(0: all); the full stream's time is then extrapolated and says so")
    args = p.parse_args()
    torch.set_num_threads(1)

    spec = get_spec(args.dataset)
    fs = get_features(args.dataset, args.extractor, progress=False)
    order = make_ordering(args.ordering, fs.train_y, seed=args.seed,
                          base_fraction=spec.base_fraction,
                          classes_per_step=spec.classes_per_step,
                          instances=fs.train_instance, frames=fs.train_frame)
    cls = get_method(args.method)
    learner = cls(**resolve_settings(cls, spec, args.ordering, None, {}), seed=args.seed)
    Z, y = fs.train_z, fs.train_y
    t = time.perf_counter()
    learner.fit_base(Z[order.base], y[order.base])
    base_s = time.perf_counter() - t
    stream = order.stream[:args.limit] if args.limit else order.stream
    times = []
    t0 = time.perf_counter()
    for i in stream:
        t = time.perf_counter()
        learner.learn_one(Z[i], int(y[i]))
        times.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    full = total * len(order.stream) / len(stream)
    print(f"{args.method} on {args.dataset} {args.ordering} (seed {args.seed}, d = "
          f"{Z.shape[1]}): base init of {len(order.base)} samples {base_s:.1f} s; "
          f"{len(stream)} of {len(order.stream)} stream samples learned in {total:.1f} s, "
          f"median {statistics.median(times) * 1e3:.3f} ms per sample")
    what = "extrapolated from the samples learned" if len(stream) < len(order.stream) else \
        "measured"
    print(f"stream of {len(order.stream)} samples: {full / 60:.2f} min ({what})")


if __name__ == "__main__":
    main()
