"""Time of the per-event metrics over many classes: ``class_counts`` at three testing events,
the accuracy matrix of one column per class, and the columns of 40 class steps.

The test suite checks that this work does not loop over the classes in Python (it counts the
Python calls made at 2,000 and at 20,000 classes: the same); the time itself is a figure, for
this machine at this moment, and lives here.
Run: ``python benchmarks/metrics_time.py [--classes 20000] [--repeat 5]``; prints the median
seconds of ``--repeat`` passes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ciosl.evaluation.metrics import accuracy_matrix, class_counts, matrix_columns


def metrics_time(classes: int, repeat: int) -> float:
    rng = np.random.default_rng(0)
    y = rng.permutation(np.repeat(np.arange(classes), 2))
    pred = np.where(rng.random(len(y)) < 0.5, y, 0)
    steps = [list(range(0, classes * (t + 1) // 40)) for t in range(40)]
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        counts = [class_counts(pred, y) for _ in range(3)]
        accuracy_matrix(counts, matrix_columns(None, range(classes)))
        matrix_columns(steps, range(classes))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    seconds = metrics_time(args.classes, args.repeat)
    print(f"per-event metrics of {args.classes:,} classes (3 events, the accuracy matrix, 40 "
          f"class steps): {seconds:.3f} s (median of {args.repeat})")


if __name__ == "__main__":
    main()
