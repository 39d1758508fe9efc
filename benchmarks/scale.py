"""Cost per new class (issue 34): what a sample of a new class costs at class 10 and at class
10,000 (100,000), against a sample of a known class at the same moment.

For every single-pass learner, at feature width ``--dim`` (64) and one thread: a base init on 2
classes, then a stream where each sample of a new class is followed by one sample of a class
already known (drawn uniformly). In one process, it prints per learner:

- new, first 10% / last 10%: the median time of ``learn_one`` on a new class over the first and
  the last tenth of the classes, and their ratio (``growth``);
- known, last 10%: the median time of a known-class sample over the last tenth;
- new / known: the last tenth's ratio (the target: <= 1.5);
- for the MLP heads, the time of the output layer's share of a plain SGD step at the first and
  the last size (its products on the step's rows and its weights' momentum update:
  ``head_arithmetic``), against how much a known sample's step grew over the classes: the
  growth should be that arithmetic (times the passes a method makes), not bookkeeping.

Then ``learn_many`` with batches of 10 against ten ``learn_one`` calls on the same samples
(alternating blocks on two twins, medians, per sample), and, with ``--block-rate``, Deep SLDA's
and NCM's ``learn_one`` rate at width 1280 against the rate of the block update's float64 GEMM
(S += D^T D, D of 256 rows) in the same process.

``--profile``: instead of timing, a cProfile of 60 new-class and 60 known-class samples,
alternating, after ``--mlp-classes`` classes (where a new class's extra time goes).

Run: ``python benchmarks/scale.py`` (``--methods ncm,slda,rp_lda --classes 100000``: the issue's
100,000 classes for the learners whose step does not depend on the classes; ``--mlp-classes``:
the classes for the MLP heads and the memory learners, slower per class by their arithmetic).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ciosl.learners import available_methods, make_learner
from ciosl.learners.base import Learner

FAST = ("ncm", "slda", "rp_lda", "ranpac")  # a step independent of the number of classes
SETTINGS = {"rp_lda": {"proj_dim": 512}, "ranpac": {"proj_dim": 512}}  # D = 4096 (the default) is 10 s per 256-row block


def single_pass() -> list[str]:
    return [n for n, c in available_methods().items() if not c.violates_single_pass]


def stream(n_classes: int, dim: int, seed: int = 0):
    """Rows (2 n_classes, d): new class k at row 2k, then a known class (< k) at row 2k + 1."""
    rng = np.random.default_rng(seed)
    new = np.arange(n_classes)
    known = np.array([rng.integers(max(k, 1)) for k in range(n_classes)])
    y = np.stack([new, known], 1).reshape(-1)
    centres = rng.normal(0, 1, (n_classes, dim)).astype(np.float32)
    Z = centres[y] + 0.3 * rng.normal(size=(len(y), dim)).astype(np.float32)
    return Z, y


def base(learner: Learner, dim: int) -> None:
    rng = np.random.default_rng(1)
    y = np.repeat([-1, -2], 20)  # two base classes, labels apart from the stream's
    learner.fit_base(rng.normal(size=(40, dim)).astype(np.float32) + y[:, None], y.tolist())


def head_arithmetic(rows: int, n_out: int, width: int = 256, reps: int = 30) -> float:
    """Median time of the output layer's share of a plain SGD step on ``rows`` rows: its three
    products (forward, weight gradient, input gradient) and the momentum update of its
    weights (weight decay, buffer, step, the gradient's norm): what an MLP head's step must
    do per class, whatever its bookkeeping."""
    h, W, g = torch.randn(rows, width), torch.randn(n_out, width), torch.randn(rows, n_out)
    buf = torch.zeros_like(W)

    def run() -> None:
        h @ W.T
        gW = g.T @ h
        g @ W
        torch.linalg.vector_norm(gW)
        buf.mul_(0.9).add_(gW.add_(W, alpha=1e-5))
        W.sub_(buf, alpha=1e-9)

    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def timed_pairs(method: str, n_classes: int, dim: int) -> tuple:
    """(learner, time of each new class's learn_one, time of the known class's learn_one that
    follows it, whole run): ``n_classes`` pairs after the base init."""
    learner = make_learner(method, **SETTINGS.get(method, {}))
    base(learner, dim)
    Z, y = stream(n_classes, dim)
    t_new, t_known = np.zeros(n_classes), np.zeros(n_classes)
    clock = time.perf_counter
    t0 = clock()
    for k in range(n_classes):
        a = clock()
        learner.learn_one(Z[2 * k], int(y[2 * k]))
        b = clock()
        learner.learn_one(Z[2 * k + 1], int(y[2 * k + 1]))
        t_new[k], t_known[k] = b - a, clock() - b
    return learner, t_new, t_known, clock() - t0


def per_class(method: str, n_classes: int, dim: int) -> dict:
    learner, t_new, t_known, total = timed_pairs(method, n_classes, dim)
    tenth = max(n_classes // 10, 1)
    out = {"method": method, "classes": n_classes, "total": total,
           "new_first": float(np.median(t_new[:tenth])),
           "new_last": float(np.median(t_new[-tenth:])),
           "known_first": float(np.median(t_known[:tenth])),
           "known_last": float(np.median(t_known[-tenth:]))}
    if hasattr(learner, "net"):  # an MLP head: its output layer's products
        rows = 1 + getattr(learner, "n_replay", 0) + getattr(learner, "n_distill", 0)
        out["products"] = (head_arithmetic(rows, tenth // 2 + 2),
                           head_arithmetic(rows, n_classes - tenth // 2 + 2))
    return out


def ratios_at(method: str, sizes: list[int], dim: int, window: int = 50) -> dict[int, float]:
    """new / known at each of ``sizes`` classes: medians over the ``window`` pairs (a new
    class, then a known one) that follow that size, in one stream (the small sizes, where a
    step's fixed cost dominates, as well as the large ones)."""
    _, t_new, t_known, _ = timed_pairs(method, max(sizes) + window, dim)
    return {s: float(np.median(t_new[s:s + window]) / np.median(t_known[s:s + window]))
            for s in sizes}


def profile(method: str, n_classes: int, dim: int, pairs: int = 60, rows: int = 18) -> str:
    """cProfile of ``pairs`` new-class and known-class ``learn_one`` calls, alternating, after
    ``n_classes`` classes: the functions by their own time, known first, then new (where a new
    class's extra time goes)."""
    import cProfile
    import io
    import pstats

    learner = make_learner(method, **SETTINGS.get(method, {}))
    base(learner, dim)
    Z, y = stream(n_classes + pairs, dim)
    for k in range(n_classes):
        learner.learn_one(Z[2 * k], int(y[2 * k]))
        learner.learn_one(Z[2 * k + 1], int(y[2 * k + 1]))
    new, known = cProfile.Profile(), cProfile.Profile()
    for k in range(n_classes, n_classes + pairs):
        for prof, i in ((new, 2 * k), (known, 2 * k + 1)):
            prof.enable()
            learner.learn_one(Z[i], int(y[i]))
            prof.disable()
    out = []
    for name, prof in (("known", known), ("new", new)):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(rows)
        out.append(f"===== {method}, {pairs} {name}-class samples after {n_classes} classes")
        out += [line for line in text.getvalue().splitlines() if line.strip()]
    return "\n".join(out)


def report(r: dict) -> str:
    ms = 1e3
    line = (f"{r['method']:<13} {r['classes']:>7} classes: new {r['new_first'] * ms:7.3f} ms -> "
            f"{r['new_last'] * ms:7.3f} ms (growth x{r['new_last'] / r['new_first']:.2f}); "
            f"known {r['known_last'] * ms:7.3f} ms; new/known {r['new_last'] / r['known_last']:.2f}"
            f"; whole run {r['total']:.1f} s")
    if "products" in r:
        p0, p1 = r["products"]
        grew = r["known_last"] - r["known_first"]
        line += (f"; output layer's arithmetic {p0 * ms:.3f} -> {p1 * ms:.3f} ms (a known "
                 f"sample's step grew {grew * ms:.3f} ms, that arithmetic {(p1 - p0) * ms:.3f} "
                 f"ms: x{grew / max(p1 - p0, 1e-9):.1f})")
    return line


def many_vs_one(method: str, dim: int, n_classes: int = 50, rounds: int = 30) -> float:
    """Per-sample time of learn_many(10 rows) over that of ten learn_one, medians of
    alternating blocks on two twins."""
    a, b = (make_learner(method, **SETTINGS.get(method, {})) for _ in range(2))
    for learner in (a, b):
        base(learner, dim)
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(rounds * 10, dim)).astype(np.float32)
    y = rng.integers(n_classes, size=rounds * 10)
    t_many, t_one = [], []
    for r in range(rounds):
        Zr, yr = Z[10 * r:10 * r + 10], y[10 * r:10 * r + 10].tolist()
        t = time.perf_counter()
        a.learn_many(Zr, yr)
        t_many.append(time.perf_counter() - t)
        t = time.perf_counter()
        for z, k in zip(Zr, yr, strict=True):
            b.learn_one(z, k)
        t_one.append(time.perf_counter() - t)
    return statistics.median(t_many[3:]) / statistics.median(t_one[3:])


def block_rate(method: str, dim: int = 1280, n: int = 4096, block: int = 256) -> tuple:
    """(learn_one samples/s, the block GEMM's samples/s), alternating, in one process."""
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(n, dim)).astype(np.float32)
    y = rng.integers(100, size=n).tolist()
    learner = make_learner(method)
    learner.fit_base(Z[:block], y[:block])
    S = torch.zeros(dim, dim, dtype=torch.float64)
    D = torch.from_numpy(Z[:block]).double()
    t_learn = t_gemm = 0.0
    for s in range(block, n, block):
        t = time.perf_counter()
        for i in range(s, s + block):
            learner.learn_one(Z[i], y[i])
        t_learn += time.perf_counter() - t
        t = time.perf_counter()
        S.addmm_(D.T, D)
        t_gemm += time.perf_counter() - t
    k = (n - block)
    return k / t_learn, k / block * block / t_gemm


