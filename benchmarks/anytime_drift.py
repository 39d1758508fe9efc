"""Numerical health of SLDA's kept answer over a long real stream (issue 49, item 4).

The stream is ``long_stream.py``'s (``real``: Fashion-MNIST's efficientnet_lite0 features, the
protocol's class-iid first pass, then uniform revisits; ``synthetic`` as there), learned one
sample at a time by ``slda`` with the protocol's settings (OAS shrinkage). Between checks the
learner only learns. Before each check point it answers after every sample: the first answer
refits (an exact Cholesky factor of S + rho I, the re-anchoring), every later one catches up on
one row (a rank-one Woodbury correction on that anchor, ``anytime.Kept``), until the chain holds
d / 4 corrections (320 at d = 1280), the longest chain the re-anchoring rule allows: the next
answer would refit (docs/anytime.md: a refit when the corrections would pass d / 4 rows, or the
samples grew by 1/8 since the last refit, or the rows since the last answer are gone). There the
kept answer is compared with a fresh solve of the same system on the learner's statistics
(S + rho I with the ridge held, ``torch.linalg.solve``), and the largest absolute differences
printed: of ``predict_proba`` on held-out rows, and of the precision action (S + rho I)^-1 B on
a probe B (the held-out rows' features, d x 64), also relative to its largest entry.

    python benchmarks/anytime_drift.py --samples 1000000 --checks 10
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from anytime import fresh_weights
from long_stream import BLOCK, make, real_stream, synthetic_stream

from ciosl.learners.anytime import pmax_for
from ciosl.learners.shrinkage import held_ridge


def check(learner, Zq: np.ndarray) -> dict:
    """The kept answer against a fresh solve on the same statistics, at this moment."""
    ans = learner._answer
    kept = ans.kept
    S, M = learner.scatter.clone(), learner.mu
    A = S.clone()
    A.diagonal().add_(ans.rho)
    a, _ = held_ridge(ans.rho, ans.t, ans.trace, A.shape[0], learner.shrinkage_estimator)
    W = fresh_weights(learner) / a  # (K, d) the scores' W of a fresh solve
    b = -0.5 * (W * M).sum(1)
    Zq64 = torch.from_numpy(Zq).double()
    P_fresh = torch.softmax(Zq64 @ W.T + b, 1).numpy()
    P_kept = learner.predict_proba(Zq)
    B = Zq64[:64].T.contiguous()  # (d, 64)
    act_kept, act_fresh = kept.apply(B), torch.linalg.solve(A, B)
    dact = float((act_kept - act_fresh).abs().max())
    return {"corrections": len(kept.V), "dp": float(np.abs(P_kept - P_fresh).max()),
            "dact": dact, "dact_rel": dact / float(act_fresh.abs().max()),
            "dW_rel": float((kept.W / a - W).abs().max() / W.abs().max()),
            "shrinkage": ans.shrinkage}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", choices=("real", "synthetic"), default="real")
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--checks", type=int, default=10, help="check points, evenly spaced")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extractor", default="efficientnet_lite0")
    p.add_argument("--dim", type=int, default=1280, help="synthetic: feature width")
    p.add_argument("--rows", type=int, default=1000, help="held-out rows compared")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    stream = (real_stream(args.seed, args.extractor) if args.source == "real" else
              synthetic_stream(args.seed, args.dim, 20, 5000))
    learner = make("slda", args.source, [], None)
    if stream.base_z is not None:
        learner.fit_base(stream.base_z, stream.base_y)
    Zq = stream.test_z[:args.rows]
    d = Zq.shape[1]
    pmax = pmax_for(d)
    points = [args.samples * (i + 1) // args.checks for i in range(args.checks)]
    starts = {q - pmax - 1 for q in points}  # answers after every sample from here on
    print(f"slda on {args.source} (d = {d}, OAS): {args.samples} samples, checks at "
          f"{', '.join(map(str, points))}, each after a chain of {pmax} one-row corrections")
    print("| samples | corrections | shrinkage | max abs diff predict_proba | max abs diff "
          "precision action | relative | W relative | elapsed |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    t0, answering, worst = time.perf_counter(), False, [0.0, 0.0, 0.0]
    for blk in range(math.ceil(args.samples / BLOCK)):
        Z, y = stream.block(blk)
        for i in range(min(BLOCK, args.samples - blk * BLOCK)):
            pos = blk * BLOCK + i + 1
            learner.learn_one(Z[i], int(y[i]))
            answering = answering or pos in starts
            if not answering:
                continue
            learner.predict_proba(Zq[:1])  # an answer: a refit first, then one-row catch-ups
            kept = learner._answer.kept
            if kept is not None and len(kept.V) == pmax:
                r = check(learner, Zq)
                worst = [max(w, v) for w, v in zip(worst, (r["dp"], r["dact_rel"], r["dW_rel"]),
                                                   strict=True)]
                print(f"| {pos:,} | {r['corrections']} | {r['shrinkage']:.2e} | {r['dp']:.2e} "
                      f"| {r['dact']:.2e} | {r['dact_rel']:.2e} | {r['dW_rel']:.2e} "
                      f"| {time.perf_counter() - t0:.0f} s |", flush=True)
                answering = False
    print(f"worst: predict_proba {worst[0]:.2e}, precision action (relative) {worst[1]:.2e}, "
          f"W (relative) {worst[2]:.2e}; {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
