"""Answers at any moment (issue 49): the first prediction after a learn against a plain one.

For each closed-form learner at feature width ``--dim`` (1280), after ``--samples`` (2,000)
samples of ``--classes`` (20) classes learned one at a time, in one process and one thread:

- plain: ``predict_proba`` of ``--rows`` (100) rows when nothing was learned since the last
  answer;
- first after a learn: the same call right after one ``learn_one`` (of a known class);
- learn: that ``learn_one`` itself;
- ratio: first after a learn / plain (the issue's target: at most 2).

``acil`` keeps no answer to catch up: its learn is the exact recursive update (Sherman-Morrison
on the D x D inverse), so its "first answer (refit)" is a plain prediction and its learn_one
carries the cost the others pay at the answer. ``--drift`` does not apply to it (no anchor).

The rounds alternate (plain, learn, first after the learn), ``--rounds`` of them, and the medians
are printed; every round catches up on one row, so the medians include the kept solutions'
refits when their corrections reach d / 4 rows only if ``--rounds`` passes d / 4 (the mean is
printed too). ``--old`` measures what the learners did before issue 49, a refit at the first
answer after new samples (the kept answer dropped before each prediction).

``--drift N``: numerical health instead. Each learner learns N samples one at a time and
answers after every one (the kept solution is caught up on one row each time: the longest
chains of corrections), and every ``--check-every`` samples, at the last answer before a
refit (d / 4 corrections on the anchor), its kept solution W is compared with a fresh solve
on the statistics (the same ridge held): the largest |W_kept - W_fresh| / max |W_fresh| and
the largest difference of the probabilities on held-out rows are printed.

Run: ``python benchmarks/anytime.py`` (``--methods ncm,slda`` for a subset, ``--proj-dim 1024``
for smaller random features); ``python benchmarks/anytime.py --drift 100000 --methods slda``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ciosl.learners import make_learner

METHODS = ("ncm", "slda", "rp_lda", "ranpac", "acil")
RANDOM_FEATURES = ("rp_lda", "ranpac", "acil")  # take --proj-dim


def data(n: int, dim: int, classes: int, seed: int = 0, part: int | None = None
         ) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes with a shared non-diagonal covariance, non-negative like pooled CNN
    features: Z (n, dim) float32, y (n,); ``part``: the samples drawn from their own generator
    (the same classes: a long stream drawn in parts)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (classes, dim))
    A = rng.normal(size=(dim, 32)) / np.sqrt(32)  # a low-rank shared component
    if part is not None:
        rng = np.random.default_rng([seed, part])
    y = rng.integers(classes, size=n)
    Z = centres[y] + rng.normal(size=(n, 32)) @ A.T + 0.5 * rng.normal(size=(n, dim))
    return np.maximum(Z, 0).astype(np.float32), y


def forget(learner) -> None:
    """Drop the kept answer and the published one: the next answer refits."""
    learner._answer = None
    learner.__dict__.pop("_pub", None)


def measure(method: str, settings: dict, Z, y, Zq, rounds: int, old: bool) -> dict:
    learner = make_learner(method, **settings)
    n = len(y) - 2 * rounds
    for i in range(n):
        learner.learn_one(Z[i], int(y[i]))
    t = time.perf_counter()
    learner.predict_proba(Zq)  # the first answer: a refit
    t_refit = time.perf_counter() - t
    plain, learn, first, silent = [], [], [], []
    for i in range(n, n + rounds):
        t = time.perf_counter()
        learner.predict_proba(Zq)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        learner.learn_one(Z[i], int(y[i]))  # a prediction was asked: it brings the answer current
        learn.append(time.perf_counter() - t)
        if old:
            forget(learner)  # what the learners did before: refit after new samples
        t = time.perf_counter()
        learner.predict_proba(Zq)
        first.append(time.perf_counter() - t)
    learner.learn_one(Z[n + rounds], int(y[n + rounds]))  # the last one a prediction preceded
    for i in range(n + rounds + 1, n + 2 * rounds):  # no prediction since: the buffer only
        t = time.perf_counter()
        learner.learn_one(Z[i], int(y[i]))
        silent.append(time.perf_counter() - t)
    return {"plain": statistics.median(plain), "first": statistics.median(first),
            "first_mean": statistics.mean(first), "learn": statistics.median(learn),
            "learn_mean": statistics.mean(learn), "silent": statistics.median(silent),
            "refit": t_refit}


def fresh_weights(learner) -> torch.Tensor:
    """A fresh solve of the kept answer's system on the learner's statistics: (S + rho I)^-1
    M^T for the LDA learners, (G + lambda I)^-1 C for RanPAC; (K, d)."""
    ans = learner._answer
    if learner.name == "slda":
        A, R = learner.scatter.clone(), learner.mu
    elif learner.name == "rp_lda":
        Hp, yp, counts, sums = learner._totals()
        A, R = learner._scatter(Hp, yp, counts, sums), sums / counts.clamp(min=1)[:, None]
    else:
        Hp, yp, counts, sums = learner._totals()
        c, t = learner.shift, learner.n_committed + len(yp)
        from ciosl.learners.rplda import add_gram_, symmetric
        A = symmetric(add_gram_(learner.m2.clone(), Hp)) if learner.n_committed else Hp.T @ Hp
        s = sums.sum(0)
        A += torch.outer(c, s) + torch.outer(s, c) + t * torch.outer(c, c)
        R = sums + counts[:, None].double() * c
    A.diagonal().add_(ans.rho)
    return torch.linalg.solve(A, R.T).T


def drift(method: str, settings: dict, n: int, dim: int, classes: int, every: int) -> None:
    from ciosl.learners.anytime import pmax_for
    Zq, _ = data(200, dim, classes, seed=2, part=10**6)  # held out, the same classes
    learner = make_learner(method, **settings)
    width = settings.get("proj_dim", dim)
    pmax = pmax_for(width)
    worst_w = worst_p = 0.0
    due, t0 = every, time.perf_counter()
    for i in range(n):
        if i % 1000 == 0:  # drawn in parts of 1,000 samples (a long stream at d = 1280)
            Z, y = data(1000, dim, classes, seed=2, part=i // 1000)
        learner.learn_one(Z[i % 1000], int(y[i % 1000]))
        learner.predict_proba(Zq)
        kept = learner._answer.kept
        if i + 1 >= due and kept is not None and len(kept.V) == pmax:
            W = kept.W
            Wf = fresh_weights(learner)
            err = float((W - Wf).abs().max() / Wf.abs().max())
            P = learner.predict_proba(Zq)
            forget(learner)  # a refit at the same moment, to compare the answers
            dp = float(np.abs(P - learner.predict_proba(Zq)).max())
            worst_w, worst_p = max(worst_w, err), max(worst_p, dp)
            print(f"{method} at {i + 1} samples, {len(kept.V)} corrections on the anchor: "
                  f"W relative error {err:.2e}, probabilities (vs a refit now, its shrinkage "
                  f"re-chosen) {dp:.2e}; {time.perf_counter() - t0:.0f} s", flush=True)
            due += every
    print(f"{method}: worst W relative error {worst_w:.2e} over {n} samples (d = {width}, "
          f"{pmax} corrections at most)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--proj-dim", type=int, default=4096, help="D of rp_lda, ranpac and acil")
    ap.add_argument("--old", action="store_true",
                    help="drop the kept answer before each prediction (the refit of before)")
    ap.add_argument("--drift", type=int, default=0, metavar="N",
                    help="numerical health over N samples instead of timings")
    ap.add_argument("--check-every", type=int, default=10000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.drift:
        for m in args.methods.split(","):
            if m == "acil":
                print("acil: no kept answer (exact at every learn): --drift does not apply")
                continue
            settings = {"proj_dim": args.proj_dim} if m in RANDOM_FEATURES else {}
            drift(m, settings, args.drift, args.dim, args.classes, args.check_every)
        return
    Z, y = data(args.samples + 2 * args.rounds, args.dim, args.classes)
    Zq, _ = data(args.rows, args.dim, args.classes, seed=1)
    print(f"d = {args.dim}, {args.samples} samples of {args.classes} classes, {args.rows} rows "
          f"predicted, {args.rounds} rounds, medians, one thread"
          + (", OLD (refit after new samples)" if args.old else ""), flush=True)
    print("| learner | plain prediction | first prediction after one learn | ratio "
          "| learn_one after a prediction | learn_one, no prediction since "
          "| first answer (refit) |")
    print("|---|---|---|---|---|---|---|")
    for m in args.methods.split(","):
        settings = {"proj_dim": args.proj_dim} if m in RANDOM_FEATURES else {}
        r = measure(m, settings, Z, y, Zq, args.rounds, args.old)
        print(f"| {m} | {r['plain'] * 1e3:.2f} ms | {r['first'] * 1e3:.2f} ms "
              f"(mean {r['first_mean'] * 1e3:.2f}) | x{r['first'] / r['plain']:.2f} "
              f"| {r['learn'] * 1e3:.3f} ms (mean {r['learn_mean'] * 1e3:.3f}) "
              f"| {r['silent'] * 1e3:.3f} ms | {r['refit'] * 1e3:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
