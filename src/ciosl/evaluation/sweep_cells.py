"""The cells of a sweep as its driver knows them (``CellInfo``, ``prepare``): their
fingerprints, their run files (which count as finished) and their result files."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ciosl.data.runtime import resolve_device
from ciosl.data.types import DatasetSpec, FeatureSet
from ciosl.evaluation.experiment import (
    ExperimentSpec,
    aggregate,
    check_overwrite,
    fit_name,
    load_features,
    method_source,
    offline_settings,
    result_header,
    validate,
)
from ciosl.evaluation.grid import Cell, Grid
from ciosl.evaluation.protocol import OfflineSettings
from ciosl.fileio import atomic_write_json, read_json
from ciosl.learners.base import Learner

RUN_FORMAT = 1


@dataclass
class CellInfo:
    """What the driver knows about a cell once its features are loaded."""

    cell: Cell
    exp: ExperimentSpec
    spec: DatasetSpec
    cls: type[Learner]
    settings: dict[str, Any]
    fs: FeatureSet  # metadata only: train_z / test_z are emptied
    offline: OfflineSettings
    fingerprint: str
    settings_fingerprint: str  # all of the fingerprint but the features (``settings_fingerprint``)
    # runs saved before some of the learner's added_settings existed also count
    legacy_fingerprints: tuple[str, ...] = ()


def run_file(out: Path, cell: Cell, seed: int) -> Path:
    return Path(out) / "runs" / fit_name(cell.id) / f"seed-{seed}.json"


def result_file(out: Path, cell: Cell) -> Path:
    return Path(out) / f"{fit_name(cell.id)}.json"


def _fingerprint(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _features_id(exp: ExperimentSpec) -> tuple:
    return (exp.dataset, exp.extractor, exp.weights, str(exp.cache_dir), str(exp.data_root),
            exp.limit_per_class, exp.device, exp.backend)


def _regime_fields(exp: ExperimentSpec) -> dict[str, Any]:
    return {k: getattr(exp, k) for k in ("regime", "batch_size", "epochs") if hasattr(exp, k)}


def settings_fingerprint(exp: ExperimentSpec, spec: DatasetSpec, cls: type[Learner],
                         settings: dict[str, Any], *, legacy: int | None = None) -> str:
    """Everything that makes a run of this cell what it is, except the features: every setting
    as this code resolves it (a changed default is a changed cell), the offline reference's
    recipe and the regime. Needs no data. ``legacy = i``: the fingerprint that a run saved
    before the method's ``added_settings[i:]`` existed carries (they are in the order they were
    added), when the cell runs each of them at the value those runs ran at (the same runs;
    otherwise the ordinary fingerprint)."""
    source = method_source(cls)  # only for a learner defined outside ciosl
    resolved = {**{st.name: st.default for st in cls.settings() if st.name != "seed"},
                **settings}
    if legacy is not None:
        later = list(cls.added_settings)[legacy:]
        resolved = {k: v for k, v in resolved.items()
                    if not (k in later and v == cls.added_settings[k])}
    return _fingerprint({
        "format": RUN_FORMAT, "dataset": exp.dataset, "ordering": exp.ordering,
        "method": cls.name, **({"method_source": source} if source else {}),
        "settings": resolved,
        "limit_per_class": exp.limit_per_class, "offline": offline_settings(exp, spec).__dict__,
        **_regime_fields(exp),
        # a reference trained on a GPU is another cell's ($CIOSL_DEVICE; the CPU adds nothing)
        **({"device": d} if (d := resolve_device(exp.device)) != "cpu" else {})})


def legacy_fingerprints(exp: ExperimentSpec, spec: DatasetSpec, cls: type[Learner],
                        settings: dict[str, Any]) -> list[str]:
    """The settings fingerprints of this cell's runs saved by each earlier version: before the
    last of the method's ``added_settings`` existed, before the last two, ..., before all."""
    n = len(cls.added_settings)
    return [settings_fingerprint(exp, spec, cls, settings, legacy=i) for i in range(n - 1, -1, -1)]


