"""Soak benchmark: a long synthetic stream through one learner, one sample at a time.

Shows that a learner's memory stays flat and its time per sample does not grow over a long
stream (default: 1 million samples through ``ciosl``). Classes keep arriving during the first
``--arrival`` samples (the output layer grows), then the stream revisits all of them.

At each report point it prints the resident memory of the process (now and peak, from
/proc/self/status), the size of the learner's serialized state, and the time per sample over
the last window; the last line compares the final window with the first one after all classes
arrived.

    python benchmarks/soak.py                       # 1M samples of ciosl, d = 32, 20 classes
    python benchmarks/soak.py --samples 100000 --method tinyer
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ciosl.learners import make_learner


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def calibration_ms(dim: int, reps: int = 300) -> float:
    """Milliseconds of a fixed workload of small matrix products (the shapes of one step's
    forward and backward pass through a [256, 256] head on 17 rows), timed now: dividing a
    window's time per sample by it cancels the machine's load, which drifts on a shared host."""
    g = torch.Generator().manual_seed(0)
    X, W1 = torch.randn(17, dim, generator=g), torch.randn(dim, 256, generator=g)
    W2 = torch.randn(256, 256, generator=g)
    t = time.perf_counter()
    for _ in range(reps):
        H = torch.relu(X @ W1)
        G = torch.relu(H @ W2)
        _ = G @ W2.T, H.T @ G, X.T @ H
    return 1000 * (time.perf_counter() - t) / reps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="ciosl")
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--arrival", type=int, default=5_000,
                   help="samples during which new classes keep appearing")
    p.add_argument("--report-at", default="10000,100000,1000000")
    p.add_argument("--window", type=int, default=5_000, help="samples per timing window")
    p.add_argument("--buffer", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    rng = np.random.default_rng(args.seed)
    centers = rng.normal(0.0, 2.0, (args.classes, args.dim)).astype(np.float32)
    learner = make_learner(args.method, buffer=args.buffer) if args.method != "slda" else \
        make_learner(args.method)
    report_at = sorted({int(x) for x in args.report_at.split(",") if int(x) <= args.samples})
    Zt = np.repeat(centers, 50, axis=0) + rng.normal(size=(50 * args.classes, args.dim))
    yt = np.repeat(np.arange(args.classes), 50)

    print(f"{args.method}: {args.samples} samples, d={args.dim}, {args.classes} classes arriving "
          f"over the first {args.arrival}, buffer {args.buffer}")
    print(f"{'samples':>9} {'RSS MiB':>8} {'peak RSS':>9} {'state MiB':>10} {'ms/sample':>10} "
          f"{'/calib':>7} {'accuracy':>9}")
    ratios: list[float] = []
    windows: list[tuple[int, float]] = []
    t_window = time.perf_counter()
    batch = 1000  # draw noise in blocks: the stream, not the generator, is measured
    for start in range(0, args.samples, batch):
        n = min(batch, args.samples - start)
        pos = np.arange(start, start + n)
        seen = np.minimum(args.classes, 1 + pos * args.classes // max(1, args.arrival))
        y = (rng.random(n) * seen).astype(np.int64)
        Z = centers[y] + rng.normal(size=(n, args.dim)).astype(np.float32)
        for i in range(n):
            learner.learn_one(Z[i], int(y[i]))
            done = start + i + 1
            if done % args.window == 0:
                now = time.perf_counter()
                windows.append((done, (now - t_window) / args.window))
                t_window = now
            if done in report_at:
                rss, peak = rss_mib()
                state = learner.memory_bytes() / 2**20
                ms = 1000 * windows[-1][1]
                calib = calibration_ms(args.dim)
                # the window's time per sample over the calibration workload timed now (twice)
                ratios.append(ms / (0.5 * (calib + calibration_ms(args.dim))))
                acc = learner.score(Zt, yt)
                print(f"{done:>9} {rss:>8.1f} {peak:>9.1f} {state:>10.2f} {ms:>10.3f} "
                      f"{ratios[-1]:>7.2f} {acc:>9.3f}", flush=True)
                t_window = time.perf_counter()  # evaluation is not part of the next window
    if len(ratios) >= 2:
        print(f"load-corrected time per sample, last report / first report: "
              f"{ratios[-1] / ratios[0]:.3f}")


if __name__ == "__main__":
    main()
