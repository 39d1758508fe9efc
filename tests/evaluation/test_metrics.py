"""The continual-learning metrics on a hand-made curve: the accuracy matrix, average forgetting
(Chaudhry et al.), backward transfer (Lopez-Paz & Ranzato), final per-class accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl.evaluation.metrics import (
    accuracy_matrix,
    average_forgetting,
    backward_transfer,
    class_counts,
    continual_metrics,
    final_class_accuracy,
    matrix_columns,
    mean_matrix,
)

# Three class steps: classes (4, 1), then 0, then 2 and 3 (the seed-permuted class order).
EVENTS = [(4, 1), (4, 1, 0), (4, 1, 0, 2, 3)]
# {label: [correct, n]} at each testing event, on the classes tested there
COUNTS = [
    {"1": [9, 10], "4": [7, 10]},                                           # step 0: 16/20
    {"0": [8, 10], "1": [5, 10], "4": [5, 10]},                             # 0: 8/10, old 10/20
    {"0": [4, 10], "1": [6, 10], "2": [10, 10], "3": [6, 10], "4": [6, 10]},  # old 12/20, 4/10
]


def test_accuracy_matrix_forgetting_and_backward_transfer_by_hand():
    columns = matrix_columns(EVENTS, range(5))
    assert columns == [[4, 1], [0], [2, 3]]
    R = accuracy_matrix(COUNTS, columns)
    assert R == [[0.8, None, None], [0.5, 0.8, None], [0.6, 0.4, 0.8]]
    # forgetting: step 0 best 0.8 (event 0), last 0.6 -> 0.2; step 1 best 0.8, last 0.4 -> 0.4
    assert average_forgetting(R) == pytest.approx(0.3)
    # BWT: step 0 0.6 - 0.8 = -0.2; step 1 0.4 - 0.8 = -0.4 (the last step does not count)
    assert backward_transfer(R) == pytest.approx(-0.3)
    assert final_class_accuracy(COUNTS) == {"0": 0.4, "1": 0.6, "2": 1.0, "3": 0.6, "4": 0.6}


def test_forgetting_uses_the_best_earlier_accuracy_and_bwt_the_first():
    # column 0 rises then drops: first 0.5, best earlier 0.9 (event 1), last 0.7;
    # column 1 (first tested at event 1) improves afterwards: negative forgetting
    R = [[0.5, None], [0.9, 0.3], [0.7, 0.6]]
    assert average_forgetting(R) == pytest.approx(((0.9 - 0.7) + (0.3 - 0.6)) / 2)
    assert backward_transfer(R) == pytest.approx(((0.7 - 0.5) + (0.6 - 0.3)) / 2)
    assert average_forgetting([[0.9]]) is None and backward_transfer([[0.9]]) is None


def test_iid_orderings_get_one_column_per_class():
    assert matrix_columns(None, range(3)) == [[0], [1], [2]]
    counts = [{"0": [5, 10], "1": [10, 10], "2": [0, 5]},
              {"0": [10, 10], "1": [8, 10], "2": [1, 5]}]
    R = accuracy_matrix(counts, matrix_columns(None, range(3)))
    assert R == [[0.5, 1.0, 0.0], [1.0, 0.8, 0.2]]
    assert average_forgetting(R) == pytest.approx(((0.5 - 1.0) + (1.0 - 0.8) + (0.0 - 0.2)) / 3)
    assert backward_transfer(R) == pytest.approx((0.5 - 0.2 + 0.2) / 3)


def test_class_counts_and_a_run_without_them():
    pred, y = np.array([1, 1, 0, 2, 2]), np.array([1, 0, 0, 2, 1])
    assert class_counts(pred, y) == {"0": [1, 2], "1": [1, 2], "2": [1, 1]}
    assert continual_metrics(None, None) == {"accuracy_matrix": None, "forgetting": None,
                                             "backward_transfer": None,
                                             "final_class_accuracy": None}
    m = continual_metrics(COUNTS, matrix_columns(EVENTS, range(5)))
    assert m["forgetting"] == pytest.approx(0.3) and m["final_class_accuracy"]["2"] == 1.0
    assert mean_matrix([[[0.2, None]], [[0.4, None]]]) == [[pytest.approx(0.3), None]]
    assert mean_matrix([[[0.2]], None]) is None


# ---------------------------------------------------------------------------- 10,000 classes


def python_calls(fn) -> int:
    """The Python function calls ``fn()`` makes (a count of work, not a time); the garbage
    collector is off meanwhile (its finalizers would add calls that are not ``fn``'s)."""
    import gc
    import sys

    calls = [0]

    def count(frame, event, arg):
        calls[0] += event == "call"

    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls[0]


def test_per_event_metrics_do_not_loop_over_classes():
    """class_counts (every testing event) and the accuracy matrix: one vectorised pass, not a
    Python loop over the classes. Counted: the Python calls made are the same for 2,000 and
    for 20,000 classes (a loop over the classes makes some per class). The time of 20,000
    classes is a benchmark: ``python benchmarks/metrics_time.py``."""
    from ciosl.evaluation.metrics import accuracy_matrix, class_counts, matrix_columns

    def metrics(C: int):
        rng = np.random.default_rng(0)
        y = rng.permutation(np.repeat(np.arange(C), 2))
        pred = np.where(rng.random(len(y)) < 0.5, y, 0)
        steps = [list(range(0, C * (t + 1) // 40)) for t in range(40)]
        out = {}

        def work():
            out["counts"] = [class_counts(pred, y) for _ in range(3)]
            out["R"] = accuracy_matrix(out["counts"], matrix_columns(None, range(C)))
            matrix_columns(steps, range(C))
        return work, out, pred, y

    python_calls(metrics(100)[0])  # warm-up: first calls import and cache
    small, big = (python_calls(metrics(C)[0]) for C in (2_000, 20_000))
    # a loop over the classes would make 18,000 more (one per class at least); a few calls
    # may come and go with NumPy's own caches
    assert big - small < 100, (small, big)
    work, out, pred, y = metrics(20_000)
    work()
    assert out["counts"][0]["5"] == [int((pred[y == 5] == 5).sum()), 2]
    assert out["R"][0][5] == out["counts"][0]["5"][0] / 2
