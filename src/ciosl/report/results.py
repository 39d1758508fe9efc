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

Every result is checked before it is used (``result_problem``: types, ranges, lengths, order);
a file that fails is left out with the file and the field named.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ciosl.data.orderings import ORDERINGS
from ciosl.fileio import MAX_JSON_BYTES, kind_of, read_text
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
REGIME_ORDER = ("batch", "online", "streaming")


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
    label: str  # the dataset, with its limit / non-default extractor

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
    from ciosl.learners.base import get_method

    try:
        cls = get_method(method)
    except ValueError:
        return None
    return json.dumps(_jsonable({s.name: s.default for s in cls.settings() if s.name != "seed"}))


@cache
def _reading(method: str, ordering: str) -> str:
    """The method's paper values on the ordering and its added settings (JSON text, cached):
    what a result that lacks a setting ran at."""
    from ciosl.learners.base import get_method

    try:
        cls = get_method(method)
    except ValueError:
        return json.dumps([{}, {}])
    return json.dumps([_jsonable(cls.paper_values_for(ordering)),
                       _jsonable(cls.added_settings)])


@cache
def _cell_defaults(method: str, dataset: str, ordering: str) -> str | None:
    """The settings a cell gets with no user value (JSON text, for the cache)."""
    from ciosl.data.datasets import get_spec
    from ciosl.evaluation.experiment import resolve_settings
    from ciosl.learners.base import get_method

    base = _class_defaults(method)
    if base is None:
        return None
    out = json.loads(base)
    try:
        out.update(_jsonable(resolve_settings(get_method(method), get_spec(dataset), ordering,
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


def regime_of(data: dict) -> str:
    """``streaming``, ``online`` or ``batch``: ``regime`` is {"name", "batch_size", "epochs"}
    in results of ``ciosl run`` (absent in older ones: streaming)."""
    regime = data.get("regime") or (data.get("sweep") or {}).get("regime") or "streaming"
    return str(regime.get("name", "streaming") if isinstance(regime, dict) else regime)


def method_violates(method: str, data: dict) -> bool:
    """Whether the method itself breaks single pass (a batch-regime result always does)."""
    from ciosl.learners.base import get_method

    try:
        return bool(get_method(method).violates_single_pass)
    except ValueError:
        return bool(data.get("violates_single_pass", False)) and regime_of(data) != "batch"


def is_result(data: Any) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("omega_all"), dict)
            and "mean" in data["omega_all"] and isinstance(data.get("runs"), list)
            and all(k in data for k in ("method", "dataset", "ordering")))


def stored_omega_events(data: dict) -> str:
    """The Omega_all definition a result was written with (unlabelled: every event)."""
    return str((data.get("omega_all") or {}).get("events", "all"))


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


def looks_like_result(data: Any) -> bool:
    """A JSON that means to be a result (run files, cache entries and the like do not)."""
    return isinstance(data, dict) and "omega_all" in data and "method" in data


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _brief(value: Any) -> str:
    """A short, printable repr of a bad value for a warning."""
    return shorten(printable(repr(value)), 40)


MAX_DEPTH = 16  # a result nests about 5 levels deep (runs[i].class_counts[t][c][k])


def _too_deep(data: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested more than ``limit`` levels deep, or None (iterative:
    no recursion on a hostile file)."""
    stack = [(data, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, dict | list):
            if depth >= limit:
                return where or "(top level)"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                name = shorten(printable(k), 20)
                stack.append((v, depth + 1, f"{where}[{k}]" if isinstance(value, list)
                              else f"{where}.{name}" if where else name))
    return None


def _in_range(values: Any, low: float, high: float, *, low_open: bool = False,
              none_ok: bool = False) -> str | None:
    """Why ``values`` is not a list of finite numbers in [low, high] ((low, high] with
    ``low_open``; None items allowed with ``none_ok``), or None."""
    if not isinstance(values, list):
        return f"must be a list, got {_brief(values)}"
    for i, x in enumerate(values):
        if x is None and none_ok:
            continue
        if not _finite(x) or x > high or x < low or (low_open and x == low):
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            return f"[{i}] must be a number in {interval}, got {_brief(x)}"
    return None


def _matrix_problem(matrix: Any) -> str | None:
    if not isinstance(matrix, list):
        return f" must be a list of rows, got {_brief(matrix)}"
    for t, row in enumerate(matrix):
        problem = _in_range(row, 0.0, 1.0, none_ok=True)
        if problem is not None:
            return f"[{t}]{problem if problem.startswith('[') else ' ' + problem}"
    return None


def _summary_problem(data: dict, key: str, low: float, high: float) -> str | None:
    """``key`` (``{"mean", "std"}``, optional) with its mean in [low, high], std >= 0."""
    if key not in data or data[key] is None:
        return None
    value = data[key]
    if not isinstance(value, dict):
        return f"{key} must be an object, got {_brief(value)}"
    mean = value.get("mean")
    if not (_finite(mean) and low <= mean <= high):
        return f"{key}.mean must be a number in [{low:g}, {high:g}], got {_brief(mean)}"
    std = value.get("std", 0.0)
    if std is not None and not (_finite(std) and std >= 0):
        return f"{key}.std must be a finite number >= 0, got {_brief(std)}"
    return None


def _run_problem(run: Any, i: int) -> str | None:
    """Why run ``i`` of a result cannot be used: accuracies outside [0, 1], offline accuracies
    that are not > 0, lists whose length is not the number of testing events, events out of
    order."""
    if not isinstance(run, dict):
        return f"runs[{i}] must be an object, got {_brief(run)}"
    at = f"runs[{i}]"
    events = run.get("events")
    if events is not None:
        if not (isinstance(events, list) and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in events)):
            return f"{at}.events must be a list of stream positions (integers >= 0)"
        for t in range(1, len(events)):
            if events[t] <= events[t - 1]:
                return (f"{at}.events must be in increasing order, got {events[t - 1]} then "
                        f"{events[t]} at [{t}]")
    for key, low_open in (("accuracy", False), ("accuracy_offline", True)):
        if key in run:
            problem = _in_range(run[key], 0.0, 1.0, low_open=low_open)
            if problem is not None:
                return f"{at}.{key}{problem if problem.startswith('[') else ' ' + problem}"
    lengths = {k: len(run[k]) for k in ("accuracy", "accuracy_offline", "n_test",
                                        "accuracy_matrix")
               if isinstance(run.get(k), list)}
    if events is not None:
        for k, n in lengths.items():
            if n != len(events):
                return f"{at}.{k} must have one value per testing event ({len(events)}), has {n}"
    elif len(set(lengths.values())) > 1:
        return (f"{at}: accuracy and accuracy_offline must have the same length, have "
                f"{lengths.get('accuracy')} and {lengths.get('accuracy_offline')}")
    if "accuracy_matrix" in run:
        problem = _matrix_problem(run["accuracy_matrix"])
        if problem is not None:
            return f"{at}.accuracy_matrix{problem}"
    if "omega_all" in run and not (_finite(run["omega_all"]) and run["omega_all"] >= 0):
        return f"{at}.omega_all must be a finite number >= 0, got {_brief(run['omega_all'])}"
    per_class = run.get("final_class_accuracy")
    if per_class is not None:
        if not isinstance(per_class, dict):
            return f"{at}.final_class_accuracy must be an object, got {_brief(per_class)}"
        for c, a in per_class.items():
            if not (_finite(a) and 0 <= a <= 1):
                return (f"{at}.final_class_accuracy[{_brief(c)}] must be a number in [0, 1], "
                        f"got {_brief(a)}")
    for key in ("samples_per_second", "learn_seconds", "predict_seconds"):
        if run.get(key) is not None and not (_finite(run[key]) and run[key] >= 0):
            return f"{at}.{key} must be a finite number >= 0, got {_brief(run[key])}"
    return None


def result_problem(data: dict) -> str | None:
    """Why a result JSON cannot be used (None: it can), naming the field: nesting, types,
    known orderings and Omega_all definitions, ranges (accuracies in [0, 1], offline
    accuracies > 0), lengths (one value per testing event) and order (events increasing)."""
    deep = _too_deep(data)
    if deep is not None:
        return f"{deep} is nested more than {MAX_DEPTH} levels deep"
    for k in ("method", "dataset", "ordering"):
        if not isinstance(data.get(k), str):
            return f"{k} must be a string, got {_brief(data.get(k))}"
        if not data[k].strip():
            return f"{k} must not be empty, got {_brief(data[k])}"
    if data["ordering"] not in ORDERINGS:
        return f"ordering must be one of {', '.join(ORDERINGS)}, got {_brief(data['ordering'])}"
    om = data["omega_all"]
    if not isinstance(om, dict) or not _finite(om.get("mean")):
        return f"omega_all.mean must be a finite number, got {_brief(om)}"
    if om["mean"] < 0:
        return f"omega_all.mean must be >= 0, got {_brief(om['mean'])}"
    if "std" in om and not (_finite(om["std"]) and om["std"] >= 0):
        return f"omega_all.std must be a finite number >= 0, got {_brief(om['std'])}"
    from ciosl.evaluation.metrics import OMEGA_EVENTS

    if "events" in om and om["events"] not in OMEGA_EVENTS:
        return (f"omega_all.events must be one of {', '.join(OMEGA_EVENTS)}, got "
                f"{_brief(om['events'])}")
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        return f"runs must be a non-empty list, got {_brief(runs)}"
    for i, run in enumerate(runs):
        problem = _run_problem(run, i)
        if problem is not None:
            return problem
    for key, low, high in (("final_accuracy", 0.0, 1.0), ("forgetting", -1.0, 1.0),
                           ("backward_transfer", -1.0, 1.0)):
        problem = _summary_problem(data, key, low, high)
        if problem is not None:
            return problem
    if data.get("accuracy_matrix") is not None:
        problem = _matrix_problem(data["accuracy_matrix"])
        if problem is not None:
            return f"accuracy_matrix{problem}"
    for key, kind in (("settings", dict), ("sweep", dict), ("versions", dict),
                      ("extractor", str), ("regime", dict | str)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"{key} has the wrong type, got {_brief(data[key])}"
    for key in ("limit_per_class", "peak_memory_bytes"):
        value = data.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= 0):
            return f"{key} must be an integer >= 0, got {_brief(value)}"
    if "violates_single_pass" in data and not isinstance(data["violates_single_pass"], bool):
        return f"violates_single_pass must be true or false, got " \
               f"{_brief(data['violates_single_pass'])}"
    return None


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
                 left_out: list[tuple[Path, str]] | None = None) -> list[Entry]:
    """Every result JSON under ``folder`` (recursively; run files and other JSONs are skipped),
    with Omega_all under ``omega_events``. A JSON that cannot be read, a malformed result and a
    result whose Omega_all cannot be given under that definition are left out, each with
    (path, reason) appended to ``left_out``."""
    from ciosl.evaluation.metrics import check_omega_events

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
        problem = result_problem(data)
        if problem is not None:
            skipped.append((path, f"malformed result: {problem}"))
            continue
        try:
            entries.append(make_entry(data, path, omega_events))
        except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError,
                RecursionError) as e:
            skipped.append((path, shorten(printable(
                str(e) if isinstance(e, ValueError)
                else f"malformed result ({type(e).__name__}: {e})"), 200)))
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


def offline_mean(entry: Entry) -> float | None:
    """Mean over runs and the testing events Omega_all averages (``entry.omega_events``) of the
    offline learner's accuracy (the paper's Offline-hat)."""
    first = 1 if entry.omega_events == "after_base" else 0
    values = [a for run in entry.data["runs"] for a in run.get("accuracy_offline", [])[first:]]
    return sum(values) / len(values) if values else None
