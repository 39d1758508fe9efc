"""A result's stored summaries recomputed from the per-run data they summarise: the last of
``schema.result_problem``'s checks (``_contradiction``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from ciosl.report.schema import TOLERANCE, _brief, _finite, stored_omega_events

# ---------------------------------------------------------------- stored summaries vs the runs
# (field, stored value, the value the per-run data give, what gives it): every summary the
# report shows is recomputed from what it summarises, a run's from its own lists, a result's from
# its runs; lenient on absence (a summary whose inputs a result lacks is not checked)
Derivation = tuple[str, Any, Any, str]


def _run_omega(run: dict, events: str) -> float | None:
    """A run's Omega_all from its per-event accuracies, None without them."""
    from ciosl.evaluation.metrics import omega_all

    if not (run.get("accuracy") and run.get("accuracy_offline")):
        return None
    return omega_all(run["accuracy"], run["accuracy_offline"], events=events)


def _matrix_pairs(name: str, stored: list, derived: list, source: str) -> Iterator[Derivation]:
    for t, (row, drow) in enumerate(zip(stored, derived, strict=True)):
        for j, (a, b) in enumerate(zip(row, drow, strict=True)):
            yield f"{name}[{t}][{j}]", a, b, source


def _run_derivations(run: dict, at: str, events: str) -> Iterator[Derivation]:
    """From the rawest record up: class counts give the accuracies, test sizes, matrix and
    class accuracies; the accuracies Omega_all; the matrix forgetting and BWT."""
    from ciosl.evaluation.metrics import (
        accuracy_matrix,
        average_forgetting,
        backward_transfer,
        final_class_accuracy,
    )

    counts = run.get("class_counts")
    if counts:
        given = "its class_counts give"
        pooled = [[sum(kn[i] for kn in c.values()) for i in (0, 1)] for c in counts]
        for key, derived in (("accuracy", [k / n for k, n in pooled]),
                             ("n_test", [n for _, n in pooled])):
            for t, (a, b) in enumerate(zip(run.get(key) or [], derived, strict=False)):
                yield f"{at}.{key}[{t}]", a, b, given
        if run.get("matrix_columns") is not None and run.get("accuracy_matrix") is not None:
            yield from _matrix_pairs(f"{at}.accuracy_matrix", run["accuracy_matrix"],
                                     accuracy_matrix(counts, run["matrix_columns"]), given)
        if run.get("final_class_accuracy") is not None:
            stored, derived = run["final_class_accuracy"], final_class_accuracy(counts)
            for c in [*derived, *(c for c in stored if c not in derived)]:
                yield (f"{at}.final_class_accuracy[{_brief(c)}]", stored.get(c), derived.get(c),
                       given)
    omega = _run_omega(run, events)
    if "omega_all" in run and omega is not None:
        yield (f"{at}.omega_all", run["omega_all"], omega,
               f"its accuracy / accuracy_offline ({events} events) give")
    if run.get("accuracy_matrix") is not None:
        for key, metric in (("forgetting", average_forgetting),
                            ("backward_transfer", backward_transfer)):
            if key in run:
                yield (f"{at}.{key}", run[key], metric(run["accuracy_matrix"]),
                       "its accuracy_matrix gives")


def _summary_pairs(name: str, stored: Any, values: list, source: str) -> Iterator[Derivation]:
    """``stored`` ({"mean", "std"} or None) against ``metrics.summary`` of the runs' values."""
    from ciosl.evaluation.metrics import summary

    if stored is None and None in values:
        return
    derived = summary(values) or {"mean": None, "std": None}
    stored = stored or {}
    yield f"{name}.mean", stored.get("mean"), derived["mean"], source
    if derived["std"] is not None:  # a missing std is shown as 0
        yield f"{name}.std", stored.get("std", 0.0), derived["std"], source


def _derivations(data: dict) -> Iterator[Derivation]:
    from ciosl.evaluation.metrics import mean_matrix

    runs, events = data["runs"], stored_omega_events(data)
    for i, run in enumerate(runs):
        yield from _run_derivations(run, f"runs[{i}]", events)
    omegas = [r["omega_all"] if "omega_all" in r else _run_omega(r, events) for r in runs]
    if None not in omegas:
        yield from _summary_pairs("omega_all", data["omega_all"], omegas,
                                  "the runs' omega_all give")
    if "final_accuracy" in data and all(r.get("accuracy") for r in runs):
        yield from _summary_pairs("final_accuracy", data["final_accuracy"],
                                  [r["accuracy"][-1] for r in runs], "the runs' accuracy[-1] give")
    for key in ("forgetting", "backward_transfer"):
        if key in data:
            yield from _summary_pairs(key, data[key], [r.get(key) for r in runs],
                                      f"the runs' {key} give")
    if data.get("accuracy_matrix") is not None:
        source = "the runs' accuracy_matrix give"
        mean = mean_matrix([r.get("accuracy_matrix") for r in runs])  # None if a run has none
        if mean is None:
            yield "accuracy_matrix", data["accuracy_matrix"], None, source
        else:
            yield from _matrix_pairs("accuracy_matrix", data["accuracy_matrix"], mean, source)
    for key, combine in (("peak_memory_bytes", max), ("samples_per_second", _mean)):
        values = [r.get(key) for r in runs]
        if data.get(key) is not None and None not in values:
            yield key, data[key], combine(values), f"the runs' {key} give"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _agree(stored: Any, derived: Any) -> bool:
    if stored is None or derived is None:
        return stored is derived
    return math.isclose(stored, derived, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _shown(value: Any) -> str:
    return format(value, ".10g") if _finite(value) else _brief(value)


def _contradiction(data: dict) -> str | None:
    """The first stored summary that its per-run data contradict, with both values."""
    for name, stored, derived, source in _derivations(data):
        if not _agree(stored, derived):
            return f"{name} is {_shown(stored)} but {source} {_shown(derived)}"
    return None
