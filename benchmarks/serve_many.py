"""Many learners in one ``ciosl serve`` (127.0.0.1, a real process, httpx clients, JSON bodies):

1. ``--learners`` learners (width ``--dim``, ``--classes`` classes each, one sample of each
   class): the time to create them and to teach them, the server's memory (resident set, and its
   peak) after, and the latency of a first answer from an unloaded learner (one not asked since
   ``--max-loaded`` others were);
2. served learns/s (one sample a request) and the p99 of predictions asked at once, with
   ``--clients`` clients on 1 learner against the same clients spread over 10 learners;
3. feedback/s against plain learns/s on one learner (the same clients, one row a request).

    python benchmarks/serve_many.py                       # 1000 learners, dim 64, 10 classes
    python benchmarks/serve_many.py --learners 200 --seconds 5
"""

from __future__ import annotations

import argparse
import json
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
H = {"Authorization": f"Bearer {TOKEN}"}


def start(folder: str, *args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "CIOSL_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ciosl", "serve", "--dir", folder, "--port",
                             "0", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    line = proc.stdout.readline()
    found = re.search(r"(http://127\.0\.0\.1:\d+)", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, found.group(1)


def memory(pid: int) -> tuple[float, float]:
    """(resident MiB, peak resident MiB) of a process."""
    text = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024
    peak = int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) / 1024
    return round(rss, 1), round(peak, 1)


def pct(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 2) if values else float("nan")


def many(url: str, proc, a, rng) -> dict:
    centres = rng.normal(0, 2, size=(a.classes, a.dim)).astype(np.float32)
    x = (centres + rng.normal(size=centres.shape).astype(np.float32)).tolist()
    y = list(range(a.classes))
    out: dict = {}
    with httpx.Client(base_url=url, headers=H, timeout=120) as h:
        t0 = time.perf_counter()
        for i in range(a.learners):
            r = h.post("/v1/learners", json={"name": f"m{i:04d}", "method": a.method})
            assert r.status_code == 201, r.text
        out["create_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        for i in range(a.learners):
            r = h.post(f"/v1/learners/m{i:04d}/learn", json={"x": x, "y": y})
            assert r.status_code == 200, r.text
        out["teach_s"] = round(time.perf_counter() - t0, 2)
        out["rss_mib"], out["peak_rss_mib"] = memory(proc.pid)
        out["loaded"] = h.get("/v1/health").json()["loaded"]
        rows = h.get("/v1/learners").json()["learners"]
        cold = [r["name"] for r in rows if not r["loaded"]][: a.cold]
        times = []
        for name in cold:  # the first answer of a learner not in memory: load + predict
            t0 = time.perf_counter()
            r = h.post(f"/v1/learners/{name}/predict", json={"x": x[:1]})
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
        warm = []
        for name in cold:
            t0 = time.perf_counter()
            h.post(f"/v1/learners/{name}/predict", json={"x": x[:1]})
            warm.append(time.perf_counter() - t0)
        out["cold_answer_ms"] = {"n": len(times), "p50": pct(times, 50), "p90": pct(times, 90),
                                 "max": pct(times, 100)}
        out["warm_answer_ms_p50"] = pct(warm, 50)
    return out


def load(url: str, names: list[str], a, rng, *, feedback: bool = False) -> dict:
    """``a.clients`` clients learning (or giving feedback), one row a request, spread over
    ``names``, and one client asking predictions meanwhile; for ``a.seconds``."""
    row = rng.normal(size=(1, a.dim)).astype(np.float32).tolist()
    stop = threading.Event()
    counts = [0] * a.clients
    lat: list[float] = []

    def teach(k):
        name = names[k % len(names)]
        with httpx.Client(base_url=url, headers=H, timeout=60) as h:
            pids: list[str] = []
            while not stop.is_set():
                if feedback:
                    if not pids:  # questions first, not counted
                        pids = h.post(f"/v1/learners/{name}/predict",
                                      json={"x": row * 32}).json()["prediction_id"]
                    r = h.post(f"/v1/learners/{name}/feedback",
                               json={"prediction_id": pids.pop(), "y": k % a.classes})
                else:
                    r = h.post(f"/v1/learners/{name}/learn", json={"x": row, "y": [k % a.classes]})
                assert r.status_code == 200, r.text
                counts[k] += 1

    def ask():
        with httpx.Client(base_url=url, headers=H, timeout=60) as h:
            i = 0
            while not stop.is_set():
                t0 = time.perf_counter()
                h.post(f"/v1/learners/{names[i % len(names)]}/predict", json={"x": row})
                lat.append(time.perf_counter() - t0)
                i += 1

    threads = [threading.Thread(target=teach, args=(k,)) for k in range(a.clients)]
    threads.append(threading.Thread(target=ask))
    for t in threads:
        t.start()
    time.sleep(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    return {"per_s": round(sum(counts) / a.seconds, 1), "predict_p99_ms": pct(lat, 99),
            "predict_p50_ms": pct(lat, 50), "predictions": len(lat)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", type=int, default=1000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--method", default="ncm")
    p.add_argument("--max-loaded", type=int, default=256)
    p.add_argument("--cold", type=int, default=20, help="unloaded learners asked")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=3, help="each comparison run this many "
                   "times, its two sides alternating (the median is reported)")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    result: dict = {"args": vars(a)}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(tmp, "--max-loaded", str(a.max_loaded))
        try:
            result["many"] = many(url, proc, a, rng)
            names = [f"m{i:04d}" for i in range(10)]
            runs: dict = {k: [] for k in ("one_learner", "ten_learners", "learns_one",
                                          "feedback_one")}
            for _ in range(a.repeats):  # the sides alternate: a slow minute hits both
                runs["one_learner"].append(load(url, names[:1], a, rng))
                runs["ten_learners"].append(load(url, names, a, rng))
                runs["learns_one"].append(load(url, names[1:2], a, rng))
                runs["feedback_one"].append(load(url, names[1:2], a, rng, feedback=True))
            for key, rows in runs.items():
                result[key] = {f: float(np.median([r[f] for r in rows])) for f in rows[0]}
                result[key]["per_s_runs"] = [r["per_s"] for r in rows]
            result["rss_mib_end"], result["peak_rss_mib_end"] = memory(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=600)
    r = result
    r["ten_over_one"] = round(r["ten_learners"]["per_s"] / r["one_learner"]["per_s"], 2)
    r["feedback_over_learns"] = round(r["feedback_one"]["per_s"] / r["learns_one"]["per_s"], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