def call_overhead(method: str, dim: int = 1280, calls: int = 255) -> float:
    """Microseconds per ``learn_one`` of a known class when no block is committed (the per-call
    protocol: input checks, all-or-nothing, the row's write), best of five runs of ``calls``."""
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(256 + calls, dim)).astype(np.float32)
    y = rng.integers(100, size=256).tolist()
    y += y[:calls]  # known classes only
    best = float("inf")
    for _ in range(5):
        learner = make_learner(method)
        learner.fit_base(Z[:256], y[:256])  # one full block, committed: nothing waits
        t = time.perf_counter()
        for i in range(256, 256 + calls):  # fewer than a block: none is committed
            learner.learn_one(Z[i], y[i])
        best = min(best, time.perf_counter() - t)
    return best / calls * 1e6


def write_features(path: str, n_classes: int, dim: int, per_class: int = 2) -> None:
    """A ``features:PATH`` file of ``n_classes`` Gaussian classes (``per_class`` training rows
    and one test row each, width ``dim``) for ``ciosl run`` at that many classes."""
    rng = np.random.default_rng(5)
    centres = rng.normal(0, 1, (n_classes, dim)).astype(np.float32)
    ytr = np.repeat(np.arange(n_classes), per_class)
    yte = np.arange(n_classes)
    noise = 0.3 * rng.normal(size=(len(ytr) + len(yte), dim)).astype(np.float32)
    np.savez(path, train_z=centres[ytr] + noise[:len(ytr)], train_y=ytr,
             test_z=centres[yte] + noise[len(ytr):], test_y=yte)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="all", help="comma-separated, or all (single-pass)")
    ap.add_argument("--classes", type=int, default=10000,
                    help=f"classes for {', '.join(FAST)} (the issue: 10000 and 100000)")
    ap.add_argument("--mlp-classes", type=int, default=1000,
                    help="classes for the other learners (the issue: 10000)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--no-many", action="store_true", help="skip learn_many vs learn_one")
    ap.add_argument("--block-rate", action="store_true",
                    help="SLDA / NCM learn_one at d = 1280 against the block GEMM")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="instead of timing: cProfile 60 new- and known-class samples after "
                         "--mlp-classes classes (--classes for the fast learners)")
    ap.add_argument("--sizes", metavar="N,N,...",
                    help="instead of timing one size: new / known at each of these numbers of "
                         "classes (medians over the 50 pairs after each), every learner")
    ap.add_argument("--write-features", metavar="PATH",
                    help="only write a features .npz of --classes classes (2 training rows and "
                         "1 test row each, width --dim) for ciosl run --dataset features:PATH")
    args = ap.parse_args()
    if args.write_features:
        write_features(args.write_features, args.classes, args.dim)
        print(f"wrote {args.write_features}: {args.classes} classes, width {args.dim}")
        return
    torch.set_num_threads(args.threads)
    methods = single_pass() if args.methods == "all" else args.methods.split(",")
    if args.profile:
        for m in methods:
            print(profile(m, args.classes if m in FAST else args.mlp_classes, args.dim), flush=True)
        return
    if args.sizes:
        sizes = [int(v) for v in args.sizes.split(",")]
        print(f"width {args.dim}, {args.threads} thread(s); new / known at each number of classes")
        for m in methods:
            r = ratios_at(m, sizes, args.dim)
            print(f"{m:<13} " + "  ".join(f"{s}: {v:.2f}" for s, v in r.items()), flush=True)
        return
    print(f"width {args.dim}, {args.threads} thread(s); times are medians of single calls")
    for m in methods:
        n = args.classes if m in FAST else args.mlp_classes
        print(report(per_class(m, n, args.dim)), flush=True)
    if not args.no_many:
        for m in methods:
            print(f"{m:<13} learn_many(10) / 10 x learn_one, per sample: "
                  f"{many_vs_one(m, args.dim):.2f}", flush=True)
    if args.block_rate:
        for m in ("slda", "ncm"):
            ours, gemm = block_rate(m)
            print(f"{m} at d = 1280: learn_one {ours:,.0f} samples/s; block GEMM (float64, 256 "
                  f"rows) {gemm:,.0f} samples/s; ratio {ours / gemm:.2f}", flush=True)


if __name__ == "__main__":
    main()
