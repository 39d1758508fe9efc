"""An experiment: one (dataset, ordering, method) cell over several seeds, written as one JSON.

Everything is validated (the output folder's writability included) before any work starts; each
finished run is saved at once in the experiment's checkpoint (``--resume`` picks them up after a
failure or an interruption), and the JSON is written atomically at the end, so a failed or
interrupted experiment leaves nothing half-written and loses no finished run. The result file is
named by everything that changes its numbers and differs from the protocol's defaults (dataset,
extractor, ordering, method, ``--set`` settings and ``--buffer``, ``--limit-per-class``,
``--offline-epochs``, ``--weights``, regime and its options), and a result of another experiment
already at that name is never replaced without ``force``. The checks of the flags are in
``validation``, the names and identity of results in ``naming`` (both re-exported here).
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import ciosl
from ciosl.data.orderings import OFFICIAL, Ordering, limit_per_class, make_ordering
from ciosl.data.runtime import resolve_device
from ciosl.data.types import DatasetSpec, FeatureSet
from ciosl.errors import is_out_of_memory, out_of_memory, shown
from ciosl.evaluation.checkpoint import (
    checkpoint_path,
    identity,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from ciosl.evaluation.metrics import (
    continual_metrics,
    mean_matrix,
    mean_std,
    omega_all,
    summary,
)

# result naming and identity (naming.py), flag validation (validation.py): re-exported here,
# where other modules and tests import them
from ciosl.evaluation.naming import (  # noqa: F401
    IDENTITY,
    MAX_STEM_BYTES,
    _digest,
    _safe,
    _short,
    _slug_text,
    check_names,
    check_overwrite,
    dataset_slug,
    differences,
    exact_slug,
    experiment_path,
    fit_name,
    identity_of,
    message_of,
    name_settings,
    overwrite_problem,
    protocol_slug,
    result_path,
    setting_text,
    slug_items,
    variant_slug,
)
from ciosl.evaluation.protocol import (
    OfflineSettings,
    Regime,  # noqa: F401
    offline_accuracy,
    run_stream,
    subset_train,
)
from ciosl.evaluation.validation import (  # noqa: F401
    MAX_BATCH_SIZE,
    MAX_BUFFER,
    MAX_CHECKPOINT_EVERY,
    MAX_EPOCHS,
    MAX_EVENTS,
    MAX_LIMIT_PER_CLASS,
    MAX_RUNS,
    MAX_SEED,
    ExperimentSpec,
    check_range,
    check_seeds,
    choose_seeds,
    extract_options,
    max_threads,
    parse_assignments,
    regime_of,
    resolve_settings,
    set_threads,
    validate,
)
from ciosl.fileio import (
    MAX_TEXT_BYTES,
    ClaimedError,
    atomic_write_json,
    check_regular,
    check_writable,
    claim,
    read_bytes,
)
from ciosl.learners.base import Learner


def load_features(exp: ExperimentSpec, spec: DatasetSpec) -> FeatureSet:
    from ciosl.data.features import get_features

    cache = Path(exp.cache_dir) / "features" if exp.cache_dir else None
    fs = get_features(exp.dataset, exp.extractor, weights=exp.weights, cache_dir=cache,
                      root=exp.data_root, device=exp.device, backend=exp.backend,
                      threads=exp.extract_threads, options=extract_options(exp))
    if exp.limit_per_class is not None:
        fs = subset_train(fs, limit_per_class(fs.train_y, exp.limit_per_class,
                                              instances=fs.train_instance, frames=fs.train_frame))
    return fs


def offline_settings(exp: ExperimentSpec, spec: DatasetSpec) -> OfflineSettings:
    return OfflineSettings(
        epochs=spec.offline_epochs if exp.offline_epochs is None else exp.offline_epochs,
        batch_size=spec.offline_batch_size)


def stream_ordering(exp: ExperimentSpec, spec: DatasetSpec, fs: FeatureSet, seed: int) -> Ordering:
    """The base-init indices, stream and testing events of one run (CORe50's official
    scenarios: its run ``seed``'s batches, read from the dataset's LUP.pkl)."""
    if exp.ordering in OFFICIAL:
        from ciosl.data.streams import official_ordering

        if exp.limit_per_class is not None:
            raise ValueError(f"--limit-per-class cannot be used with CORe50's official "
                             f"{exp.ordering!r} batches (they list every frame)")
        return official_ordering(exp.data_root, exp.ordering, seed,
                                 categories=exp.dataset == "core50-cat",
                                 max_events=exp.max_events)
    return make_ordering(exp.ordering, fs.train_y, seed=seed, base_fraction=spec.base_fraction,
                         classes_per_step=spec.classes_per_step, instances=fs.train_instance,
                         frames=fs.train_frame, max_events=exp.max_events, chunk=spec.chunk)


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
        run = run_stream(learner, fs, ordering, regime=regime_of(exp),
                         open_set=exp.open_set, **stream)
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
                     **({"offline_reference": False} if not exp.offline_reference else {}),
                     **({"open_set": True} if exp.open_set else {})},
    }


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
        **({"open_set": open_set_summary([r.get("open_set") for r in runs])}
           if exp.open_set else {}),
        "samples_per_second": float(np.mean([r["samples_per_second"] for r in runs])),
        "predict_seconds": float(np.mean([r["predict_seconds"] for r in runs])),
        "peak_memory_bytes": int(max(r["peak_memory_bytes"] for r in runs)),
        "wall_seconds": wall_seconds,
        "versions": {"ciosl": ciosl.__version__, "python": platform.python_version(),
                     "numpy": np.__version__, "torch": __import__("torch").__version__},
    }
    return result


def open_set_summary(records: Sequence[dict | None]) -> dict | None:
    """The open-set fields of a result: per run, the mean AUROC / AUOSC over the testing
    events that had novel samples (``open_set_means``), then mean +- std over runs, for the
    learner's own novelty score and, where it has another one, for 1 - max probability."""
    if not records or any(r is None for r in records):
        return None
    out: dict = {"score": records[0]["score"]}
    for key in ("auroc", "auosc"):
        out[key] = summary([open_set_means(r[key]) for r in records])
    if all("baseline" in r for r in records):
        base = [r["baseline"] for r in records]
        out["baseline"] = {"score": base[0]["score"],
                           **{k: summary([open_set_means(b[k]) for b in base])
                              for k in ("auroc", "auosc")}}
    return out


def open_set_means(values: Sequence[float | None]) -> float | None:
    """The mean of a run's per-event values over the events that had novel samples (None if
    none had)."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


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
        **({"open_set": True} if exp.open_set else {}),
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
        # the advice is followed in tests/evaluation/test_concurrent_runs.py
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
