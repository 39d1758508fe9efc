"""Result JSONs (from ``ciosl run`` or ``ciosl sweep``) read back for reports.

Each result is classified by what differs from the protocol's defaults: its method's default
settings with the dataset's buffer and the ordering's defaults (``resolve_settings`` with no
overrides). A result with no difference belongs in the main table; one that differs in a single
setting belongs in that setting's ablation, and so on. Settings a sweep grid fixes for a method
(``[settings.METHOD]``, e.g. a baseline's learning rate) are part of that grid's protocol, not an
ablation: such a result stays in the main table, its row labelled with them (``fixed``).

Omega_all: every table shows one definition (``omega_events``: the events after base init, the
default, or every event). A result written with that definition gives its stored Omega_all; one
written with the other (results without ``omega_all.events``, from ciosl before the base event
was left out, averaged every event) is recomputed from its runs' per-event accuracies, so old
and new results never mix definitions. Results that predate ciosl recording every setting
(``legacy``) have the settings they did not record taken as this version's cell defaults,
except those added since as departures from the paper (``Learner.paper_values``, e.g. gradient
clipping): those results ran at the paper's value. A result without a setting added since it
was written (``Learner.added_settings``, e.g. CIOSL's ``fisher_decay``) ran at the value the
method had before the setting existed, not at today's default.

Settings whose value is not the paper's (``Learner.paper_values``, e.g. ``max_grad_norm=1``) are
an entry's ``departures``: the tables mark each cell that ran one with a letter and list the
letters once under the table (``tables.departure_marks``), so no cell passes a departure from
the paper off as the paper's method and every method keeps one row.

Every result is checked before it is used (``result_problem``: types, ranges, shapes, seeds,
then every stored summary recomputed from the per-run data it summarises); a file that fails,
or that raises anything while it is read and classified, is left out with the file (and the
field) named. A method name read from a result never imports a module (``known_method``).
The checks of a result's schema are in ``schema`` (re-exported here).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ciosl.data.orderings import ORDERINGS
from ciosl.fileio import MAX_JSON_BYTES, kind_of, read_text

# the schema of a result (schema.py): re-exported here, where reports and tests import it
from ciosl.report.schema import (  # noqa: F401
    MAX_DEPTH,
    MAX_OMEGA,
    PER_EVENT,
    RECORDED_BY_EVERY_RUN,
    REGIME_ORDER,
    TOLERANCE,
    known_method,
    looks_like_result,
    regime_of,
    result_problem,
    stored_omega_events,
)
from ciosl.report.text import printable, shorten

# the paper's row order (Table 2), then the baselines it left out; unknown methods go before
# ciosl, the offline upper bound last
METHOD_ORDER = ("finetune", "ewc", "mas", "vcl", "vcl_coreset", "coreset_only", "gdumb", "agem",
                "tinyer", "exstream", "remind", "slda", "ncm", "rp_lda", "ciosl", "offline")
METHOD_NAMES = {
    "finetune": "Fine-Tune", "ewc": "EWC", "mas": "MAS", "vcl": "VCL",
    "vcl_coreset": "VCL w/ coreset", "coreset_only": "Coreset only", "gdumb": "GDumb",
    "agem": "A-GEM", "tinyer": "TinyER", "exstream": "ExStream", "remind": "REMIND",
    "slda": "Deep SLDA", "ncm": "NCM", "rp_lda": "RP-LDA", "ciosl": "CIOSL (ours)",
    "offline": "Offline",
}
DATASET_ORDER = ("cifar10", "cifar100", "imagenet100", "icubworld1", "digits", "fashion-mnist",
                 "digits-video", "digits-video-28", "fashion-mnist-video", "digits-instances",
                 "fashion-mnist-instances")
ORDERING_NAMES = {"iid": "iid", "class_iid": "class-iid", "instance": "instance",
                  "class_instance": "class-instance"}


def method_name(method: str) -> str:
    """The paper's name of a method; another name as given, cut to ``LABEL_MAX``."""
    return METHOD_NAMES.get(method) or shorten(method)


def method_key(method: str) -> tuple[float, str]:
    if method in METHOD_ORDER:
        return (METHOD_ORDER.index(method), method)
    return (METHOD_ORDER.index("ciosl") - 0.5, method)


