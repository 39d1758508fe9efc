"""An experiment: one (dataset, ordering, method) cell over several seeds, written as one JSON.

Everything is validated before any work starts; the JSON is written atomically at the end, so a
failed or interrupted experiment leaves nothing half-written.
"""

from __future__ import annotations

import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import ciosl
from ciosl.data.orderings import check_kind, limit_per_class, make_ordering
from ciosl.data.types import DatasetSpec, FeatureSet
from ciosl.evaluation.metrics import mean_std, omega_all
from ciosl.evaluation.protocol import OfflineSettings, offline_accuracy, run_stream, subset_train
from ciosl.fileio import atomic_write_json
from ciosl.learners.base import Learner, get_method, parse_value


@dataclass
class ExperimentSpec:
    """What ``ciosl run`` asks for, before validation."""

    dataset: str
    ordering: str
    method: str
    seeds: Sequence[int] = (0, 1, 2)
    extractor: str | None = None
    weights: str | None = None
    buffer: int | None = None
    settings: dict[str, str] = field(default_factory=dict)  # --set name=value (strings)
    limit_per_class: int | None = None
    offline_epochs: int | None = None
    out_dir: str | Path | None = None
    cache_dir: str | Path | None = None
    data_root: str | Path | None = None


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """``["lr=0.1", "selection=uapn"]`` -> dict, with a clear error on a malformed item."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set expects name=value, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def resolve_settings(cls: type[Learner], spec: DatasetSpec, ordering: str,
                     buffer: int | None, overrides: dict[str, str]) -> dict[str, Any]:
    """The learner's settings for this cell: defaults, the dataset's buffer, the protocol's
    defaults (``cls.protocol_defaults(ordering=..., spec=DatasetSpec)``, optional), then the
    user's values, each checked."""
    known = {s.name: s for s in cls.settings() if s.name != "seed"}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(
            f"unknown setting(s) {', '.join(unknown)} for method {cls.name!r}; valid settings: "
            f"{', '.join(sorted(known)) or '(none)'}"
        )
    settings: dict[str, Any] = {}
    if "buffer" in known:
        settings["buffer"] = spec.buffer if buffer is None else buffer
    elif buffer is not None:
        raise ValueError(f"method {cls.name!r} has no replay buffer; --buffer does not apply")
    defaults = getattr(cls, "protocol_defaults", None)
    if defaults is not None:
        settings.update(defaults(ordering=ordering, spec=spec))
    for name, text in overrides.items():
        settings[name] = parse_value(known[name], text)
    cls(**settings)  # validates choices and ranges now, before any work
    return settings


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def result_path(out_dir: str | Path, dataset: str, ordering: str, method: str) -> Path:
    if dataset.startswith("features:"):
        dataset = "features-" + Path(dataset.split(":", 1)[1]).stem
    return Path(out_dir) / f"{_safe(dataset)}_{ordering}_{_safe(method)}.json"


def validate(exp: ExperimentSpec) -> tuple[DatasetSpec, type[Learner], dict[str, Any]]:
    from ciosl.data.datasets import get_spec
    from ciosl.data.features import EXTRACTORS

    spec = get_spec(exp.dataset)
    check_kind(exp.ordering)
    if exp.ordering not in spec.orderings:
        raise ValueError(
            f"dataset {exp.dataset!r} does not support the {exp.ordering!r} ordering; valid "
            f"choices: {', '.join(spec.orderings)}"
        )
    if exp.extractor is not None and exp.extractor not in EXTRACTORS:
        raise ValueError(
            f"unknown extractor {exp.extractor!r}; valid choices: {', '.join(EXTRACTORS)}"
        )
    if not exp.seeds:
        raise ValueError("no runs requested")
    if exp.limit_per_class is not None and exp.limit_per_class < 1:
        raise ValueError(f"--limit-per-class must be >= 1, got {exp.limit_per_class}")
    cls = get_method(exp.method)
    settings = resolve_settings(cls, spec, exp.ordering, exp.buffer, exp.settings)
    return spec, cls, settings


