"""The workers of a sweep (``sweep``): the task one worker process runs (``execute``: a stream's
offline references, or one run), and the two executors that run tasks, a pool of spawned local
processes (``_Local``) and a Ray cluster (``_Ray``), behind one submit / wait / close interface.
A worker keeps the features of its last two streams in memory, loaded from the cache the driver
filled; a local worker exits as soon as its driver is gone."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

from ciosl.data.types import DatasetSpec, FeatureSet
from ciosl.evaluation.experiment import (
    ExperimentSpec,
    load_features,
    offline_curve,
    offline_settings,
    run_seed,
    stream_ordering,
    validate,
)
from ciosl.evaluation.sweep_cells import _features_id

_FEATURES: OrderedDict[tuple, FeatureSet] = OrderedDict()  # per worker process, newest last


def _worker_features(exp: ExperimentSpec, spec: DatasetSpec) -> FeatureSet:
    fid = _features_id(exp)
    if fid in _FEATURES:
        _FEATURES.move_to_end(fid)
    else:
        _FEATURES[fid] = load_features(exp, spec)  # from the cache the driver filled
        while len(_FEATURES) > 2:
            _FEATURES.popitem(last=False)
    return _FEATURES[fid]


def execute(kind: str, exp: ExperimentSpec, seed: int,
            reference: list[float] | None = None) -> dict:
    """One task, in a worker: ``offline`` (the stream's offline references) or ``run`` (with
    the stream's ``reference`` when the output folder already holds one)."""
    import torch

    torch.set_num_threads(1)  # one-sample steps are fastest single-threaded; workers parallelize
    started = time.perf_counter()
    spec, cls, settings = validate(exp)
    fs = _worker_features(exp, spec)
    ordering = stream_ordering(exp, spec, fs, seed)
    offline = offline_settings(exp, spec)
    cache_dir = Path(exp.cache_dir) if exp.cache_dir else None
    out: dict[str, Any] = {"features": fs.key}
    if kind == "offline":
        out["offline"] = offline_curve(fs, ordering, offline, cache_dir, exp.device)
    else:
        out["run"] = run_seed(exp, cls, settings, fs, ordering, offline, cache_dir,
                              reference=reference)
    out["wall_seconds"] = time.perf_counter() - started
    return out


def _init_local_worker(driver: int | None = None) -> None:
    import torch

    torch.set_num_threads(1)
    if driver is not None:
        threading.Thread(target=_watch_driver, args=(driver,), daemon=True).start()


def _watch_driver(driver: int, every: float = 1.0) -> None:
    """In a worker: exit as soon as the driver is gone (killed with SIGKILL, say), instead of
    idling on, orphaned, with a few hundred MB."""
    while os.getppid() == driver:
        time.sleep(every)
    os._exit(1)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM handled like Ctrl-C (KeyboardInterrupt) inside the block: the sweep stops its
    workers and keeps every finished run. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Local:
    """A pool of spawned processes (``spawn``: no fork of the driver's threads or torch state)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        for k, v in self._env.items():  # inherited by the workers (faiss, BLAS)
            if v is None:
                os.environ[k] = "1"
        self.pool = ProcessPoolExecutor(max_workers=workers,
                                        mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_init_local_worker,
                                        initargs=(os.getpid(),))

    def submit(self, *args: Any) -> Any:
        return self.pool.submit(execute, *args)

    def wait(self, handles: list, timeout: float) -> list[tuple[Any, dict | None, str | None]]:
        done, _ = wait_futures(handles, timeout=timeout, return_when=FIRST_COMPLETED)
        out = []
        for f in done:
            error = f.exception()
            out.append((f, None if error else f.result(),
                        None if error is None else f"{type(error).__name__}: {error}"))
        return out

    def close(self, cancel: bool, pending: list) -> None:
        if cancel:  # interrupted: stop the runs in progress too, not only the queued ones
            for process in list((getattr(self.pool, "_processes", None) or {}).values()):
                process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=cancel)
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)


def import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray executor needs Ray: pip install 'ciosl[ray]' "
                           "(or pip install ray)") from None
    return ray


class _Ray:
    """Tasks on a Ray cluster: the one at ``address`` ("auto", "ray://host:10001"), the one this
    process already joined, or a local one started here (and stopped at the end)."""

    def __init__(self, workers: int | None, address: str | None):
        ray = self.ray = import_ray()
        self.started = False
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False}
            if address is None and workers:
                kw["num_cpus"] = workers
            ray.init(address=address, **kw)
            self.started = True
        self.workers = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote = ray.remote(num_cpus=1, max_retries=0)(execute)

    def submit(self, *args: Any) -> Any:
        return self.remote.remote(*args)

    def wait(self, handles: list, timeout: float) -> list[tuple[Any, dict | None, str | None]]:
        ready, rest = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        out = []
        for ref in ready:
            try:
                out.append((ref, self.ray.get(ref), None))
            except Exception as e:  # the task's exception, re-raised by Ray
                cause = getattr(e, "cause", None) or e
                out.append((ref, None, f"{type(cause).__name__}: {cause}"))
        return out

    def close(self, cancel: bool, pending: list) -> None:
        if cancel:  # interrupted: free the cluster's workers too
            for ref in pending:
                self.ray.cancel(ref, force=True)
        if self.started:
            self.ray.shutdown()


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


MAX_RAY_WORKERS = 10_000


def max_local_workers() -> int:
    """Local worker processes: at most 4 per CPU here (each holds a torch)."""
    return 4 * default_workers()