@dataclass(frozen=True, order=True)
class Column:
    """A (ordering, dataset) column of the paper's tables; limit/extractor tell runs apart."""

    ordering_rank: int
    dataset_rank: tuple[int, str]
    ordering: str
    dataset: str
    limit: int
    extractor: str
    label: str  # the dataset, with its limit / non-default extractor (and protocol)
    protocol: str = ""  # the protocol it ran (``report.protocols``): never mixed in a column

    @property
    def title(self) -> str:
        return f"{ORDERING_NAMES.get(self.ordering, self.ordering)} · {self.label}"


@dataclass
class Entry:
    """One result JSON, classified."""

    data: dict
    path: Path
    method: str
    column: Column
    regime: str
    diff: dict[str, Any]  # settings that differ from the cell's defaults (fixed ones aside)
    effective: dict[str, Any]  # every setting, defaults included
    violates: bool  # this result breaks single pass (the method does, or the batch regime)
    method_violates: bool  # the method itself does (retrains / fine-tunes before inference)
    mean: float
    std: float
    n_runs: int
    mtime: float
    fixed: dict[str, Any] = field(default_factory=dict)  # the sweep grid's [settings.METHOD]
    unpaper: dict[str, Any] = field(default_factory=dict)  # defaults that are not the paper's
    omega_events: str = "after_base"  # the Omega_all definition of mean / std
    recomputed: bool = False  # mean / std recomputed from the per-event accuracies
    legacy: bool = False  # written before results recorded every setting (see module doc)

    @property
    def name(self) -> str:
        return method_name(self.method)

    @property
    def label(self) -> str:
        """The method's name with the settings its sweep grid fixes, e.g. ``Fine-Tune
        (lr=0.001)``, at most ``LABEL_MAX`` characters (the departures from the paper are
        ``departures``, marked in the cells)."""
        return shorten(self.name + (f" ({settings_text(self.fixed)})" if self.fixed else ""))

    @property
    def departures(self) -> dict[str, Any]:
        """The defaults this result ran with that are not the paper's (``unpaper``)."""
        return self.unpaper

    @property
    def non_default(self) -> dict[str, Any]:
        return {**self.fixed, **self.diff}


def settings_text(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))




@cache
def _class_defaults(method: str) -> str | None:
    cls = known_method(method)
    if cls is None:
        return None
    return json.dumps(_jsonable({s.name: s.default for s in cls.settings() if s.name != "seed"}))


@cache
def _reading(method: str, ordering: str) -> str:
    """The method's paper values on the ordering and its added settings (JSON text, cached):
    what a result that lacks a setting ran at."""
    cls = known_method(method)
    if cls is None:
        return json.dumps([{}, {}])
    return json.dumps([_jsonable(cls.paper_values_for(ordering)),
                       _jsonable(cls.added_settings)])


@cache
def _cell_defaults(method: str, dataset: str, ordering: str) -> str | None:
    """The settings a cell gets with no user value (JSON text, for the cache)."""
    from ciosl.data.datasets import get_spec
    from ciosl.evaluation.experiment import resolve_settings

    base = _class_defaults(method)
    if base is None:
        return None
    out = json.loads(base)
    try:
        out.update(_jsonable(resolve_settings(known_method(method), get_spec(dataset), ordering,
                                              None, {})))
    except (ValueError, FileNotFoundError, OSError):
        return None
    return json.dumps(out)


def _default_extractor(dataset: str) -> str | None:
    from ciosl.data.datasets import get_spec

    try:
        return get_spec(dataset).default_extractor
    except (ValueError, FileNotFoundError, OSError):
        return None




def method_violates(method: str, data: dict) -> bool:
    """Whether the method itself breaks single pass (a batch-regime result always does)."""
    cls = known_method(method)
    if cls is None:
        return bool(data.get("violates_single_pass", False)) and regime_of(data) != "batch"
    return bool(cls.violates_single_pass)


def is_result(data: Any) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("omega_all"), dict)
            and "mean" in data["omega_all"] and isinstance(data.get("runs"), list)
            and all(k in data for k in ("method", "dataset", "ordering")))




