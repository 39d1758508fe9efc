"""Sweeps: every (cell, seed) run of a grid, on local processes or a Ray cluster, resumable.

Work happens in three steps:

1. the driver validates the grid and loads every dataset's features once (computing and caching
   them if needed), so no two workers ever extract the same features;
2. one *offline task* per stream (features, ordering, seed) trains the offline reference
   learners of that stream and caches their accuracies; they do not depend on the method, so
   every cell of the stream reuses them. A stream that a finished run in the output folder
   already divides by needs no offline task: its new runs take that run's reference, so every
   method of a stream divides by one reference even when the cache was rebuilt on another
   machine (whose offline MLP can differ in the last digits: floating-point order);
3. one *run task* per (cell, seed): a fresh learner through the stream. The driver writes each
   finished run atomically to ``OUT/runs/<cell>/seed-<seed>.json`` and, once every seed of a cell
   is there, the cell's result to ``OUT/<cell>.json`` in the format ``ciosl run`` writes (built by
   the same ``experiment.aggregate``), plus a ``sweep`` entry naming the grid, cell and variant.

A run file carries the fingerprint of its cell (dataset, ordering, method, resolved settings,
features, offline settings, regime): re-running the same command skips the runs whose file is
there with the same fingerprint, so an interrupted sweep resumes where it stopped, and a changed
setting recomputes exactly the cells it changes. The fingerprint is built from a settings
fingerprint (all of it but the features, known without loading any data) and the features' cache
key; run files keep both, so ``--dry-run`` counts exactly the runs the sweep will reuse, short of
a change in the data or the extractor. The Omega_all definition (``omega_events``) is
not part of the fingerprint: a cell's Omega_all is computed from its runs' per-event accuracies
when its result is written, so changing it rewrites the results without re-running anything.

Two sweeps of one folder, and the shared cache folder: docs/design.md, "Module notes". The cells,
their fingerprints and files are in ``sweep_cells``, the worker task and the executors (local
processes, Ray) in ``sweep_workers`` (both re-exported here); this module plans and drives.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import heapq
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ciosl.evaluation.experiment import (
    ExperimentSpec,
    check_range,
    validate,
)
from ciosl.evaluation.grid import Cell, Grid

# the cells, their fingerprints and files (sweep_cells.py): re-exported here
from ciosl.evaluation.sweep_cells import (  # noqa: F401
    RUN_FORMAT,
    CellInfo,
    _features_id,
    _fingerprint,
    _finished,
    _number,
    _regime_fields,
    _whole_run,
    check_cell_file,
    legacy_fingerprints,
    prepare,
    result_file,
    run_file,
    settings_fingerprint,
    write_result,
)

# the workers and executors (sweep_workers.py): re-exported here
from ciosl.evaluation.sweep_workers import (  # noqa: F401
    MAX_RAY_WORKERS,
    _Local,
    _Ray,
    default_workers,
    execute,
    import_ray,
    max_local_workers,
    sigterm_as_interrupt,
)
from ciosl.fileio import (
    ClaimedError,
    atomic_write_bytes,
    atomic_write_json,
    check_writable,
    claim,
    read_json,
    read_text,
)

EXECUTORS = ("local", "ray")


@dataclass
class Status:
    """Counts for a progress display. ``eta``: seconds left (None: not known yet)."""

    runs: int  # runs in the grid
    skipped: int  # finished before this sweep started
    done: int = 0  # finished by this sweep
    elsewhere: int = 0  # finished meanwhile by another sweep of the same folder
    failed: int = 0
    running: int = 0
    offline: int = 0  # offline tasks (one per stream with runs left)
    offline_done: int = 0
    offline_running: int = 0
    eta: float | None = None

    @property
    def left(self) -> int:
        return (self.runs - self.skipped - self.done - self.elsewhere - self.failed
                - self.running)


class Monitor(Protocol):
    def update(self, status: Status) -> None: ...
    def run_done(self, cell: Cell, seed: int, run: dict, seconds: float) -> None: ...
    def run_failed(self, cell: Cell, seed: int, error: str) -> None: ...
    def cell_done(self, cell: Cell, result: dict) -> None: ...


@dataclass
class SweepSummary:
    out: Path
    cells: int
    runs: int
    skipped: int
    computed: int
    elsewhere: int = 0  # runs another sweep of the folder finished while this one ran
    failed: list[dict] = field(default_factory=list)  # {"cell", "seed", "error"}
    results: list[str] = field(default_factory=list)  # aggregate JSONs written by this sweep
    wall_seconds: float = 0.0


# ---------------------------------------------------------------------------- the sweep


@dataclass
class _Stream:
    exp: ExperimentSpec
    seed: int
    runs: list[tuple[CellInfo, int]]
    reference: list[float] | None = None  # the offline accuracies the folder's runs divide by


def _stream_key(info: CellInfo, seed: int) -> tuple:
    return (_features_id(info.exp), info.fs.key, info.exp.ordering, seed,
            tuple(sorted(info.offline.__dict__.items())))


def _references(out: Path, infos: list[CellInfo], seeds: Sequence[int]) -> dict[tuple, list]:
    """The offline reference of each stream that a finished run in ``out`` already divides
    by. Every method of a stream must divide by the same one ("the offline model is trained
    only once"); a cache rebuilt on another machine can train a slightly different offline
    MLP (floating-point order), so a sweep that extends a folder reuses the folder's."""
    found: dict[tuple, list] = {}
    for info in infos:
        for seed in seeds:
            key = _stream_key(info, seed)
            saved = None if key in found else _finished(out, info, seed)
            reference = saved["run"].get("accuracy_offline") if saved else None
            if isinstance(reference, list) and reference:
                found[key] = reference
    return found


def write_grid_text(out: Path, name: str, text: str) -> Path:
    """Leave the grid's text next to its results (``sweep-<name>.toml``, read by the report).
    Another grid's text already there is kept: a sweep of another (say a partial) grid into the
    same folder writes its own as ``sweep-<name>-<sha256 prefix>.toml``."""
    path = out / f"sweep-{name}.toml"
    old = read_text_or_none(path)
    if old is not None and old != text:
        path = out / f"sweep-{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}.toml"
    atomic_write_bytes(path, text.encode())
    return path


def read_text_or_none(path: Path) -> str | None:
    try:
        return read_text(path, "grid file")
    except (OSError, ValueError):  # absent, not a regular file, not UTF-8: replaced
        return None


def run_sweep(grid: Grid, *, executor: str = "local", workers: int | None = None,
              address: str | None = None, monitor: Monitor | None = None,
              force: bool = False) -> SweepSummary:
    """Run every (cell, seed) of ``grid`` not finished yet; see the module docstring.
    ``force``: replace cell results of other experiments (refused otherwise, before any
    work)."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; valid choices: {', '.join(EXECUTORS)}")
    if executor == "local":
        check_range(workers, "--workers", 1, max_local_workers(),
                    f" (4 per CPU here: {default_workers()} CPUs)")
    else:
        check_range(workers, "--workers", 1, MAX_RAY_WORKERS)
    if address is not None and executor != "ray":
        raise ValueError("--address only applies with --executor ray")
    if executor == "ray":
        import_ray()  # a clear error now rather than after loading the features
    started = time.time()
    out = check_writable(grid.out, "the output folder")  # before loading or computing anything
    if grid.cache:
        check_writable(grid.cache, "the cache folder")
    infos = prepare(grid)
    for info in infos:  # no cell file of another experiment is replaced: refused before any work
        check_cell_file(grid, out, info, force)
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", grid.name).strip("-") or "grid"
    write_grid_text(out, name, grid.text)

    streams: dict[tuple, _Stream] = {}
    skipped = 0
    complete = []
    for info in infos:
        todo = [s for s in grid.seeds if _finished(out, info, s) is None]
        skipped += len(grid.seeds) - len(todo)
        if not todo:
            complete.append(info)
        for seed in todo:
            key = _stream_key(info, seed)
            streams.setdefault(key, _Stream(info.exp, seed, [])).runs.append((info, seed))
    if streams:
        for key, reference in _references(out, infos, grid.seeds).items():
            if key in streams:
                streams[key].reference = reference
    summary = SweepSummary(out=out, cells=len(infos), runs=len(infos) * len(grid.seeds),
                           skipped=skipped, computed=0)
    for info in complete:  # written already, unless its result is missing or stale
        old = read_json(result_file(out, info.cell))
        if not (isinstance(old, dict) and old.get("sweep", {}).get("fingerprint")
                == info.fingerprint and old.get("seeds") == list(grid.seeds)
                and (old.get("omega_all") or {}).get("events") == info.exp.omega_events):
            summary.results.append(_cell_done(grid, out, info, monitor, force))

    status = Status(runs=summary.runs, skipped=skipped,
                    offline=sum(st.reference is None for st in streams.values()))
    if monitor is not None:
        monitor.update(status)
    if streams:
        with sigterm_as_interrupt():
            _drive(grid, out, streams, status, summary, executor, workers, address, monitor,
                   force)
    summary.wall_seconds = time.time() - started
    if monitor is not None:
        monitor.update(status)
    return summary


def _cell_done(grid: Grid, out: Path, info: CellInfo, monitor: Monitor | None,
               force: bool = False) -> str:
    result = write_result(grid, out, info, force)
    if monitor is not None:
        monitor.cell_done(info.cell, result)
    return result["path"]


class _Claims:
    """The runs this sweep is computing, each claimed by a lock on its run file (``claim``: an
    flock on ``runs/<cell>/.seed-N.json.lock``, held by the driver from the run's submission
    until its file is written; the kernel releases it when the driver ends, however it ends), so
    that two sweeps of one folder split the runs instead of computing each twice."""

    def __init__(self, out: Path):
        self.out = out
        self.held: dict[tuple[str, int], contextlib.ExitStack] = {}

    def take(self, info: CellInfo, seed: int) -> bool:
        """Claim the run; False while another process holds it."""
        path = run_file(self.out, info.cell, seed)
        stack = contextlib.ExitStack()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(claim(path, f"pid {os.getpid()}, a sweep"))
        except ClaimedError:
            stack.close()
            return False
        except OSError as e:  # out of file descriptors (a Ray cluster of thousands of CPUs):
            if e.errno not in (errno.EMFILE, errno.ENFILE):  # run unclaimed, as before claims
                raise
            return True
        self.held[info.cell.id, seed] = stack
        return True

    def release(self, info: CellInfo, seed: int) -> None:
        stack = self.held.pop((info.cell.id, seed), None)
        if stack is not None:
            stack.close()

    def close(self) -> None:
        for stack in self.held.values():
            stack.close()
        self.held.clear()


RECHECK_SECONDS = 0.5  # how often a sweep with nothing else to do looks at others' claimed runs


def _drive(grid: Grid, out: Path, streams: dict[tuple, _Stream], status: Status,
           summary: SweepSummary, executor: str, workers: int | None, address: str | None,
           monitor: Monitor | None, force: bool = False) -> None:
    ex: _Local | _Ray = (_Local(workers or default_workers()) if executor == "local"
                         else _Ray(workers, address))
    offline_queue = deque(st for st in streams.values() if st.reference is None)
    # runs whose offline references are ready, cell by cell: cells complete (and their result
    # JSON appears) one after another rather than all at the end
    rank = {cell.id: i for i, cell in enumerate(grid.cells)}
    run_queue: list[tuple[int, int, CellInfo]] = []
    left = {}  # cell id -> seeds not finished yet
    reference = {}  # (cell id, seed) -> the folder's offline reference of its stream
    for stream in streams.values():
        for info, seed in stream.runs:
            left.setdefault(info.cell.id, set()).add(seed)
            if stream.reference is not None:  # no offline task: ready to run
                reference[info.cell.id, seed] = stream.reference
                heapq.heappush(run_queue, (rank[info.cell.id], seed, info))
    in_flight: dict[Any, tuple[str, Any, float]] = {}
    run_seconds: list[float] = []
    offline_seconds: list[float] = []
    # runs that another process (a second sweep of this folder) had claimed when this one came
    # to them: looked at again once this sweep has started all its own work; the holder's file
    # counts as finished here, and a run whose holder ended without one is computed here
    claims = _Claims(out)
    deferred: list[tuple[int, int, CellInfo]] = []

    def finished(info: CellInfo, seed: int) -> None:
        left[info.cell.id].discard(seed)
        if not left[info.cell.id]:
            summary.results.append(_cell_done(grid, out, info, monitor, force))

    def elsewhere(info: CellInfo, seed: int) -> None:
        summary.elsewhere += 1
        status.elsewhere += 1
        finished(info, seed)

    cancel = True
    try:
        while offline_queue or run_queue or in_flight or deferred:
            if deferred and not run_queue and not offline_queue:
                for entry in deferred:  # back in the queue: claimed again below, or deferred
                    if _finished(out, entry[2], entry[1]) is not None:
                        elsewhere(entry[2], entry[1])
                    else:
                        heapq.heappush(run_queue, entry)
                deferred = []
            while len(in_flight) < ex.workers and (offline_queue or run_queue):
                if offline_queue:
                    stream = offline_queue.popleft()
                    handle = ex.submit("offline", stream.exp, stream.seed)
                    in_flight[handle] = ("offline", stream, time.time())
                else:
                    entry = heapq.heappop(run_queue)
                    _, seed, info = entry
                    if not claims.take(info, seed):  # another sweep computes it right now
                        deferred.append(entry)
                        continue
                    if _finished(out, info, seed) is not None:  # another sweep just did
                        claims.release(info, seed)
                        elsewhere(info, seed)
                        continue
                    handle = ex.submit("run", info.exp, seed,
                                       reference.get((info.cell.id, seed)))
                    in_flight[handle] = ("run", (info, seed), time.time())
            if not in_flight:  # only others' claimed runs are left: wait for them
                time.sleep(RECHECK_SECONDS if deferred else 0)
            for handle, value, error in (ex.wait(list(in_flight), timeout=0.5)
                                         if in_flight else []):
                kind, item, _ = in_flight.pop(handle)
                if kind == "offline":
                    status.offline_done += 1
                    if error is None:
                        offline_seconds.append(value["wall_seconds"])
                        for info, seed in item.runs:
                            heapq.heappush(run_queue, (rank[info.cell.id], seed, info))
                    else:
                        for info, seed in item.runs:
                            _failed(summary, status, monitor, info, seed,
                                    f"offline reference: {error}")
                    continue
                info, seed = item
                if error is None and value["features"] != info.fs.key:
                    error = (f"the worker's features ({value['features']}) differ from the "
                             f"driver's ({info.fs.key}): different data or cache on that machine")
                if error is not None:
                    claims.release(info, seed)  # another sweep may try it
                    _failed(summary, status, monitor, info, seed, error)
                    continue
                atomic_write_json(run_file(out, info.cell, seed), {
                    "format": RUN_FORMAT, "cell": info.cell.id, "seed": seed,
                    "fingerprint": info.fingerprint,
                    "settings_fingerprint": info.settings_fingerprint,
                    "wall_seconds": value["wall_seconds"],
                    "run": value["run"]})
                claims.release(info, seed)  # written: another sweep now finds it finished
                summary.computed += 1
                status.done += 1
                run_seconds.append(value["wall_seconds"])
                if monitor is not None:
                    monitor.run_done(info.cell, seed, value["run"], value["wall_seconds"])
                finished(info, seed)
            kinds = [k for k, _, _ in in_flight.values()]
            status.running, status.offline_running = kinds.count("run"), kinds.count("offline")
            status.eta = _eta(status, ex.workers, run_seconds, offline_seconds,
                              [t for k, _, t in in_flight.values()])
            if monitor is not None:
                monitor.update(status)
        cancel = False
    finally:
        ex.close(cancel, list(in_flight))
        claims.close()


def _failed(summary: SweepSummary, status: Status, monitor: Monitor | None, info: CellInfo,
            seed: int, error: str) -> None:
    summary.failed.append({"cell": info.cell.id, "seed": seed, "error": error})
    status.failed += 1
    if monitor is not None:
        monitor.run_failed(info.cell, seed, error)


def _eta(status: Status, workers: int, run_seconds: list[float], offline_seconds: list[float],
         running_since: Iterable[float]) -> float | None:
    """Seconds left: the work left (mean task time so far) spread over the workers."""
    if not run_seconds:
        return None
    per_run = sum(run_seconds) / len(run_seconds)
    per_offline = sum(offline_seconds) / len(offline_seconds) if offline_seconds else per_run
    now = time.time()
    queued_offline = status.offline - status.offline_done - status.offline_running
    work = (status.left * per_run + queued_offline * per_offline
            + sum(max(0.0, per_run - (now - t)) for t in running_since))
    return work / max(1, workers)


def plan(grid: Grid) -> list[tuple[Cell, list[int]]]:
    """(cell, seeds the sweep will not recompute) for every cell, without loading any data
    (--dry-run): a run counts if its file is there with this code's settings fingerprint of
    the cell (a run made with other settings or defaults, or by a version that did not record
    it, will be recomputed)."""
    seeds = set(grid.seeds)
    out = []
    for cell in grid.cells:
        exp = grid.experiment(cell)
        spec, cls, settings = validate(exp)
        sfps = (settings_fingerprint(exp, spec, cls, settings),
                *legacy_fingerprints(exp, spec, cls, settings))
        folder = Path(grid.out) / "runs" / cell.id
        done = []
        for path in sorted(folder.glob("seed-*.json")) if folder.is_dir() else []:
            m = _SEED_FILE.fullmatch(path.name)
            if m is None or int(m.group(1)) not in seeds:
                continue
            saved = read_json(path)
            if (isinstance(saved, dict) and saved.get("settings_fingerprint") in sfps
                    and saved.get("seed") == int(m.group(1))
                    and isinstance(saved.get("run"), dict)):
                done.append(int(m.group(1)))
        out.append((cell, sorted(done)))
    return out


_SEED_FILE = re.compile(r"seed-(\d+)\.json")


