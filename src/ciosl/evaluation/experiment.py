"""An experiment: one (dataset, ordering, method) cell over several seeds, written as one JSON.

Everything is validated (the output folder's writability included) before any work starts; each
finished run is saved at once in the experiment's checkpoint (``--resume`` picks them up after a
failure or an interruption), and the JSON is written atomically at the end, so a failed or
interrupted experiment leaves nothing half-written and loses no finished run. The result file is
named by everything that changes its numbers and differs from the protocol's defaults (dataset,
extractor, ordering, method, ``--set`` settings and ``--buffer``, ``--limit-per-class``,
``--offline-epochs``, ``--weights``, regime and its options), and a result of another experiment
already at that name is never replaced without ``force``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import ciosl
from ciosl.data.orderings import Ordering, check_kind, limit_per_class, make_ordering
from ciosl.data.runtime import resolve_device
from ciosl.data.types import DatasetSpec, FeatureSet
from ciosl.errors import echo, is_out_of_memory, out_of_memory, shown
from ciosl.evaluation.checkpoint import (
    checkpoint_path,
    identity,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from ciosl.evaluation.metrics import (
    check_omega_events,
    continual_metrics,
    mean_matrix,
    mean_std,
    omega_all,
    summary,
)
from ciosl.evaluation.protocol import (
    OfflineSettings,
    Regime,
    offline_accuracy,
    run_stream,
    subset_train,
)
from ciosl.fileio import (
    MAX_TEXT_BYTES,
    ClaimedError,
    atomic_write_json,
    check_regular,
    check_writable,
    claim,
    dangling_text,
    load_json,
    read_bytes,
)
from ciosl.learners.base import Learner, available_methods, get_method, parse_value


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
    checkpoint_every: int = 0  # samples between checkpoints (0: none); needs out_dir
    regime: str = "streaming"  # streaming | online | batch (evaluation.protocol.Regime)
    batch_size: int = 10  # mini-batch size of the online and batch regimes
    epochs: int = 5  # epochs per task of the batch regime
    resume: bool = False  # continue from the checkpoint next to the result JSON, if any
    omega_events: str = "after_base"  # Omega_all over the events after base init, or "all"
    force: bool = False  # replace a result of another experiment at the same file name
    device: str | None = None  # auto | cpu | cuda (None: $CIOSL_DEVICE, else auto): extraction
    # and the offline reference (ciosl.data.runtime.resolve_device)
    max_events: int | None = None  # at most this many testing events, evenly spaced (None: all)
    offline_reference: bool = True  # False: no offline reference, hence no Omega_all


MAX_RUNS = 10_000  # runs per cell: far beyond any protocol, and a bound on what is allocated
# Upper bounds of the numeric options: far beyond any protocol, and low enough that no value
# runs for ever, overflows an integer type or asks the allocator for the impossible.
MAX_SEED = 2**31 - 1
MAX_EPOCHS = 1_000  # --offline-epochs, --epochs
MAX_BATCH_SIZE = 100_000  # --batch-size
MAX_BUFFER = 1_000_000  # --buffer: samples a replay memory may hold
MAX_LIMIT_PER_CLASS = 10_000_000  # --limit-per-class
MAX_CHECKPOINT_EVERY = 1_000_000_000  # --checkpoint-every (samples)
MAX_EVENTS = 1_000_000  # --max-events


def check_range(value: int | None, flag: str, low: int | None, high: int,
                why: str = "") -> None:
    """``low <= value <= high`` (None: not given; ``low`` None: checked elsewhere), else one
    line naming ``flag``."""
    if value is None:
        return
    if low is not None and value < low:
        raise ValueError(f"{flag} must be >= {low}, got {value}")
    if value > high:
        raise ValueError(f"{flag} must be <= {high}{why}, got {value}")


def max_threads() -> int:
    """``--threads`` at most 4 per CPU of this machine (and at most 1024)."""
    return min(1024, 4 * (os.cpu_count() or 1))


def check_seeds(seeds: Sequence[int], flag: str = "--seeds") -> list[int]:
    """Distinct integers >= 0: a repeated seed repeats the same run and fakes a std of 0."""
    if len(seeds) > MAX_RUNS:
        raise ValueError(f"{flag}: at most {MAX_RUNS} runs per cell, got {len(seeds)}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError(f"{flag}: no runs requested")
    bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 0]
    if bad:
        raise ValueError(f"{flag} expects integers >= 0, got {echo(bad[0])}")
    big = [s for s in seeds if s > MAX_SEED]
    if big:
        raise ValueError(f"{flag}: a seed must be <= {MAX_SEED}, got {big[0]}")
    twice = sorted({int(s) for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ValueError(f"{flag} lists seed {twice[0]} more than once (a repeated seed repeats "
                         "the same run and shrinks the std)")
    return [int(s) for s in seeds]


def choose_seeds(runs: int | None, seeds: Sequence[int] | None,
                 default: int | None = 3) -> list[int] | None:
    """The seeds of ``--runs N`` (0..N-1) or ``--seeds``, checked; ``default`` runs (or None)
    when neither is given."""
    if runs is not None:
        if runs < 1:
            raise ValueError(f"--runs must be >= 1, got {runs}")
        if runs > MAX_RUNS:
            raise ValueError(f"--runs: at most {MAX_RUNS} runs per cell, got {runs}")
        return list(range(runs))
    if seeds is not None:
        return check_seeds(seeds)
    return None if default is None else list(range(default))


def set_threads(threads: int) -> None:
    """``--threads``: torch's intra-op threads (1 to ``max_threads()``)."""
    check_range(threads, "--threads", 1, max_threads(),
                " (4 per CPU here, at most 1024)")
    import torch

    torch.set_num_threads(threads)


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """``["lr=0.1", "selection=uapn"]`` -> dict, with a clear error on a malformed item."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set expects name=value, got {echo(item)}")
        out[name.strip()] = value.strip()
    return out


def resolve_settings(cls: type[Learner], spec: DatasetSpec, ordering: str,
                     buffer: int | None, overrides: dict[str, str]) -> dict[str, Any]:
    """The learner's settings for this cell: defaults, the dataset's buffer, the protocol's
    defaults (``cls.protocol_defaults(ordering=..., spec=DatasetSpec)``: the dataset's base-init
    recipe for every method with ``base_epochs`` / ``base_batch_size``, plus the method's own),
    then the user's values, each checked."""
    known = {s.name: s for s in cls.settings() if s.name != "seed"}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(
            f"unknown setting(s) {shown(', '.join(unknown))} for method {cls.name!r}; valid settings: "
            f"{', '.join(sorted(known)) or '(none)'}"
        )
    if buffer is not None and "buffer" in overrides:
        raise ValueError(f"--buffer {buffer} and --set buffer={overrides['buffer']} both set the "
                         "replay buffer: give one of them")
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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def exact_slug(name: str) -> str:
    """``name`` made file-name safe, injectively: a name the slug would change (``a/b``,
    ``a b``, ``a-b`` would all be ``a-b``) gets a hash of the exact name appended."""
    safe = _safe(name)
    return safe if safe == name and safe else f"{safe}-{_digest(name)}" if safe else _digest(name)


def setting_text(value: Any) -> str:
    """A setting's value as it appears in variant names (as ``grid`` writes TOML values)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    if value is None:
        return "none"
    return repr(value) if isinstance(value, float) else str(value)


def _slug_text(value: Any) -> str:
    """``setting_text`` with a list's commas as dashes (the names results always had)."""
    if isinstance(value, tuple | list):
        return "-".join(str(v) for v in value)
    return setting_text(value)


def slug_items(items: Sequence[tuple[str, str]], sep: str = "-") -> str:
    """``[("lr", "0.1"), ("tag", "a b")]`` -> ``lr-0.1+tag-a-b-<hash>``: the items in this
    order, file-name safe; a hash of the exact items is appended when making them safe lost a
    character (so ``tag=a/b``, ``tag=a-b`` and ``tag=a b`` never share a name), and long ones
    are cut and end in a hash."""
    raw = [f"{n}{sep}{t}" for n, t in items]
    parts = [_safe(r) if sep == "-" else sep.join(_safe(x) for x in r.split(sep, 1))
             for r in raw]
    slug = "+".join(parts)
    lossy = any(p != r for p, r in zip(parts, raw, strict=True))
    exact = json.dumps([list(i) for i in items]) if lossy else slug
    if len(slug) > 80:
        slug = f"{slug[:60]}-{_digest(exact)}"
    elif lossy:
        slug = f"{slug}-{_digest(exact)}"
    return slug


def variant_slug(settings: dict[str, Any]) -> str:
    """``{"lr": 0.1, "selection": "lapn"}`` -> ``lr-0.1+selection-lapn`` (sorted, file-name
    safe and injective, see ``slug_items``): the variant part of a result file name, as sweeps
    name the cells of a ``[grid.METHOD]`` table."""
    return slug_items([(n, _slug_text(v)) for n, v in sorted(settings.items())])


def dataset_slug(dataset: str) -> str:
    """A dataset name for file names: ``features:PATH`` becomes ``features-<stem>-<hash of the
    absolute path>``, so two feature files with the same name never share a result file."""
    if not dataset.startswith("features:"):
        return exact_slug(dataset)
    path = Path(dataset.split(":", 1)[1]).expanduser()
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"features-{_safe(path.stem)}-{digest}"


MAX_STEM_BYTES = 200  # + ".ckpt" and a temporary's ".NAME.XXXXXXXX.tmp": within 255 bytes


def fit_name(stem: str) -> str:
    """``stem`` as a file name's stem that every file system here holds (255 bytes with the
    suffixes and temporaries added): a longer one (long variant names, setting values or file
    names) keeps its first bytes and gets a hash of the whole, so two never collide."""
    raw = stem.encode()
    if len(raw) <= MAX_STEM_BYTES:
        return stem
    head = raw[:MAX_STEM_BYTES - 13].decode("utf-8", errors="ignore")
    return f"{head}-{hashlib.sha256(raw).hexdigest()[:12]}"


def result_path(out_dir: str | Path, dataset: str, ordering: str, method: str,
                regime: str = "streaming", variant: str = "", extractor: str = "",
                protocol: str = "") -> Path:
    """``<dataset>[-<extractor>]_<ordering>_<method>[_<variant>][_<protocol>][_<regime>].json``
    (no regime suffix for streaming; ``variant``: ``variant_slug`` of the settings, empty for
    none; ``extractor``: empty for the dataset's default one, so that runs of one stream through
    two extractors never overwrite each other; ``protocol``: ``protocol_slug``, empty for the
    dataset's protocol)."""
    suffix = "" if regime == "streaming" else f"_{regime}"
    middle = f"_{variant}" if variant else ""
    middle += f"_{protocol}" if protocol else ""
    name = dataset_slug(dataset) + (f"-{_safe(extractor)}" if extractor else "")
    stem = f"{name}_{ordering}_{exact_slug(method)}{middle}{suffix}"
    return Path(out_dir) / f"{fit_name(stem)}.json"


def protocol_slug(exp: ExperimentSpec, spec: DatasetSpec) -> str:
    """The protocol options of ``exp`` that differ from the dataset's defaults, as
    ``limit_per_class=60+offline_epochs=3`` (``=``, never in a variant slug, keeps the two
    apart): ``--limit-per-class``, ``--offline-epochs``, ``--weights`` (a hash of the file's
    path), and the regime's ``--batch-size`` / ``--epochs`` where the regime uses them."""
    items: list[tuple[str, str]] = []
    if exp.limit_per_class is not None:
        items.append(("limit_per_class", str(exp.limit_per_class)))
    if exp.offline_epochs is not None and exp.offline_epochs != spec.offline_epochs:
        items.append(("offline_epochs", str(exp.offline_epochs)))
    default = Regime()
    if exp.regime in ("online", "batch") and exp.batch_size != default.batch_size:
        items.append(("batch_size", str(exp.batch_size)))
    if exp.regime == "batch" and exp.epochs != default.epochs:
        items.append(("epochs", str(exp.epochs)))
    if exp.max_events is not None:
        items.append(("max_events", str(exp.max_events)))
    if not exp.offline_reference:
        items.append(("offline", "none"))
    if exp.weights is not None:
        weights = Path(exp.weights).expanduser()
        items.append(("weights", f"{_safe(weights.stem)}-{_digest(str(weights.resolve()))}"))
    return slug_items(items, sep="=")


def name_settings(exp: ExperimentSpec, cls: type[Learner], spec: DatasetSpec) -> dict[str, Any]:
    """The settings a result's name shows: the ``--set`` ones, typed, and ``--buffer`` when it
    is not the dataset's (named like ``--set buffer=N``, which it equals)."""
    known = {s.name: s for s in cls.settings()}
    typed = {n: parse_value(known[n], t) for n, t in exp.settings.items()}
    if exp.buffer is not None and "buffer" not in typed and exp.buffer != spec.buffer:
        typed["buffer"] = exp.buffer
    return typed


def experiment_path(exp: ExperimentSpec, cls: type[Learner]) -> Path:
    """The result JSON of ``exp`` (which has an output folder): named by its settings and
    protocol options too, so a variant never overwrites the default's result."""
    from ciosl.data.datasets import get_spec

    spec = get_spec(exp.dataset)
    extractor = exp.extractor or ""
    if extractor and extractor == spec.default_extractor:
        extractor = ""
    return result_path(exp.out_dir, exp.dataset, exp.ordering, cls.name, exp.regime,
                       variant_slug(name_settings(exp, cls, spec)), extractor,
                       protocol_slug(exp, spec))


def regime_of(exp: ExperimentSpec) -> Regime:
    return Regime(exp.regime, batch_size=exp.batch_size, epochs=exp.epochs)


def validate(exp: ExperimentSpec) -> tuple[DatasetSpec, type[Learner], dict[str, Any]]:
    from ciosl.data.datasets import get_spec
    from ciosl.data.features import parse_extractor

    spec = get_spec(exp.dataset)
    check_kind(exp.ordering)
    if exp.ordering not in spec.orderings:
        raise ValueError(
            f"dataset {echo(exp.dataset)} does not support the {exp.ordering!r} ordering; valid "
            f"choices: {', '.join(spec.orderings)}"
        )
    if exp.extractor is not None:
        parse_extractor(exp.extractor)
    resolve_device(exp.device)  # an unknown or absent device is named before any work
    if exp.weights is not None:
        from ciosl.data.mobilenet import MAX_WEIGHTS_BYTES
        check_regular(Path(exp.weights).expanduser(), "--weights", limit=MAX_WEIGHTS_BYTES)
    check_seeds(exp.seeds, "seeds")
    check_range(exp.offline_epochs, "--offline-epochs", 1, MAX_EPOCHS)
    check_range(exp.checkpoint_every, "--checkpoint-every", 0, MAX_CHECKPOINT_EVERY)
    if (exp.checkpoint_every or exp.resume) and exp.out_dir is None:
        raise ValueError("checkpoints live next to the result JSON: --checkpoint-every and "
                         "--resume need an output folder")
    check_omega_events(exp.omega_events)
    check_range(exp.max_events, "--max-events", 2, MAX_EVENTS)  # base init and the end
    if not isinstance(exp.offline_reference, bool):
        raise ValueError(f"offline_reference must be true or false, got "
                         f"{echo(exp.offline_reference)}")
    if not exp.offline_reference and exp.offline_epochs is not None:
        raise ValueError(f"--offline-epochs {exp.offline_epochs} and --no-offline: without an "
                         "offline reference there are no offline epochs; give one of them")
    check_range(exp.limit_per_class, "--limit-per-class", 1, MAX_LIMIT_PER_CLASS)
    # lower bounds: the learner's (--buffer) and the regime's (--batch-size, --epochs)
    check_range(exp.buffer, "--buffer", None, MAX_BUFFER)
    check_range(exp.batch_size, "--batch-size", None, MAX_BATCH_SIZE)
    check_range(exp.epochs, "--epochs", None, MAX_EPOCHS)
    cls = get_method(exp.method)
    regime = regime_of(exp)
    if regime.name not in cls.regimes:
        raise ValueError(
            f"method {cls.name!r} does not support the {regime.name} regime"
            f"{' (' + cls.regime_note + ')' if cls.regime_note else ''}; valid regimes for it: "
            f"{', '.join(cls.regimes)}")
    settings = resolve_settings(cls, spec, exp.ordering, exp.buffer, exp.settings)
    return spec, cls, settings


def load_features(exp: ExperimentSpec, spec: DatasetSpec) -> FeatureSet:
    from ciosl.data.features import get_features

    cache = Path(exp.cache_dir) / "features" if exp.cache_dir else None
    fs = get_features(exp.dataset, exp.extractor, weights=exp.weights, cache_dir=cache,
                      root=exp.data_root, device=exp.device)
    if exp.limit_per_class is not None:
        fs = subset_train(fs, limit_per_class(fs.train_y, exp.limit_per_class,
                                              instances=fs.train_instance, frames=fs.train_frame))
    return fs


def offline_settings(exp: ExperimentSpec, spec: DatasetSpec) -> OfflineSettings:
    return OfflineSettings(
        epochs=spec.offline_epochs if exp.offline_epochs is None else exp.offline_epochs,
        batch_size=spec.offline_batch_size)


def stream_ordering(exp: ExperimentSpec, spec: DatasetSpec, fs: FeatureSet, seed: int) -> Ordering:
    """The base-init indices, stream and testing events of one run."""
    return make_ordering(exp.ordering, fs.train_y, seed=seed, base_fraction=spec.base_fraction,
                         classes_per_step=spec.classes_per_step, instances=fs.train_instance,
                         frames=fs.train_frame, max_events=exp.max_events)


def offline_curve(fs: FeatureSet, ordering: Ordering, offline: OfflineSettings,
                  cache_dir: Path | None, device: str | None = None) -> list[float]:
    """The offline reference accuracy at every testing event of ``ordering`` (cached), trained
    on ``device`` (``resolve_device``: None reads $CIOSL_DEVICE, else auto)."""
    device = resolve_device(device)
    return [offline_accuracy(fs, ordering, t, offline, cache_dir, device)
            for t in range(len(ordering.events))]


def check_reference(reference: Sequence[float], ordering: Ordering, events: str) -> None:
    """Omega_all divides by the offline accuracy of each event it counts: refuse a run whose
    offline reference scores 0 at one of them (a test split the training data cannot predict),
    naming the event, before any streaming work."""
    first = 1 if events == "after_base" else 0
    for t, acc in enumerate(reference):
        if t >= first and not acc > 0:
            raise ValueError(
                f"the offline reference scores {acc:.0%} at testing event {t} (stream position "
                f"{int(ordering.events[t])}) of seed {ordering.seed}: Omega_all "
                f"(accuracy / offline accuracy) is undefined on this data (the offline learner gets none of "
                f"that event's test samples right)")


def run_seed(exp: ExperimentSpec, cls: type[Learner], settings: dict[str, Any], fs: FeatureSet,
             ordering: Ordering, offline: OfflineSettings, cache_dir: Path | None,
             reference: Sequence[float] | None = None, **stream: Any) -> dict:
    """One run of a cell: a fresh learner through ``run_stream(..., **stream)``, then its
    offline reference and Omega_all. Shared by ``run_experiment`` and ``ciosl sweep``.
    ``accuracy`` / ``accuracy_offline`` hold every testing event, the base event (index 0)
    included; ``omega_all`` averages the events ``exp.omega_events`` names."""
    if not exp.offline_reference:  # --no-offline: accuracies only, no Omega_all
        reference = None
    elif reference is None:  # cached: shared by every method
        reference = offline_curve(fs, ordering, offline, cache_dir, exp.device)
    elif len(reference) != len(ordering.events):
        raise ValueError(f"an offline reference of {len(reference)} events for a stream of "
                         f"{len(ordering.events)}")
    if reference is not None:
        reference = [float(x) for x in reference]
        check_reference(reference, ordering, exp.omega_events)  # before the stream, not after
    learner = cls(**settings, seed=ordering.seed)
    if hasattr(cls, "device"):  # trains like the reference, where the reference trains
        learner.device = resolve_device(exp.device)
    try:
        run = run_stream(learner, fs, ordering, regime=regime_of(exp), **stream)
    except (MemoryError, RuntimeError) as e:  # name the method and what sized its memory
        if not is_out_of_memory(e):
            raise
        default = {st.name: st.default for st in cls.settings()}
        changed = {k: v for k, v in settings.items() if k in default and v != default[k]}
        shown = ", ".join(f"{k}={v}" for k, v in changed.items()) or "its defaults"
        raise MemoryError(out_of_memory(e, f" in method {cls.name!r} ({shown})")) from None
    if reference is None:
        run["omega_all"] = None  # no reference: the accuracies alone (see no_reference)
        return run
    run["accuracy_offline"] = reference
    run["omega_all"] = omega_all(run["accuracy"], run["accuracy_offline"],
                                 events=exp.omega_events)
    run["omega_events"] = exp.omega_events
    return run


def no_reference(result: dict) -> bool:
    """Whether a result (or ``result_header``) was run without the offline reference
    (``--no-offline``): it has accuracies but no ``accuracy_offline`` and no Omega_all."""
    protocol = result.get("protocol")
    return isinstance(protocol, dict) and protocol.get("offline_reference") is False


def method_source(cls: type[Learner]) -> dict[str, str] | None:
    """For a learner defined outside ciosl (``--method module:Class``, an entry point): its
    class path and the sha256 of its module's source, so that two different learners sharing a
    ``name``, or one whose code changed, are different experiments. None for ciosl's own
    (their code is ciosl's version)."""
    if cls.__module__ == "ciosl" or cls.__module__.startswith("ciosl."):
        return None
    import inspect
    out = {"class": f"{cls.__module__}:{cls.__qualname__}"}
    try:
        source = inspect.getsourcefile(cls)
        out["sha256"] = hashlib.sha256(read_bytes(source, "learner source",
                                                  limit=MAX_TEXT_BYTES)).hexdigest()
    except (TypeError, OSError, ValueError):  # no source file (built in a session): class only
        pass
    return out


def result_header(exp: ExperimentSpec, spec: DatasetSpec, cls: type[Learner],
                  settings: dict[str, Any], fs: FeatureSet, offline: OfflineSettings) -> dict:
    """The first fields of a result JSON: what the experiment is (``identity_of`` picks the
    ones that tell two experiments apart). ``fs`` may hold metadata only."""
    every = {s.name: s.default for s in cls.settings() if s.name != "seed"}
    source = method_source(cls)
    return {
        "dataset": exp.dataset,
        "ordering": exp.ordering,
        "method": cls.name,
        **({"method_source": source} if source else {}),
        "violates_single_pass": cls.violates_single_pass or exp.regime == "batch",
        "regime": regime_of(exp).__dict__,
        "extractor": fs.extractor,
        "features_key": fs.key,
        "feature_dim": fs.dim,
        "n_train": int(len(fs.train_y)),
        "n_test": int(len(fs.test_y)),
        "class_names": [str(c) for c in fs.class_names],  # label k's name (per-class keys)
        "limit_per_class": exp.limit_per_class,
        "settings": {**every, **settings, "seed": "per run"},
        "protocol": {"base_fraction": spec.base_fraction,
                     "classes_per_step": spec.classes_per_step,
                     "offline": offline.__dict__,  # non-default options only (old results)
                     **({"max_events": exp.max_events} if exp.max_events is not None else {}),
                     **({"offline_reference": False} if not exp.offline_reference else {})},
    }


IDENTITY = ("dataset", "ordering", "method", "method_source", "regime", "extractor",
            "limit_per_class", "settings", "protocol", "features_key")


def identity_of(result: dict) -> dict:
    """The fields of a result (or ``result_header``) that make it the experiment it is, as
    JSON reads them back: two results with different ones are different experiments. The
    seeds and the Omega_all definition are not among them (a rerun with more seeds extends an
    experiment; Omega_all is recomputed from the per-event accuracies); the regime's batch
    size and epochs count only where the regime uses them. Fields a result lacks are left out
    (a result of an older ciosl)."""
    out = {k: result[k] for k in IDENTITY if k in result}
    regime = result.get("regime")
    if "regime" in result:
        regime = regime if isinstance(regime, dict) else {"name": regime}
        name = regime.get("name") or "streaming"
        out["regime"] = {"name": name,
                         **({"batch_size": regime.get("batch_size")}
                            if name in ("online", "batch") else {}),
                         **({"epochs": regime.get("epochs")} if name == "batch" else {})}
    if isinstance(out.get("settings"), dict):
        out["settings"] = {k: v for k, v in out["settings"].items() if k != "seed"}
    return json.loads(json.dumps(out, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def differences(old: dict, new: dict) -> list[str]:
    """``field: OLD there, NEW here`` for each identity field (one level into tables) that
    ``old`` records and ``new`` has otherwise."""
    a, b = identity_of(old), identity_of(new)
    if isinstance(a.get("settings"), dict) and isinstance(b.get("settings"), dict):
        # a setting added after ``old`` was written: it ran at the method's recorded old value
        cls = available_methods().get(a.get("method")) if isinstance(a.get("method"),
                                                                      str) else None
        for k, v in getattr(cls, "added_settings", {}).items():
            if k in b["settings"] and k not in a["settings"]:
                a["settings"][k] = json.loads(json.dumps(v, default=str))
    out = []
    for key in IDENTITY:
        if key not in a or a[key] == b.get(key):
            continue
        x, y = a[key], b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{key}.{k}: {_short(x.get(k, '(absent)'))} there, "
                    f"{_short(y.get(k, '(absent)'))} here"
                    for k in sorted(set(x) | set(y), key=str) if x.get(k, ...) != y.get(k, ...)]
        else:
            out.append(f"{key}: {_short(x)} there, {_short(y)} here")
    return out


def check_overwrite(path: str | Path, new: dict, *, force: bool = False,
                    seeds: Sequence[int] | None = None, what: str = "--out") -> None:
    """Refuse to replace ``path`` unless it holds the same experiment as ``new`` (a result or
    ``result_header``; see ``identity_of``), whatever wrote it, or ``force``. With ``seeds``
    (``ciosl run``): also refuse to drop finished runs of the same experiment, seeds the file
    holds and the new result does not."""
    if force:
        return
    problem = overwrite_problem(path, new, seeds)
    if problem is None:
        return
    text, dropped = problem
    if dropped:
        raise ValueError(f"{text}: refused to drop them; give --seeds including them, or "
                         "--force replaces it")
    raise ValueError(f"{text}: refused to replace it; --force replaces it, or choose another "
                     f"{what}")


def overwrite_problem(path: str | Path, new: dict, seeds: Sequence[int] | None = None
                      ) -> tuple[str, bool] | None:
    """Why ``path`` may not be replaced by ``new`` (``check_overwrite``), and whether it is
    that finished runs would be dropped; None if it may."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    try:
        old = load_json(path, "result")
    except (OSError, ValueError) as e:
        return (str(e) if isinstance(e, ValueError) else message_of(e)), False
    if not isinstance(old, dict) or not all(isinstance(old.get(k), str)
                                            for k in ("dataset", "ordering", "method")):
        return f"{path} holds no ciosl result", False
    diff = differences(old, new)
    if diff:
        more = f"; and {len(diff) - 1} more" if len(diff) > 1 else ""
        return f"{path} holds another experiment ({diff[0]}{more})", False
    held = old.get("seeds")
    if seeds is not None and isinstance(held, list):
        lost = sorted({s for s in held if isinstance(s, int)} - {int(s) for s in seeds})
        if lost:
            shown = ",".join(map(str, lost[:10])) + ("..." if len(lost) > 10 else "")
            return (f"{path} holds finished runs of this experiment that this one does not "
                    f"repeat (seeds {shown})"), True
    return None


def message_of(e: OSError) -> str:
    return f"{e.filename}: {e.strerror}" if e.strerror and e.filename else str(e)


def aggregate(exp: ExperimentSpec, spec: DatasetSpec, cls: type[Learner],
              settings: dict[str, Any], fs: FeatureSet, offline: OfflineSettings,
              runs: list[dict], *, wall_seconds: float) -> dict:
    """The result JSON of a cell from its runs (in ``exp.seeds`` order), without ``path``.

    Each run's Omega_all is (re)computed from its per-event accuracies with
    ``exp.omega_events`` (a run file of an older sweep may hold the other definition);
    ``omega_all.events`` names the definition. ``settings`` holds every setting of the
    method, its defaults included, so a report never has to guess what a run used."""
    ref = exp.offline_reference
    runs = [{**r, **({"omega_all": omega_all(r["accuracy"], r["accuracy_offline"],
                                             events=exp.omega_events),
                      "omega_events": exp.omega_events} if ref else {"omega_all": None}),
             **continual_metrics(r.get("class_counts"), r.get("matrix_columns"))} for r in runs]
    omega = None  # --no-offline: no Omega_all, said as such (never a number)
    if ref:
        omega_mean, omega_std = mean_std([r["omega_all"] for r in runs])
        omega = {"mean": omega_mean, "std": omega_std, "events": exp.omega_events}
    final_mean, final_std = mean_std([r["accuracy"][-1] for r in runs])
    result = {
        **result_header(exp, spec, cls, settings, fs, offline),
        "seeds": [int(s) for s in exp.seeds],
        "runs": runs,
        "omega_all": omega,
        "final_accuracy": {"mean": final_mean, "std": final_std},
        # continual-learning metrics (None when a run was recorded without per-class counts)
        "forgetting": summary([r["forgetting"] for r in runs]),
        "backward_transfer": summary([r["backward_transfer"] for r in runs]),
        "accuracy_matrix": mean_matrix([r["accuracy_matrix"] for r in runs]),
        "samples_per_second": float(np.mean([r["samples_per_second"] for r in runs])),
        "predict_seconds": float(np.mean([r["predict_seconds"] for r in runs])),
        "peak_memory_bytes": int(max(r["peak_memory_bytes"] for r in runs)),
        "wall_seconds": wall_seconds,
        "versions": {"ciosl": ciosl.__version__, "python": platform.python_version(),
                     "numpy": np.__version__, "torch": __import__("torch").__version__},
    }
    return result


def run_experiment(exp: ExperimentSpec, *,
                   on_start: Callable[[int], None] | None = None,
                   on_progress: Callable[[int], None] | None = None,
                   on_run: Callable[[dict], None] | None = None,
                   on_resume: Callable[[int, int], None] | None = None) -> dict:
    """Run every seed of one cell; returns (and writes, if ``out_dir``) the result dict.

    ``on_start(total_samples)`` once the work is known, ``on_progress(n)`` as samples are
    learned, ``on_run(run)`` after each seed, ``on_resume(runs_done, position)`` when a
    checkpoint is picked up (``position``: streamed samples of the run in progress).
    """
    spec, cls, settings = validate(exp)
    if exp.out_dir is not None:
        check_writable(exp.out_dir)  # before any work, not after hours of it
        check_names(experiment_path(exp, cls))
    if exp.cache_dir:  # a cache that is no folder is named now, not as an entry's path later
        check_writable(exp.cache_dir, "--cache")
    if exp.out_dir is None:
        return _run_experiment(exp, spec, cls, settings, on_start, on_progress, on_run,
                               on_resume)
    path = experiment_path(exp, cls)
    seeds = ",".join(map(str, exp.seeds))
    try:  # one writer of a result at a time: a second is refused now, not after its work
        with claim(path, f"pid {os.getpid()}, seeds {shown(seeds, 40)}"):
            return _run_experiment(exp, spec, cls, settings, on_start, on_progress, on_run,
                                   on_resume)
    except ClaimedError as e:
        raise ValueError(f"{e}: refused to start a second writer of it before any work; wait "
                         "for that one to end (then --seeds including its seeds extends the "
                         "result), or choose another --out") from None


def check_names(path: Path) -> None:
    """A dangling symbolic link at the result's name ``path`` or its checkpoint's, refused
    before any work (with ``--force`` or ``--resume`` too): there is nothing to replace or
    resume there, and writing through it would create the target's folders."""
    for name, what in ((path, "result"), (checkpoint_path(path), "checkpoint")):
        if os.path.islink(name) and not os.path.exists(name):
            raise ValueError(f"{what} {dangling_text(name)}: refused before any work; remove "
                             "the link, or choose another --out")


def _run_experiment(exp: ExperimentSpec, spec: DatasetSpec, cls: type[Learner],
                    settings: dict[str, Any], on_start, on_progress, on_run, on_resume) -> dict:
    fs = load_features(exp, spec)
    offline = offline_settings(exp, spec)
    cache_dir = Path(exp.cache_dir) if exp.cache_dir else None
    orderings = [stream_ordering(exp, spec, fs, s) for s in exp.seeds]
    ident = identity({
        "dataset": exp.dataset, "ordering": exp.ordering, "method": cls.name,
        **({"method_source": source} if (source := method_source(cls)) else {}),
        "seeds": [int(x) for x in exp.seeds], "settings": settings, "features": fs.key,
        "limit_per_class": exp.limit_per_class, "offline": offline.__dict__,
        "regime": regime_of(exp).__dict__,
        **({"max_events": exp.max_events} if exp.max_events is not None else {}),
        **({"offline_reference": False} if not exp.offline_reference else {}),
        **({"device": device} if (device := resolve_device(exp.device)) != "cpu" else {})})
    ckpt = None
    header = result_header(exp, spec, cls, settings, fs, offline)
    if exp.out_dir is not None:  # finished runs are saved there at once, whatever happens next
        path = experiment_path(exp, cls)
        ckpt = checkpoint_path(path)
        check_overwrite(path, header, force=exp.force, seeds=exp.seeds)  # before any work
        remove_stale_temporaries(ckpt)
        if exp.resume and os.path.lexists(ckpt):
            check_regular(ckpt, "checkpoint")  # a FIFO there would block the reader
        elif os.path.lexists(ckpt) and not exp.force:  # an interrupted run's finished work
            raise ValueError(f"{ckpt} holds the work of an interrupted run of this result: "
                             "--resume continues it; --force starts over, dropping it")
    saved = load_checkpoint(ckpt, ident) if ckpt is not None and exp.resume else None
    runs: list[dict] = list(saved["runs"]) if saved else []
    elapsed = float(saved["wall_seconds"]) if saved else 0.0
    current = saved["current"] if saved else None
    if saved and on_resume is not None:
        on_resume(len(runs), current["position"] if current else 0)
    if on_start is not None:
        on_start(sum(len(o.stream) for o in orderings[len(runs):])
                 - (current["position"] if current else 0))
    started = time.time()

    def save(state: dict | None) -> None:
        save_checkpoint(ckpt, ident, {"runs": runs, "current": state,
                                      "wall_seconds": elapsed + time.time() - started})

    for ordering in orderings[len(runs):]:
        run = run_seed(exp, cls, settings, fs, ordering, offline, cache_dir,
                       progress=on_progress,
                       checkpoint_every=exp.checkpoint_every if ckpt else 0,
                       on_checkpoint=save, resume=current)
        current = None
        runs.append(run)
        if ckpt is not None:  # a failure later (even at the final write) loses no finished run
            save(None)
        if on_run is not None:
            on_run(run)
    result = aggregate(exp, spec, cls, settings, fs, offline, runs,
                       wall_seconds=elapsed + time.time() - started)
    if exp.out_dir is not None:
        result["path"] = str(experiment_path(exp, cls))
        # again: something else may have written there meanwhile (the runs are checkpointed);
        # the advice is followed in tests/test_concurrent_runs.py
        problem = None if exp.force else overwrite_problem(result["path"], header, exp.seeds)
        if problem is not None:
            raise ValueError(f"{problem[0]}: refused to {'drop them' if problem[1] else 'replace it'}"
                             f"; the {len(runs)} finished run(s) are saved in {ckpt}: the same "
                             "command with --resume --force writes this result in its place, or "
                             "move that file away and add --resume")
        try:
            atomic_write_json(result["path"], result)
        except OSError as e:  # a full disk, say: the runs are in the checkpoint
            raise OSError(e.errno, f"cannot write the result {result['path']} "
                          f"({e.strerror or e}); the {len(runs)} finished run(s) are saved: "
                          "the same command with --resume writes it") from None
        if ckpt is not None:
            ckpt.unlink(missing_ok=True)  # the result is complete: nothing left to resume
    return result