def omega_of(data: dict, omega_events: str) -> tuple[float, float, bool]:
    """(mean, std over runs, recomputed) of a result's Omega_all under ``omega_events``: the
    stored values when the result was written with that definition, else recomputed from each
    run's ``accuracy`` / ``accuracy_offline`` (ValueError when a run lacks them)."""
    from ciosl.evaluation.metrics import mean_std, omega_all

    om = data["omega_all"]
    if stored_omega_events(data) == omega_events:
        return float(om["mean"]), float(om.get("std", 0.0)), False
    values = []
    for run in data["runs"]:
        if not (isinstance(run, dict) and run.get("accuracy") and run.get("accuracy_offline")):
            raise ValueError(f"Omega_all was written over {stored_omega_events(data)!r} events "
                             "and a run has no per-event accuracies to recompute it from")
        values.append(omega_all(run["accuracy"], run["accuracy_offline"], events=omega_events))
    mean, std = mean_std(values)
    return mean, std, True


def make_entry(data: dict, path: Path, omega_events: str = "after_base") -> Entry:
    method, dataset, ordering = data["method"], data["dataset"], data["ordering"]
    settings = {k: v for k, v in (data.get("settings") or {}).items() if k != "seed"}
    legacy = "events" not in data["omega_all"]  # ciosl recorded only non-default settings
    base = _class_defaults(method)
    defaults = _cell_defaults(method, dataset, ordering)
    assumed = defaults if legacy and defaults is not None else base
    paper, added = json.loads(_reading(method, ordering))
    then = {k: v for k, v in paper.items() if k not in settings} if legacy else {}
    added = {k: v for k, v in added.items() if k not in settings}
    effective = {**(json.loads(assumed) if assumed else {}), **then, **added,
                 **_jsonable(settings)}
    sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
    grid_fixed = sweep.get("variant", "default") == "default"  # only [settings.METHOD] values
    given = dict(sweep.get("set") or {})
    if defaults is None:  # an unknown method or dataset here: trust the sweep's variant name
        diff = {} if grid_fixed else given
        fixed = given if grid_fixed else {}
    else:
        default = json.loads(defaults)
        diff = {k: v for k, v in effective.items()
                if (k not in default or default[k] != v) and k not in then}
        fixed = {k: v for k, v in diff.items() if k in given} if grid_fixed else {}
        diff = {k: v for k, v in diff.items() if k not in fixed}
    limit = data.get("limit_per_class") or 0
    extractor = data.get("extractor") or ""
    label = shorten(dataset, 40) + (f" ≤{limit}/class" if limit else "")
    if extractor and extractor != "none" and extractor != _default_extractor(dataset):
        label += f" ({shorten(extractor, 30)})"
    column = Column(
        ORDERINGS.index(ordering) if ordering in ORDERINGS else len(ORDERINGS),
        (DATASET_ORDER.index(dataset) if dataset in DATASET_ORDER else len(DATASET_ORDER),
         dataset),
        ordering, dataset, limit, extractor, label)
    mean, std, recomputed = omega_of(data, omega_events)
    return Entry(data=data, path=path, method=method, column=column, regime=regime_of(data),
                 diff=diff, effective=effective,
                 violates=bool(data.get("violates_single_pass", False)),
                 method_violates=method_violates(method, data),
                 mean=mean, std=std, n_runs=len(data["runs"]), mtime=path.stat().st_mtime,
                 fixed=fixed, omega_events=omega_events, recomputed=recomputed, legacy=legacy,
                 unpaper={k: effective[k] for k in paper if k in effective
                          and effective[k] != paper[k] and k not in diff and k not in fixed})




def _read_json(path: Path) -> tuple[Any, str | None]:
    """(the JSON in ``path``, None), or (None, why it cannot be read): a folder, a FIFO or a
    device is refused without being opened for reading, a file is read up to a cap."""
    try:
        if path.is_dir():
            return None, "unreadable (Is a directory)"
        text = read_text(path, "result JSON", MAX_JSON_BYTES)
    except OSError as e:
        return None, f"unreadable ({e.strerror or type(e).__name__})"
    except ValueError as e:  # not a regular file, too large, not UTF-8
        return None, f"unreadable ({str(e).replace(f'result JSON {path}: ', '')})"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"
    except ValueError as e:
        return None, f"not valid JSON ({e})"


