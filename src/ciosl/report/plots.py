"""PNG figures: accuracy along the stream, accuracy matrices, Omega_all vs. a setting, regimes.

Figures are drawn on ``matplotlib.figure.Figure`` objects and saved with the Agg renderer,
without pyplot: no global backend switch, no window, nothing left open. Every name from a result
file goes through ``mpl_escape`` (no mathtext, bounded length) and every file name through
``file_slug`` (bounded length)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure as MplFigure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from ciosl.report.results import (
    REGIME_ORDER,
    Column,
    Entry,
    method_key,
    offline_entry,
    pick,
)
from ciosl.report.tables import Table
from ciosl.report.text import file_slug, mpl_escape

DPI = 110


@dataclass
class Figure:
    path: Path
    title: str
    caption: str
    png: bytes = b""  # the image itself (the HTML report embeds it; its folder may be gone)
    table: str = ""  # the key of the table it draws (``Table.key``), for links between them


def _slug(text: str) -> str:
    return file_slug(text, 60)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=DPI, bbox_inches="tight", format="png")
    tmp.replace(path)
    return path


def _curve(entry: Entry, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean stream position, mean and std of ``key`` per testing event over the runs."""
    runs = [r for r in entry.data["runs"] if r.get(key)]
    n = min(len(r[key]) for r in runs)
    pos = np.mean([r["events"][:n] for r in runs], axis=0) if all(
        len(r.get("events", [])) >= n for r in runs) else np.arange(n)
    values = np.array([r[key][:n] for r in runs], dtype=float)
    return pos, values.mean(axis=0), values.std(axis=0, ddof=1) if len(runs) > 1 else 0 * pos


MARKERS = ("s", "^", "v", "D", "P", "X", "<", ">", "p", "h", "*", "d", "8", "H")


def _palette(n: int) -> list:
    """n distinct colours without reds (crimson is CIOSL's): tab10, then tab20's dark shades
    followed by its light ones, so neighbouring methods differ in hue."""
    if n <= 9:
        tab = matplotlib.colormaps["tab10"].colors
        return [c for i, c in enumerate(tab) if i != 3][:n]  # 3: red
    tab = matplotlib.colormaps["tab20"].colors
    order = [i for i in range(0, 20, 2) if i != 6] + [i for i in range(1, 20, 2) if i != 7]
    return [tab[order[k % len(order)]] for k in range(n)]


def accuracy_figures(entries: list[Entry], folder: Path) -> list[Figure]:
    """One figure per main-table column: accuracy at each testing event, per method, with the
    offline learner's curve."""
    by_col: dict[Column, dict[tuple[str, str], list[Entry]]] = {}  # a line per Table 2 row
    for e in entries:
        if e.regime == "streaming" and not e.diff:
            by_col.setdefault(e.column, {}).setdefault((e.method, e.label), []).append(e)
    figures = []
    for column in sorted(by_col):
        methods = sorted(by_col[column], key=lambda r: (method_key(r[0]), r[1]))
        fig = MplFigure(figsize=(6.4, 4.0))
        ax = fig.subplots()
        colors = _palette(len(methods))
        band = 0.12 if len(methods) <= 6 else 0.05  # many overlapping bands turn to mud
        for k, row in enumerate(methods):
            e = pick(by_col[column][row])
            pos, mean, std = _curve(e, "accuracy")
            style = "--" if e.violates else "-"
            ours = row[0] == "ciosl"  # the paper's method stands out
            color = "crimson" if ours else colors[k]
            ax.plot(pos, mean, style, marker="o" if ours else MARKERS[k % len(MARKERS)], ms=4,
                    color=color, label=mpl_escape(e.label), lw=2.5 if ours else 1.4,
                    zorder=3 if ours else 2)
            ax.fill_between(pos, mean - std, mean + std, color=color, alpha=band, lw=0)
        ref = offline_entry([pick(v) for v in by_col[column].values()])
        if ref is not None and all(r.get("accuracy_offline") for r in ref.data["runs"]):
            pos, mean, _ = _curve(ref, "accuracy_offline")
            ax.plot(pos, mean, ":", color="black", lw=2, label="offline reference")
        ax.set_xlabel("stream position (samples learned)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1.02)
        ax.set_title(mpl_escape(column.title, 80))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), handlelength=3.5)
        path = _save(fig, folder / f"accuracy_{_slug(column.ordering)}_{_slug(column.label)}.png")
        figures.append(Figure(path, f"Accuracy along the stream: {column.title}",
                              "Mean test accuracy (± std over runs) at each testing event, on the "
                              "classes seen so far (class orderings) or all classes; dashed: "
                              "methods that violate single pass; dotted: the offline learner.",
                              table="main"))
    return figures