def prepare(grid: Grid) -> list[CellInfo]:
    """Validate every cell and load each dataset's features once (the driver's step 1)."""
    metadata: dict[tuple, FeatureSet] = {}
    infos = []
    for cell in grid.cells:
        exp = grid.experiment(cell)
        spec, cls, settings = validate(exp)
        fid = _features_id(exp)
        if fid not in metadata:
            fs = load_features(exp, spec)  # computes and caches the features if needed
            metadata[fid] = replace(fs, train_z=fs.train_z[:0], test_z=fs.test_z[:0])
        fs = metadata[fid]
        offline = offline_settings(exp, spec)
        sfp = settings_fingerprint(exp, spec, cls, settings)
        fingerprint = _fingerprint({"settings": sfp, "features": fs.key})
        legacy = tuple(_fingerprint({"settings": x, "features": fs.key})
                       for x in legacy_fingerprints(exp, spec, cls, settings))
        infos.append(CellInfo(cell, exp, spec, cls, settings, fs, offline, fingerprint, sfp,
                              legacy))
    return infos


def _finished(out: Path, info: CellInfo, seed: int) -> dict | None:
    saved = read_json(run_file(out, info.cell, seed))
    if (isinstance(saved, dict)
            and saved.get("fingerprint") in (info.fingerprint, *info.legacy_fingerprints)
            and saved.get("seed") == seed and _whole_run(saved)):
        return saved
    return None  # missing, stale or damaged: computed again


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _whole_run(saved: dict) -> bool:
    """What a cell's result is built from, present and of the right kind: a run file edited
    or damaged into something else is computed again, not aggregated into an error."""
    run = saved.get("run")
    if not (isinstance(run, dict) and _number(saved.get("wall_seconds"))):
        return False
    acc, ref = run.get("accuracy"), run.get("accuracy_offline")
    return (isinstance(acc, list) and isinstance(ref, list) and len(acc) == len(ref) >= 1
            and all(_number(a) and 0 <= a <= 1 for a in acc)
            and all(_number(r) and 0 < r <= 1 for r in ref[1:]) and _number(ref[0])
            and all(_number(run.get(k)) for k in ("predict_seconds", "peak_memory_bytes"))
            and isinstance(run.get("samples_per_second"), int | float))  # inf: too fast to time


def check_cell_file(grid: Grid, out: Path, info: CellInfo, force: bool) -> None:
    """Refuse (unless ``force``) to replace the cell's result file if it holds another
    experiment, whatever wrote it; or, if ``ciosl run`` wrote it (its runs are nowhere else),
    finished runs of seeds the grid does not run."""
    path = result_file(out, info.cell)
    old = read_json(path)
    seeds = None if isinstance(old, dict) and "sweep" in old else grid.seeds
    check_overwrite(path, result_header(info.exp, info.spec, info.cls, info.settings, info.fs,
                                        info.offline),
                    force=force, seeds=seeds, what="output folder (--out)")


def write_result(grid: Grid, out: Path, info: CellInfo, force: bool = False) -> dict:
    """The cell's result JSON from its run files (all seeds must be there)."""
    saved = [_finished(out, info, s) for s in grid.seeds]
    missing = [s for s, x in zip(grid.seeds, saved, strict=True) if x is None]
    if missing:
        raise RuntimeError(f"cell {info.cell.id}: no finished run for seed(s) {missing}")
    result = aggregate(info.exp, info.spec, info.cls, info.settings, info.fs, info.offline,
                       [x["run"] for x in saved],
                       wall_seconds=float(sum(x["wall_seconds"] for x in saved)))
    result["sweep"] = {"grid": grid.name, "cell": info.cell.id, "variant": info.cell.variant,
                       "set": dict(info.cell.settings), "regime": info.cell.regime,
                       "fingerprint": info.fingerprint}
    path = result_file(out, info.cell)
    result["path"] = str(path)
    check_cell_file(grid, out, info, force)  # again: a `ciosl run` may have written there
    atomic_write_json(path, result)
    return result
