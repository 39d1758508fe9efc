"""Terminal rendering with rich: progress bar, result tables, dataset and method lists."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


@contextmanager
def sample_progress(description: str):
    """A progress bar over streamed samples; yields (on_start, on_progress) callbacks."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("samples"), TimeElapsedColumn(), TimeRemainingColumn(),
                  console=err_console, transient=False,
                  disable=not err_console.is_terminal) as bar:
        task = bar.add_task(description, total=None)
        yield (lambda total: bar.update(task, total=total),
               lambda n: bar.advance(task, n))


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def print_run(run: dict) -> None:
    table = Table(title=f"seed {run['seed']}: Omega_all = {run['omega_all']:.4f}",
                  title_justify="left")
    for col in ("event", "stream position", "test samples", "accuracy %", "offline %", "ratio"):
        table.add_column(col, justify="right")
    for t, (pos, n, a, o) in enumerate(zip(run["events"], run["n_test"], run["accuracy"],
                                           run["accuracy_offline"], strict=True)):
        table.add_row(str(t), str(pos), str(n), pct(a), pct(o), f"{a / o:.3f}")
    console.print(table)


def print_result(result: dict) -> None:
    om, fa = result["omega_all"], result["final_accuracy"]
    console.print(
        f"[bold]{result['method']}[/] on {result['dataset']} / {result['ordering']} "
        f"({len(result['runs'])} runs, {result['extractor']} features, d={result['feature_dim']}):"
    )
    console.print(f"  Omega_all      = {om['mean']:.4f} +- {om['std']:.4f}")
    console.print(f"  final accuracy = {pct(fa['mean'])} +- {pct(fa['std'])} %")
    console.print(f"  speed          = {result['samples_per_second']:.0f} samples/s, "
                  f"peak state {result['peak_memory_bytes'] / 2**20:.2f} MiB, "
                  f"{result['predict_seconds']:.1f} s per run at testing events")
    if "path" in result:
        console.print(f"  written to {result['path']}")


def print_datasets(rows) -> None:
    table = Table(title="datasets", title_justify="left")
    for col in ("name", "present", "orderings", "base", "classes/step", "buffer", "extractor"):
        table.add_column(col, overflow="fold")
    for spec, present, _ in rows:
        table.add_row(spec.name, "[green]yes[/]" if present else "[red]no[/]",
                      " ".join(spec.orderings), f"{spec.base_fraction:g}",
                      str(spec.classes_per_step), str(spec.buffer), spec.default_extractor)
    console.print(table)
    for spec, present, where in rows:
        text = f"found in {where}" if present else spec.how_to_get
        console.print(f"[bold]{spec.name}[/]: {text}", highlight=False)


def print_methods(methods) -> None:
    table = Table(title="methods (set with --set NAME=VALUE)", title_justify="left")
    for col in ("method", "setting", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for name, cls in methods.items():
        flag = " [red](violates single pass)[/]" if cls.violates_single_pass else ""
        table.add_row(f"[bold]{name}[/]{flag}", "", "", cls.description, end_section=False)
        settings = [s for s in cls.settings() if s.name != "seed"]
        for i, s in enumerate(settings):
            choices = f" (one of {', '.join(map(str, s.choices))})" if s.choices else ""
            table.add_row("", s.name, repr(s.default), s.help + choices,
                          end_section=i == len(settings) - 1)
    console.print(table)


def print_features(fs) -> None:
    console.print(f"{fs.dataset} / {fs.extractor}: train {fs.train_z.shape}, "
                  f"test {fs.test_z.shape}, {fs.n_classes} classes, cache key {fs.key}")
