"""The paper's tables from classified results, and their Markdown rendering.

- ``main_table``: Table 2 — methods as rows, (ordering, dataset) as columns, Omega_all mean ± std
  over runs, the best single-pass streaming method of each column in bold, methods that violate
  single pass marked with a dagger, and the offline learner's mean accuracy (Offline-hat).
- ``final_table``: the same layout with the test accuracy after the whole stream (the offline
  learner's last, too); ``cost_table``: samples learned per second and learner state size;
  ``continual_tables``: average forgetting, then backward transfer, in the same layout;
  ``open_set_tables``: AUROC / AUOSC of the results run with ``--open-set``.
- ``sampling_table``: memory replacement x sample selection (the paper's Table 4).
- ``setting_tables``: one table per setting varied alone (lambda2, buffer, ...): Omega_all as a
  function of that setting (lambda2 also crossed with selection/replacement, as in the paper).
- ``regime_table``: batch / online / streaming versions of each method.
- ``other_table``: every remaining result, so none is silently left out.

One row per method: a cell whose result ran a default that is not the paper's (``Entry.
departures``) carries a letter, and the table's legend lists each set of departures once
(``departures.departure_legend``), the same letters in every table of a report.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

# departures from the paper and the legend under a table (departures.py): re-exported here
from ciosl.report.departures import (  # noqa: F401
    EVIDENCE,
    FINDINGS,
    Departures,
    Legend,
    _hashable,
    _value_text,
    departure_legend,
    departures_of,
    legend_markdown,
    legend_parts,
)
from ciosl.report.results import (
    REGIME_ORDER,
    Column,
    Entry,
    method_key,
    method_name,
    offline_entry,
    offline_hat,
    pick,
)
from ciosl.report.text import md_escape, shorten, superscript

DAGGER = "†"
MISSING = "–"
SAMPLING = ("selection", "replacement")
SELECTION_ORDER = ("uniform", "uapn", "lapn")
REPLACEMENT_ORDER = ("lawcbr", "lawrrr", "reservoir", "class_balanced_random")
SETTING_FIRST = ("lambda2", "buffer")
SETTING_EXTRAS = {"lambda2": SAMPLING}  # the paper crosses lambda2 with sampling/replacement


@dataclass
class Table:
    kind: str  # main, sampling, setting, regimes, other
    title: str
    stub: list[str]  # headers of the row-label columns
    columns: list[tuple[str, str]]  # (group, label) of each value column
    rows: list[list[str]] = field(default_factory=list)  # stub cells, then value cells
    bold: set[tuple[int, int]] = field(default_factory=set)  # (row, value column)
    notes: list[str] = field(default_factory=list)
    setting: str | None = None  # for kind == "setting"
    series: list[tuple[str, list[tuple[Any, Entry]]]] = field(default_factory=list)  # plots
    # departure letters of a cell ((row, value column); value column -1: the row label)
    marks: dict[tuple[int, int], str] = field(default_factory=dict)
    legend: list[tuple[str, str]] = field(default_factory=list)  # (letter, departures) in use
    evidence: list[str] = field(default_factory=list)  # settings of the legend, for its links
    key: str = ""  # what its figures refer to (``Figure.table``): the kind, or kind:detail

    def __post_init__(self) -> None:
        self.key = self.key or (f"setting:{self.setting}" if self.setting else self.kind)

    def header(self) -> list[str]:
        return self.stub + [f"{g} · {lab}" if g else lab for g, lab in self.columns]


def mean_pm(mean: float, std: float, n_runs: int, digits: int = 4) -> str:
    """``mean ± std``; a single run has no spread to show: its value alone."""
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if n_runs > 1 else "")


def fmt(entry: Entry | None) -> str:
    return MISSING if entry is None else mean_pm(entry.mean, entry.std, entry.n_runs)


def _bold_best(table: Table, cells: list[list[Entry | None]], eligible,
               value=lambda e: e.mean, digits: int = 4) -> None:
    """Bold the highest ``value`` of each value column among the eligible entries (ties, to
    the printed ``digits``: all)."""
    for j in range(len(table.columns)):
        col = [(i, round(value(row[j]), digits)) for i, row in enumerate(cells)
               if row[j] is not None and eligible(row[j])]
        if col:
            best = max(x for _, x in col)
            table.bold |= {(i, j) for i, x in col if x == best}


def _streaming_single_pass(e: Entry) -> bool:
    return not e.violates and e.method != "offline"


OMEGA_NOTE = {"after_base": "over the testing events after base init",
              "all": "over every testing event, base init included"}


def _runs_note(entries: list[Entry]) -> str:
    n = sorted({e.n_runs for e in entries})
    runs = f"{n[0]}" if len(n) == 1 else f"{n[0]}–{n[-1]}"
    events = sorted({e.omega_events for e in entries})
    over = " and ".join(OMEGA_NOTE.get(x, x) for x in events)
    return f"Omega_all ({over}): mean ± std (sample std) over {runs} runs per cell."


def _main_cells(entries: list[Entry]):
    """The main table's entries by (method, row label, column): streaming, default settings
    (a row per method and grid-fixed settings: two grids may fix different values)."""
    chosen = [e for e in entries if e.regime == "streaming" and not e.diff]
    cells: dict[tuple[str, str, Column], list[Entry]] = defaultdict(list)
    for e in chosen:
        cells[(e.method, e.label, e.column)].append(e)
    columns = sorted({c for *_, c in cells})
    rows = sorted({(m, lab) for m, lab, _ in cells}, key=lambda r: (method_key(r[0]), r[1]))
    grid = [[pick(cells[(m, lab, c)]) if (m, lab, c) in cells else None for c in columns]
            for m, lab in rows]
    return chosen, columns, rows, grid


def _method_rows(table: Table, rows, grid, legend: Legend | None = None,
                 label_marks: bool = False) -> None:
    """A row per (method, label) with its dagger; with ``legend``, each cell's departure
    letters in ``table.marks`` (``label_marks``: on the row label, for a one-result row)."""
    for (_, label), row in zip(rows, grid, strict=True):
        violates = any(e is not None and e.violates for e in row)
        i = len(table.rows)
        table.rows.append([label + (f" {DAGGER}" if violates else "")])
        if legend is None:
            continue
        for j, e in ([(-1, row)] if label_marks else [(j, [e]) for j, e in enumerate(row)]):
            mark = legend.mark(e)
            if mark:
                table.marks[(i, j)] = mark


def _finish_marks(table: Table, legend: Legend) -> None:
    """The table's legend and evidence from the letters its cells carry (none on an empty
    cell)."""
    stub = len(table.stub)
    table.marks = {(i, j): m for (i, j), m in table.marks.items()
                   if any(c != MISSING for c in (table.rows[i][stub:] if j < 0
                                                 else [table.rows[i][stub + j]]))}
    table.legend = legend.lines(set(table.marks.values()))
    shown = {x for _, text in table.legend for x in text.replace(",", " ").split()}
    table.evidence = [k for k in EVIDENCE if any(x.startswith(k + "=") for x in shown)]


def _fixed_note(chosen: list[Entry]) -> list[str]:
    if any(e.fixed for e in chosen):
        return ["(name=value): a setting the sweep grid fixes for that method "
                "([settings.METHOD]), in place of its default."]
    return []


def main_table(entries: list[Entry], legend: Legend) -> Table | None:
    chosen, columns, rows, grid = _main_cells(entries)
    if not chosen:
        return None
    table = Table("main", "Omega_all (Table 2)", ["Method"],
                  [(c.ordering.replace("_", "-"), c.label) for c in columns])
    _method_rows(table, rows, grid, legend)
    for cells, row in zip(table.rows, grid, strict=True):
        cells += [fmt(e) for e in row]
    _bold_best(table, grid, _streaming_single_pass)
    hat = []
    for j in range(len(columns)):
        col = [row[j] for row in grid if row[j] is not None]
        value = offline_hat(col)
        hat.append(MISSING if value is None else f"{value:.4f}")
    table.rows.append(["Offline accuracy (Offline-hat)"] + hat)
    table.notes = [
        _runs_note(chosen),
        f"Bold: the best single-pass streaming method of the column. {DAGGER}: retrains or "
        "fine-tunes before inference (violates single-pass streaming; never bold).",
        "Offline-hat: the offline learner's accuracy, averaged over the runs and the events "
        f"Omega_all averages. {MISSING}: not run.",
        *_fixed_note(chosen),
    ]
    _finish_marks(table, legend)
    return table


def _final(e: Entry | None) -> tuple[float, float] | None:
    final = e.data.get("final_accuracy") if e is not None else None
    if not (isinstance(final, dict) and "mean" in final):
        return None
    return 100 * float(final["mean"]), 100 * float(final.get("std", 0.0))


def final_table(entries: list[Entry], legend: Legend) -> Table | None:
    """Test accuracy (%) at the last testing event, with the offline learner's, same layout."""
    chosen, columns, rows, grid = _main_cells(entries)
    values = [[_final(e) for e in row] for row in grid]
    if not any(v is not None for row in values for v in row):
        return None
    table = Table("final", "Final accuracy (%)", ["Method"],
                  [(c.ordering.replace("_", "-"), c.label) for c in columns])
    _method_rows(table, rows, grid, legend)
    for cells, row, grid_row in zip(table.rows, values, grid, strict=True):
        cells += [MISSING if v is None else mean_pm(*v, e.n_runs, 2)
                  for v, e in zip(row, grid_row, strict=True)]
    _bold_best(table, grid, lambda e: _final(e) is not None and _streaming_single_pass(e),
               value=lambda e: _final(e)[0], digits=2)  # as in Table 2
    offline = []
    for j in range(len(columns)):
        col = [row[j] for row in grid if row[j] is not None]
        ref = offline_entry(col)
        last = [r["accuracy_offline"][-1] for r in ref.data["runs"]
                if r.get("accuracy_offline")] if ref is not None else []
        offline.append(f"{100 * sum(last) / len(last):.2f}" if last else MISSING)
    table.rows.append(["Offline learner"] + offline)
    table.notes = ["Accuracy on the test set after the whole stream (mean ± std over runs); "
                   "the offline learner trained on every sample at the same event. "
                   "Bold: the best single-pass streaming method of the column.",
                   *_fixed_note(chosen)]
    _finish_marks(table, legend)
    return table