def matrix_figures(entries: list[Entry], folder: Path) -> list[Figure]:
    """One figure per main-table column with the results that hold an accuracy matrix: a heatmap
    per method (testing events down, class steps or classes across, mean over runs)."""
    by_col: dict[Column, dict[tuple[str, str], list[Entry]]] = {}
    for e in entries:
        if e.regime == "streaming" and not e.diff and e.data.get("accuracy_matrix"):
            by_col.setdefault(e.column, {}).setdefault((e.method, e.label), []).append(e)
    figures = []
    for column in sorted(by_col):
        methods = sorted(by_col[column], key=lambda r: (method_key(r[0]), r[1]))
        ncols = min(4, len(methods))
        nrows = -(-len(methods) // ncols)
        fig = MplFigure(figsize=(2.6 * ncols + 0.8, 2.4 * nrows + 0.4))
        axes = np.atleast_2d(fig.subplots(nrows, ncols, squeeze=False))
        image = None
        for k, row in enumerate(methods):
            ax = axes[k // ncols][k % ncols]
            e = pick(by_col[column][row])
            R = np.array([[np.nan if v is None else v for v in r]
                          for r in e.data["accuracy_matrix"]], dtype=float)  # (T, J)
            image = ax.imshow(R, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                              interpolation="nearest")
            ax.set_title(mpl_escape(e.label, 30), fontsize=8,
                         color="crimson" if row[0] == "ciosl" else "black")
            ax.set_xlabel("class step" if column.ordering.startswith("class") else "class",
                          fontsize=7)
            ax.set_ylabel("testing event", fontsize=7)
            ax.tick_params(labelsize=6)
        for k in range(len(methods), nrows * ncols):
            axes[k // ncols][k % ncols].set_axis_off()
        fig.subplots_adjust(hspace=0.55, wspace=0.4)  # a panel's title clear of the x label above
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="test accuracy")
        fig.suptitle(mpl_escape(column.title, 80), fontsize=10)
        path = _save(fig, folder / f"matrix_{_slug(column.ordering)}_{_slug(column.label)}.png")
        figures.append(Figure(path, f"Accuracy matrix: {column.title}",
                              "Accuracy at each testing event (rows, base init first) on each "
                              "class step's test samples (class orderings; blank: not reached "
                              "yet) or on each class (iid and instance orderings), mean over "
                              "runs.", table=f"classes:{column.title}"))
    return figures


def setting_figure(table: Table, folder: Path) -> Figure | None:
    """Omega_all vs. a numeric setting, one line per (column, method, variant) series."""
    s = table.setting
    numeric = [(label, pts) for label, pts in table.series
               if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _ in pts)]
    if s is None or not numeric:
        return None
    fig = MplFigure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    for label, pts in numeric:
        x = [v for v, _ in pts]
        ax.errorbar(x, [e.mean for _, e in pts], yerr=[e.std for _, e in pts], marker="o",
                    ms=4, capsize=3, label=mpl_escape(label, 80))
    values = sorted({v for _, pts in numeric for v, _ in pts})
    if values[0] > 0 and (s == "buffer" or values[-1] / values[0] >= 20):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(values, [f"{v:g}" for v in values])
    ax.set_xlabel(mpl_escape(s))
    ax.set_ylabel("Omega_all")
    ax.set_title(mpl_escape(f"Omega_all vs. {s}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    path = _save(fig, folder / f"omega_vs_{_slug(s)}.png")
    return Figure(path, f"Omega_all vs. {s}",
                  f"Omega_all (mean ± std over runs) as a function of {s}, other settings at "
                  "their defaults.", table=table.key)


def regime_figure(table: Table, folder: Path) -> Figure | None:
    """Grouped bars: Omega_all of each method in each regime, one panel per column."""
    slots = [slot for slot in dict.fromkeys(s for _, pts in table.series for s, _ in pts)]
    if not slots:
        return None
    columns = list(dict.fromkeys(c for c, _ in slots))
    fig = MplFigure(figsize=(4.8 * len(columns), 3.8))
    axes = fig.subplots(1, len(columns), squeeze=False)
    regimes = sorted(dict.fromkeys(r for _, r in slots),
                     key=lambda r: REGIME_ORDER.index(r) if r in REGIME_ORDER else len(REGIME_ORDER))
    width = 0.8 / max(1, len(regimes))
    for ax, column in zip(axes[0], columns, strict=True):
        methods = [(label, dict(pts)) for label, pts in table.series]
        for k, regime in enumerate(regimes):
            xs, ys, es = [], [], []
            for i, (_, pts) in enumerate(methods):
                e = pts.get((column, regime))
                if e is not None:
                    xs.append(i + (k - (len(regimes) - 1) / 2) * width)
                    ys.append(e.mean)
                    es.append(e.std)
            ax.bar(xs, ys, width, yerr=es, capsize=2, label=mpl_escape(regime))
        ax.set_xticks(range(len(methods)), [mpl_escape(label, 30) for label, _ in methods],
                      rotation=45, ha="right", fontsize=8)
        ax.set_title(mpl_escape(column, 80), fontsize=9)
        ax.set_ylabel("Omega_all")
        ax.set_ylim(0, 1.1)
        ax.grid(axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    path = _save(fig, folder / "regimes.png")
    return Figure(path, "Batch, online and streaming versions",
                  "Omega_all (mean ± std over runs) of each method trained in each regime.",
                  table=table.key)


def make_figures(entries: list[Entry], tables: list[Table], folder: Path) -> list[Figure]:
    figures = accuracy_figures(entries, folder) + matrix_figures(entries, folder)
    for table in tables:
        fig = (setting_figure(table, folder) if table.kind == "setting"
               else regime_figure(table, folder) if table.kind == "regimes" else None)
        if fig is not None:
            figures.append(fig)
    for f in figures:
        f.png = Path(f.path).read_bytes()
    return figures