def load_features(exp: ExperimentSpec, spec: DatasetSpec) -> FeatureSet:
    from ciosl.data.features import get_features

    cache = Path(exp.cache_dir) / "features" if exp.cache_dir else None
    fs = get_features(exp.dataset, exp.extractor, weights=exp.weights, cache_dir=cache,
                      root=exp.data_root)
    if exp.limit_per_class is not None:
        fs = subset_train(fs, limit_per_class(fs.train_y, exp.limit_per_class,
                                              instances=fs.train_instance, frames=fs.train_frame))
    return fs


def run_experiment(exp: ExperimentSpec, *,
                   on_start: Callable[[int], None] | None = None,
                   on_progress: Callable[[int], None] | None = None,
                   on_run: Callable[[dict], None] | None = None) -> dict:
    """Run every seed of one cell; returns (and writes, if ``out_dir``) the result dict.

    ``on_start(total_samples)`` once the work is known, ``on_progress(n)`` as samples are
    learned, ``on_run(run)`` after each seed.
    """
    spec, cls, settings = validate(exp)
    fs = load_features(exp, spec)
    offline = OfflineSettings(
        epochs=exp.offline_epochs or spec.offline_epochs, batch_size=spec.offline_batch_size)
    cache_dir = Path(exp.cache_dir) if exp.cache_dir else None
    orderings = [
        make_ordering(exp.ordering, fs.train_y, seed=s, base_fraction=spec.base_fraction,
                      classes_per_step=spec.classes_per_step, instances=fs.train_instance,
                      frames=fs.train_frame)
        for s in exp.seeds
    ]
    if on_start is not None:
        on_start(sum(len(o.stream) for o in orderings))
    started = time.time()
    runs = []
    for ordering in orderings:
        learner = cls(**settings, seed=ordering.seed)
        run = run_stream(learner, fs, ordering, progress=on_progress)
        run["accuracy_offline"] = [offline_accuracy(fs, ordering, t, offline, cache_dir)
                                   for t in range(len(ordering.events))]
        run["omega_all"] = omega_all(run["accuracy"], run["accuracy_offline"])
        runs.append(run)
        if on_run is not None:
            on_run(run)
    omega_mean, omega_std = mean_std([r["omega_all"] for r in runs])
    final_mean, final_std = mean_std([r["accuracy"][-1] for r in runs])
    result = {
        "dataset": exp.dataset,
        "ordering": exp.ordering,
        "method": cls.name,
        "violates_single_pass": cls.violates_single_pass,
        "extractor": fs.extractor,
        "features_key": fs.key,
        "feature_dim": fs.dim,
        "n_train": int(len(fs.train_y)),
        "n_test": int(len(fs.test_y)),
        "limit_per_class": exp.limit_per_class,
        "settings": {**settings, "seed": "per run"},
        "protocol": {"base_fraction": spec.base_fraction,
                     "classes_per_step": spec.classes_per_step,
                     "offline": offline.__dict__},
        "seeds": [int(s) for s in exp.seeds],
        "runs": runs,
        "omega_all": {"mean": omega_mean, "std": omega_std},
        "final_accuracy": {"mean": final_mean, "std": final_std},
        "samples_per_second": float(np.mean([r["samples_per_second"] for r in runs])),
        "predict_seconds": float(np.mean([r["predict_seconds"] for r in runs])),
        "peak_memory_bytes": int(max(r["peak_memory_bytes"] for r in runs)),
        "wall_seconds": time.time() - started,
        "versions": {"ciosl": ciosl.__version__, "python": platform.python_version(),
                     "numpy": np.__version__, "torch": __import__("torch").__version__},
    }
    if exp.out_dir is not None:
        result["path"] = str(result_path(exp.out_dir, exp.dataset, exp.ordering, cls.name))
        atomic_write_json(result["path"], result)
    return result
