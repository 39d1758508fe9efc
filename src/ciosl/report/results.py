"""Result JSONs (from ``ciosl run`` or ``ciosl sweep``) read back for reports.

Each result is classified by what differs from the protocol's defaults: its method's default
settings with the dataset's buffer and the ordering's defaults (``resolve_settings`` with no
overrides). A result with no difference belongs in the main table; one that differs in a single
setting belongs in that setting's ablation, and so on. Settings a sweep grid fixes for a method
(``[settings.METHOD]``, e.g. a baseline's learning rate) are part of that grid's protocol, not an
ablation: such a result stays in the main table, its row labelled with them (``fixed``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ciosl.data.orderings import ORDERINGS

# the paper's row order (Table 2), then the baselines it left out; unknown methods go before
# ciosl, the offline upper bound last
METHOD_ORDER = ("finetune", "ewc", "mas", "vcl", "vcl_coreset", "coreset_only", "gdumb", "agem",
                "tinyer", "exstream", "remind", "slda", "ncm", "ciosl", "offline")
METHOD_NAMES = {
    "finetune": "Fine-Tune", "ewc": "EWC", "mas": "MAS", "vcl": "VCL",
    "vcl_coreset": "VCL w/ coreset", "coreset_only": "Coreset only", "gdumb": "GDumb",
    "agem": "A-GEM", "tinyer": "TinyER", "exstream": "ExStream", "remind": "REMIND",
    "slda": "Deep SLDA", "ncm": "NCM", "ciosl": "CIOSL (ours)", "offline": "Offline",
}
DATASET_ORDER = ("cifar10", "cifar100", "imagenet100", "icubworld1", "digits", "fashion-mnist",
                 "digits-video", "fashion-mnist-video")
ORDERING_NAMES = {"iid": "iid", "class_iid": "class-iid", "instance": "instance",
                  "class_instance": "class-instance"}
REGIME_ORDER = ("batch", "online", "streaming")


def method_name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


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

    @property
    def name(self) -> str:
        return method_name(self.method)

    @property
    def label(self) -> str:
        """The method's name with the grid-fixed settings, e.g. ``Fine-Tune (lr=0.001)``."""
        return self.name + (f" ({settings_text(self.fixed)})" if self.fixed else "")

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


def make_entry(data: dict, path: Path) -> Entry:
    method, dataset, ordering = data["method"], data["dataset"], data["ordering"]
    settings = {k: v for k, v in (data.get("settings") or {}).items() if k != "seed"}
    base = _class_defaults(method)
    effective = {**(json.loads(base) if base else {}), **_jsonable(settings)}
    defaults = _cell_defaults(method, dataset, ordering)
    sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
    grid_fixed = sweep.get("variant", "default") == "default"  # only [settings.METHOD] values
    given = dict(sweep.get("set") or {})
    if defaults is None:  # an unknown method or dataset here: trust the sweep's variant name
        diff = {} if grid_fixed else given
        fixed = given if grid_fixed else {}
    else:
        default = json.loads(defaults)
        diff = {k: v for k, v in effective.items() if k not in default or default[k] != v}
        fixed = {k: v for k, v in diff.items() if k in given} if grid_fixed else {}
        diff = {k: v for k, v in diff.items() if k not in fixed}
    limit = data.get("limit_per_class") or 0
    extractor = data.get("extractor") or ""
    label = dataset + (f" ≤{limit}/class" if limit else "")
    if extractor and extractor != _default_extractor(dataset):
        label += f" ({extractor})"
    column = Column(
        ORDERINGS.index(ordering) if ordering in ORDERINGS else len(ORDERINGS),
        (DATASET_ORDER.index(dataset) if dataset in DATASET_ORDER else len(DATASET_ORDER),
         dataset),
        ordering, dataset, limit, extractor, label)
    om = data["omega_all"]
    return Entry(data=data, path=path, method=method, column=column, regime=regime_of(data),
                 diff=diff, effective=effective,
                 violates=bool(data.get("violates_single_pass", False)),
                 method_violates=method_violates(method, data),
                 mean=float(om["mean"]), std=float(om.get("std", 0.0)),
                 n_runs=len(data["runs"]), mtime=path.stat().st_mtime, fixed=fixed)


def load_entries(folder: str | Path) -> list[Entry]:
    """Every result JSON under ``folder`` (recursively; run files and other JSONs are skipped)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such results folder: {folder}")
    entries = []
    for path in sorted(folder.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_result(data):
            entries.append(make_entry(data, path))
    return entries


def pick(entries: list[Entry]) -> Entry:
    """Of several results for the same cell: the one with most runs, then the newest."""
    return max(entries, key=lambda e: (e.n_runs, e.mtime))


def offline_mean(entry: Entry) -> float | None:
    """Mean over runs and events of the offline learner's accuracy (the paper's Offline-hat)."""
    values = [a for run in entry.data["runs"] for a in run.get("accuracy_offline", [])]
    return sum(values) / len(values) if values else None