def load_entries(folder: str | Path, *, omega_events: str = "after_base",
                 left_out: list[tuple[Path, str]] | None = None,
                 unreferenced: list[tuple[Path, dict]] | None = None) -> list[Entry]:
    """Every result JSON under ``folder`` (recursively; run files and other JSONs are skipped),
    with Omega_all under ``omega_events``. A JSON that cannot be read, a malformed result, a
    result whose Omega_all cannot be given under that definition and one that fails in any
    other way while it is checked or classified are left out, each with (path, reason)
    appended to ``left_out``: one bad file never takes the report down. A well-formed result
    run without the offline reference is left out too, and (path, its data) is appended to
    ``unreferenced``."""
    from ciosl.evaluation.metrics import check_omega_events
    from ciosl.report.unreferenced import is_unreferenced, unreferenced_reason

    check_omega_events(omega_events)
    folder = Path(folder)
    if not folder.is_dir():
        if folder.exists():
            raise ValueError(f"results folder {folder}: not a folder ({kind_of(folder.stat().st_mode)})")
        raise FileNotFoundError(f"no such results folder: {folder}")
    entries = []
    skipped: list[tuple[Path, str]] = left_out if left_out is not None else []
    for path in sorted(folder.rglob("*.json")):
        data, unreadable = _read_json(path)
        if unreadable is not None:
            skipped.append((path, unreadable))
            continue
        if not looks_like_result(data):
            continue
        try:
            apart = unreferenced_reason(data)  # --no-offline: named, never in a column
            if apart is not None:
                skipped.append((path, apart))
                if unreferenced is not None and is_unreferenced(data):
                    unreferenced.append((path, data))
                continue
            problem = result_problem(data)
            if problem is not None:
                skipped.append((path, f"malformed result: {problem}"))
                continue
            entries.append(make_entry(data, path, omega_events))
        except Exception as e:  # a check missed something: one result fails, not the report
            skipped.append((path, shorten(printable(
                str(e) if isinstance(e, ValueError)
                else f"malformed result ({type(e).__name__}: {e})"), 200)))
    from ciosl.report.protocols import separate_protocols

    separate_protocols(entries)  # different protocols never share a column
    return entries


def pick(entries: list[Entry]) -> Entry:
    """Of several results for the same cell: the one with most runs, then the newest."""
    return max(entries, key=lambda e: (e.n_runs, e.mtime))


def drop_duplicates(entries: list[Entry]) -> tuple[list[Entry], list[tuple[Entry, list[Entry]]]]:
    """One entry per cell (method, row label, column, regime, settings), the one ``pick``
    takes; and (used, not used) for every cell that had several."""
    groups: dict[tuple, list[Entry]] = {}
    for e in entries:
        key = (e.method, e.label, e.column, e.regime, e.violates,
               json.dumps(e.diff, sort_keys=True, default=str))
        groups.setdefault(key, []).append(e)
    kept, duplicates = [], []
    for group in groups.values():
        used = pick(group)
        kept.append(used)
        if len(group) > 1:
            duplicates.append((used, [e for e in group if e is not used]))
    order = {id(e): i for i, e in enumerate(entries)}
    return sorted(kept, key=lambda e: order[id(e)]), duplicates


def offline_entry(entries: list[Entry]) -> Entry | None:
    """The result whose offline reference stands for a column's: the reference most of its
    results share (every method of a stream divides by one; a cell rerun after the offline
    cache was rebuilt can carry one that differs in the last digits), ties to the first result
    by file name. A pure function of the results, not of their files' times (a fresh clone
    gives them all one)."""
    found = sorted(((str(e.path), v, e) for e in entries
                    if (v := offline_mean(e)) is not None), key=lambda t: t[0])
    if not found:
        return None
    counts: dict[float, int] = {}
    for _, v, _ in found:
        counts[round(v, 9)] = counts.get(round(v, 9), 0) + 1
    best = max(counts.values())
    return next(e for _, v, e in found if counts[round(v, 9)] == best)


def offline_hat(entries: list[Entry]) -> float | None:
    """A column's Offline-hat: ``offline_mean`` of its ``offline_entry``."""
    entry = offline_entry(entries)
    return None if entry is None else offline_mean(entry)


def offline_mean(entry: Entry) -> float | None:
    """Mean over runs and the testing events Omega_all averages (``entry.omega_events``) of the
    offline learner's accuracy (the paper's Offline-hat)."""
    first = 1 if entry.omega_events == "after_base" else 0
    values = [a for run in entry.data["runs"] for a in run.get("accuracy_offline", [])[first:]]
    return sum(values) / len(values) if values else None