def _summary(e: Entry | None, key: str) -> tuple[float, float] | None:
    value = e.data.get(key) if e is not None else None
    if not (isinstance(value, dict) and isinstance(value.get("mean"), int | float)):
        return None
    return float(value["mean"]), float(value.get("std") or 0.0)


CONTINUAL = {  # kind: (result key, title, what it is)
    "forgetting": ("forgetting", "Average forgetting",
                   "forgetting: the mean of (best accuracy before the last event − last "
                   "accuracy) (Chaudhry et al. 2018); lower is better"),
    "bwt": ("backward_transfer", "Backward transfer (BWT)",
            "BWT: the mean of (last accuracy − accuracy when first tested) (Lopez-Paz & "
            "Ranzato 2017); higher is better"),
}


def continual_tables(entries: list[Entry], legend: Legend) -> list[Table]:
    """Average forgetting, then backward transfer, per method and column, each in Table 2's
    layout (results written before ciosl recorded them show –)."""
    chosen, columns, rows, grid = _main_cells(entries)
    if not chosen:
        return []
    tables = []
    for kind, (key, title, what) in CONTINUAL.items():
        table = Table(kind, title, ["Method"],
                      [(c.ordering.replace("_", "-"), c.label) for c in columns])
        _method_rows(table, rows, grid, legend)
        for cells, row in zip(table.rows, grid, strict=True):
            for e in row:
                v = _summary(e, key)
                cells.append(MISSING if v is None else mean_pm(*v, e.n_runs))
        table.notes = [
            f"Over the class steps learned before the last testing event (class orderings), "
            f"or every class (iid and instance orderings), from the accuracy matrix; {what}; "
            "mean ± std over runs.",
            f"{MISSING}: not run, or a result written before ciosl recorded per-class "
            "accuracies.", *_fixed_note(chosen)]
        _finish_marks(table, legend)
        tables.append(table)
    return tables


