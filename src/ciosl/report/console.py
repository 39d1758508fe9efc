"""Terminal rendering with rich: progress bar, result tables, dataset and method lists."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from ciosl.errors import clip_line

# the plain progress lines (ciosl.progress, below the layers: extraction prints them too) and
# the stderr console they share: re-exported here
from ciosl.progress import (  # noqa: F401
    PLAIN_PROGRESS_SECONDS,
    _clock,
    _plain_progress,
    _safe,
    err_console,
    plain_progress,
)
from ciosl.report.text import printable

console = Console()


def print_error(text: str, prefix: str = "[red]error:[/] ") -> None:
    """One line on stderr (never wrapped; the text is not read as markup, and escape sequences
    or other control characters in it are printed as their escapes, not sent to the terminal)."""
    safe = "\n".join(clip_line(printable(line)) for line in str(text).split("\n"))
    err_console.print(prefix + escape(safe), highlight=False, soft_wrap=True)


@contextmanager
def sample_progress(description: str):
    """Progress over streamed samples; yields (on_start, on_progress) callbacks. On a terminal,
    a live bar; otherwise (output to a file or a pipe) one plain line on stderr at most every
    ``PLAIN_PROGRESS_SECONDS``, so that a long run shows it is alive wherever its output goes."""
    if not err_console.is_terminal:
        yield _plain_progress(description)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("samples"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err_console, transient=False) as bar:
        task = bar.add_task(description, total=None)
        yield (lambda total: bar.update(task, total=total),
               lambda n: bar.advance(task, n))


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


OMEGA_LABEL = {"after_base": "events after base init", "all": "every event, base init included"}


def omega_label(events: str | None) -> str:
    """How an Omega_all was averaged (results without the label: every event, as before)."""
    return OMEGA_LABEL.get(events or "all", str(events))


def print_run(run: dict) -> None:
    if run.get("omega_all") is None and "accuracy_offline" not in run:  # --no-offline
        table = Table(title=f"seed {run['seed']}: no offline reference (--no-offline), no "
                      "Omega_all", title_justify="left")
        for col in ("event", "stream position", "test samples", "accuracy %"):
            table.add_column(col, justify="right")
        for t, (pos, n, a) in enumerate(zip(run["events"], run["n_test"], run["accuracy"],
                                            strict=True)):
            table.add_row(str(t), str(pos), str(n), pct(a))
        console.print(table)
        return
    events = run.get("omega_events", "all")
    left_out = events == "after_base"
    table = Table(title=f"seed {run['seed']}: Omega_all = {run['omega_all']:.4f} "
                  f"(over the {omega_label(events)})", title_justify="left",
                  caption="event 0: right after base init" + (
                      ", not in Omega_all (its ratio in brackets)" if left_out else ""),
                  caption_justify="left")
    for col in ("event", "stream position", "test samples", "accuracy %", "offline %", "ratio"):
        table.add_column(col, justify="right")
    for t, (pos, n, a, o) in enumerate(zip(run["events"], run["n_test"], run["accuracy"],
                                           run["accuracy_offline"], strict=True)):
        ratio = f"{a / o:.3f}"
        table.add_row(str(t), str(pos), str(n), pct(a), pct(o),
                      f"({ratio})" if t == 0 and left_out else ratio)
    console.print(table)


def print_resume(runs_done: int, position: int) -> None:
    err_console.print(f"resuming from the checkpoint: {runs_done} run(s) done, the next one at "
                      f"stream position {position}")


def pm(mean: float, std: float, n_runs: int, digits: int = 4) -> str:
    """``mean +- std``; one run: its value alone (no spread to show)."""
    return f"{mean:.{digits}f}" + (f" +- {std:.{digits}f}" if n_runs > 1 else "")


def print_result(result: dict) -> None:
    om, fa, n = result["omega_all"], result["final_accuracy"], len(result["runs"])
    extractor = extractor_text(result["extractor"])
    console.print(
        f"[bold]{_safe(result['method'])}[/] on {_safe(result['dataset'])} / "
        f"{_safe(result['ordering'])} "
        f"({n} run{'s' * (n > 1)}, {extractor} features, d={result['feature_dim']}):"
    )
    if om is None:
        console.print("  Omega_all      = none (run without the offline reference: --no-offline)")
    else:
        console.print(f"  Omega_all      = {pm(om['mean'], om['std'], n)} (over the "
                      f"{omega_label(om.get('events'))})")
    console.print(f"  final accuracy = {pm(100 * fa['mean'], 100 * fa['std'], n, 2)} %")
    for key, label in (("forgetting", "forgetting    "), ("backward_transfer", "BWT           ")):
        v = result.get(key)
        if v:
            console.print(f"  {label} = {pm(v['mean'], v['std'], n)}")
    console.print(f"  speed          = {result['samples_per_second']:.0f} samples/s, "
                  f"peak state {result['peak_memory_bytes'] / 2**20:.2f} MiB, "
                  f"{result['predict_seconds']:.1f} s per run at testing events")
    if "path" in result:
        console.print(f"  written to {_safe(result['path'])}")


def _table_or_lines(table: Table, title: str, lines: list[str]) -> None:
    """The table if it fits the console's width with no word cut (its minimum width: each
    column as wide as its longest word), else a plain listing: the title, then one entry per
    line, nothing cut (rich would fold names like "fashion-mnist" across lines)."""
    if Measurement.get(console, console.options.update_width(10**6), table).minimum <= console.width:
        console.print(table)
        return
    console.print(title, highlight=False, soft_wrap=True)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def print_datasets(rows) -> None:
    table = Table(title="datasets", title_justify="left")
    for col in ("name", "present", "orderings", "base", "classes/step", "buffer", "extractor",
                "base init", "offline"):
        table.add_column(col, overflow="fold")
    for spec, present, _ in rows:
        table.add_row(spec.name, "[green]yes[/]" if present else "[red]no[/]",
                      " ".join(spec.orderings), f"{spec.base_fraction:g}",
                      str(spec.classes_per_step), str(spec.buffer), spec.default_extractor,
                      f"{spec.base_epochs} x {spec.base_batch_size}",
                      f"{spec.offline_epochs} x {spec.offline_batch_size}")
    _table_or_lines(table, "datasets", [
        f"[bold]{spec.name}[/]: present {'[green]yes[/]' if present else '[red]no[/]'}, "
        f"orderings {' '.join(spec.orderings)}, base {spec.base_fraction:g}, classes/step "
        f"{spec.classes_per_step}, buffer {spec.buffer}, extractor {spec.default_extractor}, "
        f"base init {spec.base_epochs} x {spec.base_batch_size}, offline "
        f"{spec.offline_epochs} x {spec.offline_batch_size}" for spec, present, _ in rows])
    console.print("base init / offline: epochs x batch size of every learner's base training "
                  "and of the offline reference learner")
    console.print("extractors: pixels and efficientnet_lite0 (ImageNet weights installed with "
                  "ciosl) work offline; mobilenet_v2, the paper's, needs its ImageNet weights "
                  "(downloaded by torch.hub, or --weights FILE); your own backbone: "
                  "onnx:PATH\\[@S] (any ONNX image model, its pre-logit features; --mean, --std, "
                  "--layer) or module:package.module:callable (a torch module and its "
                  "preprocessing); --extractor picks one", highlight=False)
    console.print("your own data: folder:DIR (DIR/{train,test}/<class>/[<instance>/]<images>, "
                  "or DIR/<class>/... split per class; PNG, JPEG, WebP) or features:PATH (an "
                  ".npz of train_z, train_y, test_z, test_y); formats and rules: "
                  "docs/datasets.md", highlight=False)
    for spec, present, where in rows:
        text = f"found in {where}" if present else spec.how_to_get
        console.print(f"[bold]{spec.name}[/]: {text}", highlight=False)


def print_methods(methods, detailed: bool = False) -> None:
    """One line per method (its settings by name), or with ``detailed`` every setting with its
    default and meaning (``ciosl methods NAME``)."""
    if not detailed:
        table = Table(title="methods (`ciosl methods NAME` for the settings, defaults and "
                      "meanings of one)", title_justify="left")
        for col in ("method", "what", "settings (--set NAME=VALUE)"):
            table.add_column(col, overflow="fold")
        lines = []
        for name, cls in methods.items():
            flag = " [red](violates single pass)[/]" if cls.violates_single_pass else ""
            settings = ", ".join(s.name for s in cls.settings() if s.name != "seed")
            table.add_row(f"[bold]{name}[/]", cls.description + flag, settings)
            lines.append(f"[bold]{name}[/]: {cls.description}{flag}; settings: {settings}")
        _table_or_lines(table, "methods (`ciosl methods NAME` for the settings, defaults and "
                        "meanings of one; --set NAME=VALUE)", lines)
        return
    table = Table(title="methods (set with --set NAME=VALUE)", title_justify="left")
    for col in ("method", "setting", "default", "meaning"):
        table.add_column(col, overflow="fold")
    lines = []
    for name, cls in methods.items():
        flag = " [red](violates single pass)[/]" if cls.violates_single_pass else ""
        table.add_row(f"[bold]{name}[/]{flag}", "", "", cls.description, end_section=False)
        lines.append(f"[bold]{name}[/]{flag}: {cls.description}")
        if set(cls.regimes) != {"streaming", "online", "batch"}:
            table.add_row("", "regimes", ", ".join(cls.regimes),
                          f"not the others: {cls.regime_note}", end_section=False)
            lines.append(f"  regimes = {', '.join(cls.regimes)}: not the others: "
                         f"{cls.regime_note}")
        settings = [s for s in cls.settings() if s.name != "seed"]
        for i, s in enumerate(settings):
            choices = f" (one of {', '.join(map(str, s.choices))})" if s.choices else ""
            table.add_row("", s.name, repr(s.default), s.help + choices,
                          end_section=i == len(settings) - 1)
            lines.append(f"  {s.name} = {s.default!r}: {s.help}{choices}")
    _table_or_lines(table, "methods (set with --set NAME=VALUE)", lines)


def extractor_text(extractor: str | None) -> str:
    """``none`` is the extractor of a ``features:PATH`` file: its features are precomputed."""
    return "precomputed" if extractor in (None, "none") else extractor


def print_features(fs) -> None:
    console.print(f"{fs.dataset} / {extractor_text(fs.extractor)} features: train {fs.train_z.shape}, "
                  f"test {fs.test_z.shape}, {fs.n_classes} classes, cache key {fs.key}")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "eta ?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"eta {h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"eta {rest // 60}:{rest % 60:02d}"


class SweepMonitor:
    """Progress of a sweep: runs done / running / left / failed and the time left (rich on a
    terminal; otherwise a plain line at most every ``PLAIN_PROGRESS_SECONDS``), plus one line
    per finished cell and per failed run."""

    def __init__(self, bar: Progress, plain: bool = False):
        self.bar, self.plain = bar, plain
        self.runs = bar.add_task("runs", total=None, info="", eta="eta ?")
        self.offline = bar.add_task("offline refs", total=None, info="", eta="")
        self.start = self.last = time.monotonic()

    def update(self, s) -> None:
        if self.plain:
            now = time.monotonic()
            if now - self.last >= PLAIN_PROGRESS_SECONDS:
                self.last = now
                eta = f", {_duration(s.eta)}" if s.left + s.running else ""
                err_console.print(
                    f"sweep: {s.skipped + s.done + s.elsewhere + s.failed} / {s.runs} runs "
                    f"({s.running} running, {s.left} left"
                    + (f", {s.skipped} done before" if s.skipped else "")
                    + (f", {s.elsewhere} by another sweep" if s.elsewhere else "")
                    + (f", {s.failed} failed" if s.failed else "")
                    + f"), {_clock(now - self.start)} elapsed{eta}", highlight=False,
                    soft_wrap=True)
            return
        self.bar.update(self.runs, total=s.runs,
                        completed=s.skipped + s.done + s.elsewhere + s.failed,
                        info=f"{s.running} running, {s.left} left"
                             + (f", {s.skipped} done before" if s.skipped else "")
                             + (f", {s.elsewhere} by another sweep" if s.elsewhere else "")
                             + (f", [red]{s.failed} failed[/]" if s.failed else ""),
                        eta=_duration(s.eta) if s.left + s.running else "")
        self.bar.update(self.offline, total=s.offline, completed=s.offline_done,
                        info=f"{s.offline_running} running" if s.offline_running else "")

    def run_done(self, cell, seed, run, seconds) -> None:
        pass

    def run_failed(self, cell, seed, error) -> None:
        err_console.print(f"[red]failed:[/] {cell.id} seed {seed}: {error}", highlight=False)

    def cell_done(self, cell, result) -> None:
        om = result["omega_all"]
        console.print(f"{cell.id}: Omega_all = {pm(om['mean'], om['std'], len(result['runs']))} "
                      f"({len(result['runs'])} runs, over the {omega_label(om.get('events'))})",
                      highlight=False)


@contextmanager
def sweep_monitor():
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  TextColumn("{task.fields[eta]}"), console=err_console,
                  disable=not err_console.is_terminal) as bar:
        yield SweepMonitor(bar, plain=not err_console.is_terminal)


def print_sweep_plan(grid, rows) -> None:
    table = Table(title=f"{grid.name}: {len(grid.cells)} cells x {len(grid.seeds)} runs -> "
                  f"{grid.out}", title_justify="left")
    for col in ("cell", "settings", "runs done"):
        table.add_column(col, overflow="fold")
    for cell, done in rows:
        settings = " ".join(f"{k}={v}" for k, v in cell.settings.items())
        table.add_row(cell.id, settings, f"{len(done)}/{len(grid.seeds)}")
    console.print(table)


def print_sweep_summary(summary) -> None:
    console.print(
        f"sweep: {summary.cells} cells, {summary.runs} runs: {summary.computed} computed, "
        f"{summary.skipped} already done, "
        + (f"{summary.elsewhere} by another sweep of the folder, " if summary.elsewhere else "")
        + f"{len(summary.failed)} failed, "
        f"{summary.wall_seconds:.0f} s; results in {summary.out}")
    for f in summary.failed:
        err_console.print(f"[red]failed:[/] {f['cell']} seed {f['seed']}: {f['error']}",
                          highlight=False)


def print_report(report) -> None:
    from ciosl.report.unreferenced import reference_line

    shown_apart = set(report.apart)  # --no-offline results: in tables of their own
    for path, reason in report.left_out:  # on stderr, one line each, before the tables
        if path in shown_apart:
            continue
        print_error(printable(f"skipped {path}: {reason}"), prefix="[yellow]warning:[/] ")
    for line in report.duplicates:
        print_error(printable(line), prefix="[yellow]note:[/] ")
    main = report.markdown("main")  # escaped: no control character of a name reaches here
    if report.apart:  # results without the offline reference: why they have no Omega_all
        print_error(printable(reference_line(len(report.apart))), prefix="[yellow]note:[/] ")
    if main is None:  # only results without the offline reference: their table
        main = report.markdown("unreferenced")
    if main is not None:
        console.print(main, highlight=False, markup=False, soft_wrap=True)
    def n(count: int, what: str) -> str:
        return f"{count} {what}{'' if count == 1 else 's'}"

    count = len(report.entries) + sum(len(t.rows) for t in report.tables
                                      if t.kind == "unreferenced")
    console.print(f"{n(count, 'result')}, {n(len(report.tables), 'table')}, "
                  f"{n(len(report.figures), 'figure')}: written to {printable(report.path)}",
                  highlight=False, markup=False)
