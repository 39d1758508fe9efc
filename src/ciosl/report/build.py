"""``ciosl report``: the paper's tables and figures from a folder of result JSONs."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ciosl.fileio import atomic_write_bytes, kind_of, open_regular
from ciosl.report.html import render_html
from ciosl.report.plots import Figure, make_figures
from ciosl.report.protocols import protocol_notes
from ciosl.report.results import (
    Entry,
    drop_duplicates,
    load_entries,
    method_name,
    settings_text,
)
from ciosl.report.tables import FINDINGS, Table, build_tables, legend_markdown, to_markdown
from ciosl.report.text import md_escape, shorten, shorten_middle
from ciosl.report.unreferenced import reference_line, unreferenced_tables

FORMATS = ("md", "html")


@dataclass
class Report:
    path: Path
    fmt: str
    tables: list[Table]
    figures: list[Figure]
    entries: list[Entry]
    intro: list[str] = field(default_factory=list)  # lines under the title (md and html)
    left_out: list[tuple[Path, str]] = field(default_factory=list)  # (file, why not used)
    duplicates: list[str] = field(default_factory=list)  # which of several results was used
    apart: list[Path] = field(default_factory=list)  # run with --no-offline: shown apart

    def markdown(self, kind: str = "main") -> str | None:
        for table in self.tables:
            if table.kind == kind:
                return to_markdown(table)
        return None


def _grids(root: Path) -> list[tuple[str, str]]:
    """The grid files a sweep left next to its results (``sweep-<name>.toml``)."""
    out = []
    for path in sorted(root.rglob("sweep-*.toml")):
        try:
            out.append((str(path.relative_to(root)), path.read_text()))
        except OSError:
            continue
    return out


def intro_lines(entries: list[Entry], omega_events: str,
                left_out: list[tuple[Path, str]], root: Path) -> list[str]:
    """What every Omega_all of the report means, and which results could not be used."""
    from ciosl.evaluation.metrics import OMEGA_EVENTS_TEXT

    lines = [f"Omega_all: {OMEGA_EVENTS_TEXT[omega_events]} (ciosl report --omega-events "
             f"{'all' if omega_events == 'after_base' else 'after_base'} for the other "
             "definition)."]
    recomputed = sum(e.recomputed for e in entries)
    if recomputed:
        lines.append(f"{recomputed} of the results were written with the other definition "
                     "(results without an omega_all.events label averaged every event): "
                     "their Omega_all is recomputed from their per-event accuracies.")
    legacy = sum(e.legacy for e in entries)
    if legacy:
        lines.append(f"{legacy} of the results were written by an older ciosl that recorded "
                     "only the settings that differed from its defaults: the settings they do "
                     "not record are listed at this version's defaults, which may differ from "
                     "the ones they ran with (the base-init recipe, for one), except the "
                     "departures from the paper added since (gradient clipping), which they "
                     "ran without.")
    lines += protocol_notes(entries)
    for path, reason in left_out:
        try:
            name = str(path.relative_to(root))
        except ValueError:
            name = str(path)
        lines.append(f"Left out: {name}: {reason}.")
    return lines


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def duplicate_line(used: Entry, others: list[Entry], root: Path) -> str:
    """Which of several results of one cell the report shows, and why."""
    cell = f"{used.label} on {used.column.label} / {used.column.ordering}"
    if used.regime != "streaming":
        cell += f" ({used.regime})"
    if used.diff:
        cell += f" [{shorten(settings_text(used.diff))}]"
    return (f"{len(others) + 1} results for {cell}: used {_rel(used.path, root)} "
            f"({used.n_runs} runs; the most runs, then the newest), not "
            f"{', '.join(_rel(e.path, root) + f' ({e.n_runs} runs)' for e in others)}.")


def findings_link(report_dir: Path) -> str | None:
    """The path of the project's docs/findings.md relative to ``report_dir``, when the report
    is written inside a checkout that has one (the legends link their evidence there)."""
    here = report_dir.resolve()
    for folder in (here, *here.parents):
        if (folder / FINDINGS).is_file():
            return os.path.relpath(folder / FINDINGS, here)
    return None


def render_markdown(title: str, tables: list[Table], figures: list[Figure],
                    entries: list[Entry], root: Path, base: Path,
                    intro: list[str] = (), count: int | None = None) -> str:
    """The report in Markdown. Every text that comes from a result file (names, paths,
    reasons) is escaped with ``md_escape``: no markup of a result reaches the page."""
    findings = findings_link(base)
    n = len(entries) if count is None else count  # with the results without reference
    parts = [f"# {md_escape(title)}", "", f"{n} results from {md_escape(root)}.", ""]
    if intro:
        parts += [f"{md_escape(line)}  " for line in intro] + [""]
    for table in tables:
        parts += [f"## {md_escape(table.title)}", "", to_markdown(table), ""]
        legend = legend_markdown(table, findings)
        parts += [f"{md_escape(n)}  " for n in table.notes] + ([f"{legend}  "] if legend else [])
        parts += [""]
    if figures:
        parts += ["## Figures", ""]
        for f in figures:
            rel = os.path.relpath(f.path, base)
            parts += [f"![{md_escape(f.title)}]({rel})", "",
                      f"*{md_escape(f.title)}.* {md_escape(f.caption)}", ""]
    if not entries:  # only results without the offline reference: listed in their table
        return "\n".join(parts) + "\n"
    parts += ["## Results used", "", "| result | method | dataset | ordering | regime | runs | "
              "non-default settings | ciosl | torch |", "|---|---|---|---|---|---:|---|---|---|"]
    for e in entries:
        v = e.data.get("versions") or {}
        cells = [method_name(e.method), e.column.label, e.column.ordering,
                 e.regime, str(e.n_runs), settings_text(e.non_default) or "(defaults)",
                 str(v.get("ciosl", "?")), str(v.get("torch", "?"))]
        parts.append("| " + " | ".join([result_link(e.path, root, base)]
                                       + [md_escape(c) for c in cells]) + " |")
    return "\n".join(parts) + "\n"


def result_link(path: Path, root: Path, base: Path) -> str:
    """A result's row label in "Results used": its name under ``root``, cut in the middle to
    ``LABEL_MAX`` characters, linking the file (relative to the report's folder ``base``)."""
    target = quote(Path(os.path.relpath(path, base)).as_posix(), safe="/=+,@")
    return f"[{md_escape(shorten_middle(_rel(path, root)))}]({target})"


REPORT_SIGNS = (re.compile(r'<meta name="generator" content="ciosl report">'),  # HTML
                # HTML written before that tag (a demo folder from an earlier version)
                re.compile(r'\A<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                           r"<title>[^<]*</title><style>"),
                re.compile(r"\A# [^\n]*\n\n\d+ results? from "))  # Markdown


def check_report_target(path: Path) -> None:
    """A report replaces only an earlier report: a file at ``--out`` that is not one (a result
    JSON, a grid, anything of the user's) is refused, never overwritten; a FIFO or a device
    there is refused before anything is drawn."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # absent (or unreachable: the write names the problem)
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a folder: refused elsewhere
        raise ValueError(f"--out {path}: not a regular file ({kind_of(mode)}): refused to "
                         "replace it")
    if not stat.S_ISREG(mode):
        return
    try:
        with open_regular(path, "--out") as f:
            head = f.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return  # unreadable: the write names the problem
    if not any(sign.search(head) for sign in REPORT_SIGNS):
        raise ValueError(f"--out {path}: holds a file that is not a ciosl report: refused to "
                         "replace it; choose another --out, or delete it first")


def write_report(results: str | Path, *, fmt: str = "md", out: str | Path | None = None,
                 title: str | None = None, omega_events: str = "after_base") -> Report:
    """Read every result JSON under ``results`` and write the report (Markdown: figures in a
    ``figures/`` folder next to it; HTML: one self-contained file that embeds them). Every Omega_all in it
    follows ``omega_events`` (``metrics.omega_all``), whatever definition a result was written
    with (``results.omega_of``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r}; valid choices: {', '.join(FORMATS)}")
    root = Path(results)
    left_out: list[tuple[Path, str]] = []
    apart: list[tuple[Path, dict]] = []  # run with --no-offline: tables of their own
    entries, dups = drop_duplicates(load_entries(root, omega_events=omega_events,
                                                 left_out=left_out, unreferenced=apart))
    duplicates = [duplicate_line(used, others, root) for used, others in dups]
    if not entries and not apart:
        why = ""
        if left_out:  # say why the results there were not read
            first_path, reason = left_out[0]
            more = f" (and {len(left_out) - 1} more)" if len(left_out) > 1 else ""
            why = f"; skipped {_rel(first_path, root)}: {reason}{more}"
        raise FileNotFoundError(f"no result JSONs (from `ciosl run` or `ciosl sweep`) under "
                                f"{root}{why}")
    path = Path(out) if out is not None else root / f"report.{fmt}"
    check_report_target(path)  # before drawing anything
    title = title or f"ciosl report: {root.resolve().name}"
    tables = build_tables(entries) + unreferenced_tables(apart, root)
    intro = intro_lines(entries, omega_events, left_out, root) + duplicates
    if apart:
        intro.append(reference_line(len(apart)))
    count = len(entries) + len(apart)
    if fmt == "md":
        figures = make_figures(entries, tables, path.parent / "figures")
        text = render_markdown(title, tables, figures, entries, root, path.parent, intro,
                               count=count)
    else:  # self-contained: the figures are drawn in a temporary folder and embedded
        with tempfile.TemporaryDirectory(prefix="ciosl-figures-") as tmp:
            figures = make_figures(entries, tables, Path(tmp))
        text = render_html(title, tables, figures, entries, root, _grids(root), intro,
                           findings_link(path.parent), count=count)
    atomic_write_bytes(path, text.encode())
    return Report(path, fmt, tables, figures, entries, intro, left_out, duplicates,
                  [p for p, _ in apart])