OPEN_SET = {  # kind: (path in the result's "open_set", title)
    "auroc": (("auroc",), "Open set: AUROC of the method's novelty score"),
    "auosc": (("auosc",), "Open set: AUOSC of the method's novelty score"),
    "auroc-msp": (("baseline", "auroc"), "Open set: AUROC of 1 − max probability"),
}


def _open_set(e: Entry | None, path: tuple[str, ...]) -> tuple[float, float] | None:
    """The mean ± std over runs at ``path`` in a result's ``open_set`` (for the max
    probability baseline, the method's own score when that is already it)."""
    value: Any = e.data.get("open_set") if e is not None else None
    if path[0] == "baseline" and isinstance(value, dict) and "baseline" not in value:
        path = path[1:]  # its own score is 1 - max probability
    for k in path:
        value = value.get(k) if isinstance(value, dict) else None
    if not (isinstance(value, dict) and isinstance(value.get("mean"), int | float)):
        return None
    return float(value["mean"]), float(value.get("std") or 0.0)


def open_set_tables(entries: list[Entry], legend: Legend) -> list[Table]:
    """AUROC and AUOSC of each method's novelty score, and AUROC of 1 − max probability, per
    method and column (results run with ``--open-set`` only; none: no table)."""
    chosen, columns, rows, grid = _main_cells(entries)
    if not chosen or not any(isinstance(e.data.get("open_set"), dict) for e in chosen):
        return []
    scores = sorted({e.data["open_set"].get("score", "?") for e in chosen
                     if isinstance(e.data.get("open_set"), dict)})
    tables = []
    for kind, (path, title) in OPEN_SET.items():
        table = Table(f"open-set-{kind}", title, ["Method"],
                      [(c.ordering.replace("_", "-"), c.label) for c in columns])
        _method_rows(table, rows, grid, legend)
        for cells, row in zip(table.rows, grid, strict=True):
            for e in row:
                v = _open_set(e, path)
                cells.append(MISSING if v is None else mean_pm(*v, e.n_runs))
        table.notes = [
            "At each testing event the test samples of the classes not learned yet are novel, "
            "those of the classes learned known; per run the mean over the events with novel "
            "samples, then mean ± std over runs. AUROC: the probability that a novel sample "
            "scores as more novel than a known one (0.5 is chance); AUOSC: the area under the "
            "open-set classification curve (known samples accepted and classified right "
            "against novel samples accepted; at most the accuracy).",
            f"Novelty scores: {'; '.join(scores)}.",
            f"{MISSING}: not run with --open-set.", *_fixed_note(chosen)]
        _finish_marks(table, legend)
        tables.append(table)
    return tables


