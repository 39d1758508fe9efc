"""The continual-learning metrics on a hand-made curve: the accuracy matrix, average forgetting
(Chaudhry et al.), backward transfer (Lopez-Paz & Ranzato), final per-class accuracy."""

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
