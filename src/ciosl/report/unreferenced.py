"""Results run without the offline reference (``ciosl run --no-offline``).

Such a result records every testing event's accuracy but no ``accuracy_offline`` and no
Omega_all (``omega_all`` is null). Every table of the report is an Omega_all table, so the
report never puts one in a column: it checks it and names it among the results left out, with
its final accuracy, as what it is.
"""

from __future__ import annotations

import math
from typing import Any

from ciosl.evaluation.experiment import no_reference


def _accuracy_list(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(
        isinstance(a, int | float) and not isinstance(a, bool) and math.isfinite(a)
        and 0 <= a <= 1 for a in v)


def unreferenced_problem(data: dict) -> str | None:
    """Why a result without reference is malformed (None: it is well formed): no Omega_all
    anywhere, no offline accuracy, accuracies in [0, 1], one per testing event, and the stored
    final accuracy the mean of the runs' last accuracies."""
    if data.get("omega_all") is not None:
        return "omega_all must be null in a result without offline reference"
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        return "runs must be a non-empty list"
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            return f"runs[{i}] must be an object"
        if run.get("omega_all") is not None or "accuracy_offline" in run:
            return f"runs[{i}] records an Omega_all or offline accuracies without a reference"
        if not _accuracy_list(run.get("accuracy")):
            return f"runs[{i}].accuracy must be a non-empty list of numbers in [0, 1]"
        events = run.get("events")
        if not isinstance(events, list) or len(events) != len(run["accuracy"]):
            return f"runs[{i}].events must have one position per accuracy"
    final = [run["accuracy"][-1] for run in runs]
    stored = (data.get("final_accuracy") or {}).get("mean")
    if not (isinstance(stored, int | float) and abs(stored - sum(final) / len(final)) <= 1e-9):
        return "final_accuracy.mean is not the mean of the runs' last accuracies"
    return None


def unreferenced_reason(data: dict) -> str | None:
    """The report's line for a result without reference (None: not such a result)."""
    if not no_reference(data):
        return None
    problem = unreferenced_problem(data)
    if problem is not None:
        return f"malformed result: {problem}"
    n = len(data["runs"])
    events = len(data["runs"][0]["accuracy"])
    return (f"run without the offline reference (--no-offline), so no Omega_all: final accuracy "
            f"{data['final_accuracy']['mean']:.4f} over {n} run{'s' * (n > 1)}, {events} "
            "testing events; not in any Omega_all table")