def _class_accuracy(e: Entry | None) -> dict[str, float] | None:
    """Mean over runs of each class's accuracy at the end (None if a run lacks it)."""
    runs = e.data["runs"] if e is not None else []
    per = [r.get("final_class_accuracy") for r in runs]
    if not per or any(not isinstance(p, dict) or not p for p in per):
        return None
    return {c: sum(p.get(c, 0.0) for p in per) / len(per) for c in per[0]}


def _class_names(column: list[Entry | None]) -> list[str] | None:
    """The class names the column's results agree on (``class_names``, label k's name at k),
    or None: a result without them (written before ciosl recorded them), or two that differ."""
    found = [e.data.get("class_names") for e in column if e is not None]
    if not found or any(f is None or f != found[0] for f in found):
        return None
    return found[0]


def _class_label(c: str, names: list[str] | None) -> str:
    """A per-class column's header: label ``c`` and its name where the name says more."""
    if names is None or not (c.isascii() and c.isdigit()) or int(c) >= len(names) or names[int(c)] == c:
        return c
    return f"{c} {shorten(names[int(c)], 24)}"


def class_tables(entries: list[Entry], legend: Legend) -> list[Table]:
    """Per (ordering, dataset) column: each method's accuracy (%) on each class at the end."""
    chosen, columns, rows, grid = _main_cells(entries)
    tables = []
    for j, column in enumerate(columns):
        values = [_class_accuracy(row[j]) for row in grid]
        labels = sorted({c for v in values if v for c in v},
                        key=lambda c: (0, int(c), c) if c.lstrip("-").isdigit() else (1, 0, c))
        if not labels:
            continue
        names = _class_names([row[j] for row in grid])
        table = Table("classes", f"Accuracy per class at the end (%): {column.title}",
                      ["Method"], [("class", _class_label(c, names)) for c in labels],
                      key=f"classes:{column.title}")
        kept = [(r, g, v) for r, g, v in zip(rows, grid, values, strict=True)
                if g[j] is not None]
        _method_rows(table, [r for r, _, _ in kept], [[g[j]] for _, g, _ in kept], legend,
                     label_marks=True)
        for cells, (_, _, v) in zip(table.rows, kept, strict=True):
            cells += [MISSING if v is None or c not in v else f"{100 * v[c]:.1f}"
                      for c in labels]
        table.notes = ["Test accuracy on each class's samples at the last testing event, mean "
                       f"over runs. {MISSING}: a result written before ciosl recorded it."]
        _finish_marks(table, legend)
        tables.append(table)
    return tables


