"""What ``ciosl run`` asks for (``ExperimentSpec``) and its validation: the bounds of every
option, seeds, threads, ``--set`` assignments and the learner's settings, all checked before
any work starts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.data.orderings import OFFICIAL, check_kind
from ciosl.data.runtime import resolve_device
from ciosl.data.types import DatasetSpec
from ciosl.errors import echo, shown
from ciosl.evaluation.metrics import check_omega_events
from ciosl.evaluation.protocol import Regime
from ciosl.fileio import check_regular
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
    backend: str | None = None  # extraction on the CPU: auto | onnxruntime | torch (None:
    # $CIOSL_BACKEND, else auto; ciosl.data.runtime.resolve_backend)
    extract_threads: int | None = None  # extraction's CPU threads (None: the backend's default)
    mean: str | None = None  # --mean / --std / --layer of an onnx: extractor ("r,g,b")
    std: str | None = None
    layer: str | None = None
    offline_reference: bool = True  # False: no offline reference, hence no Omega_all
    open_set: bool = False  # the open-set protocol: AUROC / AUOSC of novelty_score per event


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


def extract_options(exp: ExperimentSpec):
    """``--mean`` / ``--std`` / ``--layer`` as ``backbones.Options`` (None when none given);
    refused with a built-in extractor."""
    from ciosl.data.backbones import options_from_flags

    return options_from_flags(exp.extractor, exp.mean, exp.std, exp.layer)


def set_threads(threads: int | None) -> None:
    """``--threads``: torch's intra-op threads (1 to ``max_threads()``; None: 1)."""
    threads = 1 if threads is None else threads
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
    if exp.ordering in OFFICIAL and exp.limit_per_class is not None:
        raise ValueError(f"--limit-per-class cannot be used with CORe50's official "
                         f"{exp.ordering!r} batches (they list every frame)")
    from ciosl.data import backbones

    if exp.extractor is not None and not backbones.is_user_backbone(exp.extractor):
        parse_extractor(exp.extractor)
    resolve_device(exp.device)  # an unknown or absent device is named before any work
    from ciosl.data.features import execution

    execution(exp.device, exp.backend, exp.extract_threads)  # --backend, --threads likewise
    options = extract_options(exp)
    if exp.extractor is not None and exp.extractor.startswith(backbones.ONNX_PREFIX):
        backbones.resolve(exp.extractor, options)  # the file, its input, --layer: up front
    elif exp.extractor is not None and exp.extractor.startswith(backbones.MODULE_PREFIX):
        backbones.check_module_name(exp.extractor)
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
