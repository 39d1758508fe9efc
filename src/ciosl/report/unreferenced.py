"""Results run without the offline reference (``ciosl run --no-offline``).

Such a result records every testing event's accuracy but no ``accuracy_offline`` and no
Omega_all (``omega_all`` is null). The report never puts one in an Omega_all column: it checks
it, names it among the results left out of those tables, and shows what it has in tables of its
own (``unreferenced_tables``: final accuracy, forgetting, BWT, the accuracy matrix), with a line
saying that Omega_all needs the offline reference. A folder of such results only still gets a
report (of those tables).
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
            "testing events; not in any Omega_all table (its accuracies are in \"Results "
            "without the offline reference\")")


def is_unreferenced(data: dict) -> bool:
    """A well-formed result run without the offline reference: the report shows what it has."""
    return no_reference(data) and unreferenced_problem(data) is None


OMEGA_NEEDS_REFERENCE = ("Omega_all needs the offline reference: {n} result{s} here {were} run "
                         "with --no-offline, so {they} {have} no Omega_all; their final "
                         "accuracy, accuracy matrix and forgetting are in \"Results without the "
                         "offline reference\" (run without --no-offline for Omega_all).")


def reference_line(n: int) -> str:
    one = n == 1
    return OMEGA_NEEDS_REFERENCE.format(n=n, s="" if one else "s", were="was" if one else "were",
                                        they="it" if one else "they", have="has" if one else "have")


def _number(v: Any) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def _summary(v: Any, n_runs: int) -> str:
    """``mean ± std`` of a result's summary (``{"mean", "std"}``), ``–`` when it has none."""
    from ciosl.report.tables import MISSING, mean_pm

    mean = _number(v.get("mean")) if isinstance(v, dict) else None
    if mean is None:
        return MISSING
    return mean_pm(mean, _number(v.get("std")) or 0.0, n_runs)


def _matrix(v: Any) -> list[list[float | None]] | None:
    """A result's accuracy matrix (rows: testing events, columns: class steps; None above the
    diagonal), or None when it has none or it is not one."""
    if not isinstance(v, list) or not v or not all(isinstance(r, list) for r in v):
        return None
    width = len(v[-1])
    if not width or any(len(r) != width for r in v):
        return None
    rows = [[None if a is None else _number(a) for a in r] for r in v]
    if any(a is None and b is not None for r, raw in zip(rows, v, strict=True)
           for a, b in zip(r, raw, strict=True)):
        return None  # a value that is no number
    return rows


def unreferenced_tables(results: list[tuple[Any, dict]], root: Any) -> list:
    """The report's tables of results without the offline reference: one row per result
    (final accuracy, forgetting, backward transfer, mean +- std over its runs), then each
    result's accuracy matrix (mean over runs) where it has one."""
    from ciosl.report.results import method_name
    from ciosl.report.tables import MISSING, Table
    from ciosl.report.text import shorten

    def name(path: Any) -> str:
        try:
            return str(path.relative_to(root))
        except ValueError:
            return str(path)

    summary = Table(kind="unreferenced", title="Results without the offline reference",
                    stub=["method", "dataset", "ordering", "regime"],
                    columns=[("", "runs"), ("", "final accuracy"), ("", "forgetting"),
                             ("", "BWT")],
                    notes=["No Omega_all: it divides by the offline reference's accuracy, "
                           "which these results were run without (--no-offline). Final "
                           "accuracy: the last testing event's; forgetting and BWT: from the "
                           "accuracy matrix (Chaudhry et al. 2018)."])
    matrices = []
    for path, data in results:
        n = len(data["runs"])
        regime = data.get("regime", "streaming")
        regime = regime.get("name", "?") if isinstance(regime, dict) else regime
        label = [method_name(str(data.get("method", "?"))), shorten(str(data.get("dataset", "?"))),
                 shorten(str(data.get("ordering", "?"))), shorten(str(regime))]
        summary.rows.append([*label, str(n), _summary(data.get("final_accuracy"), n),
                             _summary(data.get("forgetting"), n),
                             _summary(data.get("backward_transfer"), n)])
        matrix = _matrix(data.get("accuracy_matrix"))
        if matrix is None:
            continue
        table = Table(kind="unreferenced_matrix", key=f"unreferenced:{len(matrices)}",
                      title=f"Accuracy matrix: {' / '.join(label[:3])} ({name(path)})",
                      stub=["testing event"],
                      columns=[("classes of step", str(j)) for j in range(len(matrix[-1]))],
                      notes=[f"Row t, column j: accuracy after testing event t on the classes "
                             f"of step j, mean over {n} run{'s' * (n > 1)}; {MISSING}: not "
                             "seen yet."])
        for t, row in enumerate(matrix):
            table.rows.append([str(t), *(MISSING if a is None else f"{a:.4f}" for a in row)])
        matrices.append(table)
    return [summary, *matrices] if results else []