def cost_table(entries: list[Entry], legend: Legend) -> Table | None:
    """Per method and dataset: stream samples learned per second (median over the dataset's
    orderings and runs) and the largest serialised learner state (MiB) at a testing event."""
    chosen, columns, rows, grid = _main_cells(entries)
    datasets = sorted({c.dataset_rank + (c.label,) for c in columns})
    if not chosen:
        return None
    table = Table("cost", "Speed and memory", ["Method"],
                  [(lab, what) for *_, lab in datasets for what in ("samples/s", "state MiB")])
    _method_rows(table, rows, grid)
    for i, (cells, row) in enumerate(zip(table.rows, grid, strict=True)):
        for *rank, lab in datasets:
            mine = [e for e, c in zip(row, columns, strict=True)
                    if e is not None and c.label == lab and c.dataset_rank == tuple(rank)]
            speed = sorted(float(r["samples_per_second"]) for e in mine for r in e.data["runs"]
                           if r.get("samples_per_second"))
            state = [int(e.data.get("peak_memory_bytes") or 0) for e in mine]
            cells.append(f"{speed[len(speed) // 2]:,.0f}" if speed else MISSING)
            cells.append(f"{max(state) / 2 ** 20:.2f}" if state and max(state) else MISSING)
            mark = legend.mark(mine)
            if mark:
                j = len(cells) - 1 - len(table.stub)  # the state column; speed before it
                table.marks[(i, j - 1)] = table.marks[(i, j)] = mark
    _finish_marks(table, legend)
    table.notes = ["samples/s: stream samples learned per second, median over the dataset's "
                   "orderings and runs (learning only, evaluation excluded; one core per run, on "
                   "a machine that may be shared: compare rows of one report, not reports). "
                   "state MiB: the largest serialised learner state (weights, optimiser buffers, "
                   "replay memory) over the testing events of its runs.", *_fixed_note(chosen)]
    return table


def _order(values: list[Any]) -> list[Any]:
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return sorted(values, key=str)


def _rank(value: str, order: tuple[str, ...]) -> tuple[int, str]:
    return (order.index(value) if value in order else len(order), value)


