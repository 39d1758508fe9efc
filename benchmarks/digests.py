"""Bit-for-bit check of a change that should not change results: the learners' state digests
after every call of a stream that exercises what a rewrite of storage or rollback can break --
``learn_many`` batches, ``learn_many`` failing after its k-th sample, a new-class ``learn_one``
failing after its update, save/load round trips, refreshes every few samples.

Run it on the code before and after the change (two checkouts), then compare:

    (cd /tmp/before && PYTHONPATH=src python benchmarks/digests.py /tmp/before.json)
    PYTHONPATH=src python benchmarks/digests.py /tmp/after.json
    python benchmarks/digests.py --compare /tmp/before.json /tmp/after.json

A failure is injected with ``conformance.failing_after`` (after the update has run), so the
digest after it checks the rollback too. Deterministic: the same digests on the same machine
and torch build.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ciosl.conformance import InjectedFailure, failing_after
from ciosl.learners import make_learner
from ciosl.serial import digest

CASES = [("ewc", {}), ("ewc", {"refresh_every": 1}), ("ewc", {"refresh_every": 3}),
         ("ewc", {"refresh_every": 2, "lam": 1e6}),
         ("ewc", {"weight_decay": 0.0, "refresh_every": 5}),
         ("mas", {}), ("mas", {"refresh_every": 2}), ("mas", {"weight_decay": 0.0}),
         ("finetune", {}), ("tinyer", {}), ("agem", {}), ("exstream", {}),
         ("ciosl", {}), ("ciosl", {"prior_refresh": "every"}), ("vcl", {}),
         ("vcl", {"prior_refresh": "class"}), ("vcl_coreset", {}), ("ncm", {}), ("slda", {})]


def scenario(method: str, settings: dict, seed: int, n: int, n_classes: int = 30) -> list[str]:
    """The state digest after every call of one stream of ``n`` samples (width 12)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    Z = (rng.normal(size=(n, 12)) + y[:, None] * 0.7).astype(np.float32)
    settings = {"base_epochs": 2, **settings} if "base_epochs" in make_learner(
        method).get_params() else settings
    learner = make_learner(method, **settings)
    learner.fit_base(Z[:40], [int(v) % 3 for v in y[:40]])
    draws = np.random.default_rng(seed + 7)
    out, i = [], 40
    while i < n:
        kind = int(draws.integers(0, 6))
        if kind in (0, 1):  # a batch; first a failing one (after its k-th sample), if 1
            b = int(draws.integers(2, 9))
            Zb, yb = Z[i:i + b], [int(v) for v in y[i:i + b]]
            if kind == 1:
                try:
                    with failing_after(learner, "_learn_one", int(draws.integers(1, b + 1))):
                        learner.learn_many(Zb, yb)
                except InjectedFailure:
                    pass
                out.append(digest(learner.state_dict()))
            learner.learn_many(Zb, yb)
            i += len(yb)
        elif kind == 2:  # a new class whose learn_one fails after its update
            try:
                with failing_after(learner, "_learn_one"):
                    learner.learn_one(Z[i], int(y[i]) + 100)
            except InjectedFailure:
                pass
            out.append(digest(learner.state_dict()))
            learner.learn_one(Z[i], int(y[i]))
            i += 1
        elif kind == 3:  # save and load into a fresh learner
            state = learner.state_dict()
            learner = make_learner(method, **settings)
            learner.load_state_dict(state)
            learner.learn_one(Z[i], int(y[i]))
            i += 1
        else:
            for _ in range(min(5, n - i)):
                learner.learn_one(Z[i], int(y[i]))
                i += 1
        out.append(digest(learner.state_dict()))
    return out


def compare(a: dict, b: dict) -> list[str]:
    """One line per case: equal, or the first call whose digest differs."""
    lines = []
    for key in a:
        if key not in b:
            lines.append(f"{key}: missing in the second file")
            continue
        pairs = enumerate(zip(a[key], b[key], strict=False))  # a shorter run differs at its end
        first = next((k for k, (u, v) in pairs if u != v), min(len(a[key]), len(b[key])))
        same = first == len(a[key]) == len(b[key])
        lines.append(f"{key}: " + ("equal" if same else f"differs from call {first}"))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", help="write the digests here (JSON)")
    ap.add_argument("--methods", help="comma-separated (default: every case's learner)")
    ap.add_argument("--samples", type=int, default=400, help="samples per stream")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two files")
    args = ap.parse_args()
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        lines = compare(a, b)
        print("\n".join(lines))
        sys.exit(0 if all(line.endswith("equal") for line in lines) else 1)
    if not args.out:
        ap.error("give an output file, or --compare A B")
    wanted = set(args.methods.split(",")) if args.methods else None
    result = {f"{m} {s} seed {seed}": scenario(m, s, seed, args.samples)
              for m, s in CASES if wanted is None or m in wanted for seed in (0, 1)}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=0)
    print(f"{len(result)} streams, {sum(map(len, result.values()))} digests: {args.out}")


if __name__ == "__main__":
    main()
