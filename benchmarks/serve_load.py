"""Load on a real ``ciosl serve`` (127.0.0.1): N learning and M predicting clients (httpx, .npy
bodies) against one server, per method, at width ``--dim``. Prints, per method:

- served learns/s against the same learner learning the same batches in this process (a ratio
  measured in one run; target for slda at batch 32: >= 0.5);
- predictions/s and p50 / p99 latency with no learning, then under concurrent learning (target:
  p99 under learning <= 2x the idle p99);
- the log's write + fsync time per group commit (from /metrics);
- recovery: the server killed with SIGKILL after ``--recover-samples`` samples with no snapshot,
  then the time to replay the log at restart against the time the server took to learn them
  (target: recovery faster than learning).

    python benchmarks/serve_load.py                                  # slda, ncm, tinyer, ciosl
    python benchmarks/serve_load.py --methods slda --seconds 20 --recover-samples 1000000
    python benchmarks/serve_load.py --writer-nice 0    # learns at the answers' priority
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np

TOKEN = "bench-token-0123456789abcdef"


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


class Stream:
    """Batches of a stream of Gaussian classes (``classes`` of them, width ``dim``)."""

    def __init__(self, dim: int, classes: int, batch: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.centres = rng.normal(0, 2, size=(classes, dim)).astype(np.float32)
        self.rng, self.batch = rng, batch

    def next(self) -> tuple[np.ndarray, list[int]]:
        y = self.rng.integers(0, len(self.centres), size=self.batch)
        x = self.centres[y] + self.rng.normal(size=(self.batch, self.centres.shape[1])).astype(
            np.float32)
        return x, [int(v) for v in y]


def start(folder: str, *args: str) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "CIOSL_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ciosl", "serve", "--dir", folder, "--port",
                             "0", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    line = proc.stdout.readline()
    found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
    if not found:
        raise SystemExit(f"the server did not start: {line!r}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, found.group(1), line


def learners(url: str, n: int, seconds: float, stream: Stream, stop: threading.Event,
             counts: list[int]) -> list[threading.Thread]:
    lock = threading.Lock()

    def run():
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=120) as h:
            while not stop.is_set():
                with lock:
                    x, y = stream.next()
                r = h.post("/v1/learn", content=_npy(x), headers={
                    "Content-Type": "application/x-npy", "X-Ciosl-Labels": str(y)})
                r.raise_for_status()
                counts.append(len(y))

    return [threading.Thread(target=run) for _ in range(n)]


def predictors(url: str, m: int, x: np.ndarray, stop: threading.Event,
               latencies: list[float]) -> list[threading.Thread]:
    body = _npy(x)

    def run():
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=120) as h:
            while not stop.is_set():
                t0 = time.perf_counter()
                h.post("/v1/predict", content=body,
                       headers={"Content-Type": "application/x-npy"}).raise_for_status()
                latencies.append(time.perf_counter() - t0)

    return [threading.Thread(target=run) for _ in range(m)]


def run_for(threads: list[threading.Thread], stop: threading.Event, seconds: float) -> float:
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def in_process_rate(method: str, stream: Stream, warm: list, seconds: float) -> float:
    import torch

    from ciosl import make_learner

    torch.set_num_threads(1)
    learner = make_learner(method)
    for x, y in warm:
        learner.learn_many(x, y)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x, y = stream.next()
        learner.learn_many(x, y)
        n += len(y)
    return n / (time.perf_counter() - t0)


def fsync_stats(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    s = float(re.search(r"^ciosl_log_fsync_seconds_sum (\S+)", text, re.M).group(1))
    c = float(re.search(r"^ciosl_log_fsync_seconds_count (\S+)", text, re.M).group(1))
    g = float(re.search(r"^ciosl_group_requests_sum (\S+)", text, re.M).group(1))
    return s / max(c, 1), g / max(c, 1)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


def bench(method: str, a: argparse.Namespace) -> None:
    stream = Stream(a.dim, a.classes, a.batch)
    warm = [stream.next() for _ in range(max(1, 2 * a.classes // a.batch))]
    local = in_process_rate(method, Stream(a.dim, a.classes, a.batch, seed=1), warm, a.seconds)
    with tempfile.TemporaryDirectory() as folder:
        nice = [] if a.writer_nice is None else ["--writer-nice", str(a.writer_nice)]
        proc, url, _ = start(folder, "--method", method, "--snapshot-seconds", "0",
                             "--snapshot-every", "0", *nice)
        try:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as h:
                for x, y in warm:
                    h.post("/v1/learn", content=_npy(x), headers={
                        "Content-Type": "application/x-npy", "X-Ciosl-Labels": str(y)})
            probe = stream.next()[0][: a.predict_rows]
            stop, idle = threading.Event(), []
            secs = run_for(predictors(url, a.predictors, probe, stop, idle), stop, a.seconds)
            idle_rate = len(idle) / secs
            stop, counts = threading.Event(), []
            secs = run_for(learners(url, a.learners, a.seconds, stream, stop, counts), stop,
                           a.seconds)
            served = sum(counts) / secs
            stop, busy, counts2 = threading.Event(), [], []
            threads = learners(url, a.learners, a.seconds, stream, stop, counts2) + predictors(
                url, a.predictors, probe, stop, busy)
            secs = run_for(threads, stop, a.seconds)
            fsync, group = fsync_stats(url)
            print(f"{method:8s} learn batch {a.batch}: served {served:8.0f} samples/s, in "
                  f"process {local:8.0f} -> ratio {served / local:.2f} | predict {a.predict_rows}"
                  f" rows: idle {idle_rate:6.0f}/s p50 {pct(idle, 50):6.1f} ms p99 "
                  f"{pct(idle, 99):6.1f} ms; under learning ({sum(counts2) / secs:.0f} "
                  f"samples/s) {len(busy) / secs:6.0f}/s p50 {pct(busy, 50):6.1f} ms p99 "
                  f"{pct(busy, 99):6.1f} ms -> p99 ratio {pct(busy, 99) / pct(idle, 99):.2f} | "
                  f"fsync {fsync * 1e3:.2f} ms per group of {group:.1f} requests", flush=True)
        finally:
            proc.kill()
            proc.wait()
    if a.recover_samples:
        recover(method, a)


def recover(method: str, a: argparse.Namespace) -> None:
    stream = Stream(a.dim, a.classes, a.batch, seed=2)
    with tempfile.TemporaryDirectory() as folder:
        proc, url, _ = start(folder, "--method", method, "--snapshot-seconds", "0",
                             "--snapshot-every", "0")
        stop, counts = threading.Event(), []
        threads = learners(url, a.learners, 0, stream, stop, counts)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        while sum(counts) < a.recover_samples:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        learn_secs = time.perf_counter() - t0
        n = sum(counts)
        proc.kill()  # SIGKILL: no snapshot, everything is in the log
        proc.wait()
        t1 = time.perf_counter()
        proc, url, line = start(folder)
        startup = time.perf_counter() - t1
        replay = float(re.search(r"replayed in (\S+) s", line).group(1))
        proc.kill()
        proc.wait()
        print(f"{method:8s} recovery of {n} samples ({n // a.batch} records, d={a.dim}): replay "
              f"{replay:.2f} s (process start included: {startup:.2f} s) vs learning them "
              f"served {learn_secs:.2f} s -> ratio {replay / learn_secs:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="slda,ncm,tinyer,ciosl")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--learners", type=int, default=2)
    p.add_argument("--predictors", type=int, default=2)
    p.add_argument("--predict-rows", type=int, default=8)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--recover-samples", type=int, default=20_000)
    p.add_argument("--writer-nice", type=int, default=None,
                   help="the server's --writer-nice (default: the server's default, 10)")
    a = p.parse_args()
    for method in a.methods.split(","):
        bench(method, a)


if __name__ == "__main__":
    main()