def sampling_table(entries: list[Entry], used: set[int]) -> Table | None:
    """Replacement x selection per column (only columns with at least two combinations)."""
    pool = [e for e in entries if e.regime == "streaming" and set(SAMPLING) <= set(e.effective)
            and set(e.diff) <= set(SAMPLING)]
    by_col: dict[Column, dict[tuple, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for e in pool:
        key = (e.method, e.effective["replacement"], e.effective["selection"])
        by_col[e.column][key].append(e)
    columns = sorted(c for c, combos in by_col.items() if len(combos) >= 2)
    if not columns:
        return None
    keys = sorted({k for c in columns for k in by_col[c]},
                  key=lambda k: (method_key(k[0]), _rank(k[1], REPLACEMENT_ORDER),
                                 _rank(k[2], SELECTION_ORDER)))
    several = len({k[0] for k in keys}) > 1
    table = Table("sampling", "Omega_all: memory replacement x sample selection (Table 4)",
                  (["Method"] if several else []) + ["Replacement", "Selection"],
                  [(c.ordering.replace("_", "-"), c.label) for c in columns])
    grid = []
    for k in keys:
        row = [pick(by_col[c][k]) if k in by_col[c] else None for c in columns]
        grid.append(row)
        used.update(id(e) for e in row if e is not None)
        table.rows.append(([method_name(k[0])] if several else [])
                          + [_sampling_text("replacement", k[1]),
                             _sampling_text("selection", k[2])]
                          + [fmt(e) for e in row])
    _bold_best(table, grid, lambda e: True)
    table.notes = [_runs_note([e for row in grid for e in row if e is not None]),
                   "Bold: the best combination of the column."]
    return table


def setting_tables(entries: list[Entry], used: set[int]) -> list[Table]:
    """One table per setting that varies alone (with its extras) in some column."""
    names = {k for e in entries for k in e.diff} - set(SAMPLING)  # see sampling_table
    ordered = [s for s in SETTING_FIRST if s in names] + sorted(names - set(SETTING_FIRST))
    tables = []
    for s in ordered:
        extras = SETTING_EXTRAS.get(s, ())
        pool = [e for e in entries if e.regime == "streaming" and s in e.effective
                and set(e.diff) <= {s, *extras}]
        series: dict[tuple, dict[Any, list[Entry]]] = defaultdict(lambda: defaultdict(list))
        for e in pool:
            extra = tuple((k, e.effective[k]) for k in extras if k in e.effective)
            value = e.effective[s]
            series[(e.column, method_key(e.method), e.method, extra)][_hashable(value)].append(e)
        keep = sorted(k for k, points in series.items() if len(points) >= 2)
        if not keep:
            continue
        several = len({k[2] for k in keep}) > 1
        values = _order(list({v for k in keep for v in series[k]}))
        table = Table("setting", f"Omega_all as a function of {s}", [s],
                      [(k[0].title, _series_label(k[2], k[3], several)) for k in keep],
                      setting=s)
        grid = []
        for v in values:
            row = [pick(series[k][v]) if v in series[k] else None for k in keep]
            grid.append(row)
            used.update(id(e) for e in row if e is not None)
            table.rows.append([_value_text(v)] + [fmt(e) for e in row])
        for k in keep:
            pts = [(v, pick(series[k][v])) for v in _order(list(series[k]))]
            table.series.append((f"{k[0].title} · {_series_label(k[2], k[3], several)}", pts))
        _bold_best(table, grid, lambda e: True)
        table.notes = [_runs_note([e for row in grid for e in row if e is not None]),
                       f"Bold: the best {s} of the column; the other settings are the defaults."]
        tables.append(table)
    return tables


def _sampling_text(name: str, value: Any) -> str:
    """LAWRRR, UAPN, Uniform: the paper's spelling of replacement and selection values."""
    text = str(value)
    return text.capitalize() if text in ("uniform", "reservoir") else text.upper()


def _series_label(method: str, extra: tuple, several: bool) -> str:
    parts = ([method_name(method)] if several or not extra else [])
    parts += [_sampling_text(k, v) for k, v in extra]
    return " / ".join(parts) if parts else method_name(method)


def regime_table(entries: list[Entry], legend: Legend) -> Table | None:
    """Batch / online / streaming versions of each method (columns with a non-streaming run)."""
    pool = [e for e in entries if not e.diff]
    regimes_of: dict[Column, set[str]] = defaultdict(set)
    for e in pool:
        regimes_of[e.column].add(e.regime)
    columns = sorted(c for c, rs in regimes_of.items() if rs - {"streaming"})
    if not columns:
        return None
    slots = [(c, r) for c in columns
             for r in sorted(regimes_of[c], key=lambda r: _rank(r, REGIME_ORDER))]
    cells: dict[tuple, list[Entry]] = defaultdict(list)
    for e in pool:  # a row per method and grid-fixed settings, as in Table 2
        cells[(e.method, e.label, e.column, e.regime)].append(e)
    rows = sorted({(m, lab) for m, lab, c, _ in cells if c in columns},
                  key=lambda r: (method_key(r[0]), r[1]))
    table = Table("regimes", "Omega_all: batch, online and streaming versions", ["Method"],
                  [(c.title, r) for c, r in slots])
    grid = []
    for m, label in rows:
        row = [pick(cells[(m, label, c, r)]) if (m, label, c, r) in cells else None
               for c, r in slots]
        grid.append(row)
        violates = any(e is not None and e.method_violates for e in row)
        table.marks.update({(len(table.rows), j): legend.mark([e])
                            for j, e in enumerate(row) if legend.mark([e])})
        table.rows.append([label + (f" {DAGGER}" if violates else "")]
                          + [fmt(e) for e in row])
        table.series.append((label, [((c.title, r), e) for (c, r), e
                                     in zip(slots, row, strict=True) if e is not None]))
    _finish_marks(table, legend)
    _bold_best(table, grid, lambda e: not e.method_violates and e.method != "offline")
    table.notes = [_runs_note([e for row in grid for e in row if e is not None]),
                   "batch: several epochs over each task's data in mini-batches; online: one "
                   "pass in mini-batches; streaming: one sample at a time.",
                   "Bold: the best method of the column among those that do not retrain before "
                   f"inference ({DAGGER}). {MISSING}: not run.",
                   *_fixed_note(pool)]
    return table


def other_table(entries: list[Entry], used: set[int]) -> Table | None:
    """Results with non-default settings that no ablation table above shows."""
    rest = [e for e in entries if e.diff and id(e) not in used and e.regime == "streaming"]
    if not rest:
        return None
    columns = sorted({e.column for e in rest})
    cells: dict[tuple, list[Entry]] = defaultdict(list)
    for e in rest:
        text = ", ".join(f"{k}={_value_text(_hashable(v))}" for k, v in sorted(e.diff.items()))
        cells[(method_key(e.method), e.method, text, e.column)].append(e)
    keys = sorted({k[:3] for k in cells})
    table = Table("other", "Omega_all with other settings", ["Method", "Settings"],
                  [(c.ordering.replace("_", "-"), c.label) for c in columns])
    for k in keys:
        row = [pick(cells[(*k, c)]) if (*k, c) in cells else None for c in columns]
        table.rows.append([shorten(method_name(k[1])), shorten(k[2])] + [fmt(e) for e in row])
    table.notes = [_runs_note(rest), "Settings: the values that differ from the defaults."]
    return table


def build_tables(entries: list[Entry]) -> list[Table]:
    used: set[int] = set()
    legend = departure_legend([e for e in entries if not e.diff])  # the same in every table
    tables = [main_table(entries, legend), final_table(entries, legend),
              cost_table(entries, legend), *continual_tables(entries, legend),
              *open_set_tables(entries, legend), *class_tables(entries, legend), sampling_table(entries, used),
              *setting_tables(entries, used), regime_table(entries, legend),
              other_table(entries, used)]
    return [t for t in tables if t is not None]


def to_markdown(table: Table) -> str:
    """The table in Markdown: every cell escaped (names come from result files), bold and
    departure letters added after."""
    header = table.header()
    lines = [f"| {' | '.join(md_escape(h) for h in header)} |",
             "|" + "|".join([":---"] * len(table.stub) + ["---:"] * len(table.columns)) + "|"]
    stub = len(table.stub)
    for i, row in enumerate(table.rows):
        cells = [md_escape(c) for c in row]
        for j in range(len(table.columns)):
            if (i, j) in table.bold:
                cells[stub + j] = f"**{cells[stub + j]}**"
        for (r, j), mark in table.marks.items():
            if r == i:
                cells[0 if j < 0 else stub + j] += superscript(mark)
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)
