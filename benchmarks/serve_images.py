"""Served images against in-process extraction, in one run (issue 56, "Measured").

Starts ``ciosl serve --method slda --extractor E`` on a free loopback port, then for 1, 4 and 16
clients sending 1 or 32 images per request (raw uint8 frames as ``.npy``, or PNG), learn and
predict, counts images/s and the request latency's p50 / p99 over ``--seconds`` each; and
calls the same extractor (``ciosl.data.extraction.open_extractor``: same device, backend,
threads and input size) in-process on the same frames, in the same run, for the ratio.

    python benchmarks/serve_images.py                    # efficientnet_lite0@64, 4 s a cell
    python benchmarks/serve_images.py --seconds 8 --extractor efficientnet_lite0@96
    CIOSL_DEVICE=cuda python benchmarks/serve_images.py  # on a GPU

A benchmark, not a test: the machine is shared, so compare ratios within one run.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def frames(n: int, side: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, side, side, 3), np.uint8)


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def png(a: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def in_process(extractor: str, pool: np.ndarray, seconds: float) -> tuple[float, str, str]:
    """Images/s of the extractor called directly on batches of 32 of the same frames."""
    from ciosl.data.extraction import open_extractor

    ex = open_extractor(extractor)
    ex(pool[:32])  # warm
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        ex(pool[(n % (len(pool) - 32)):(n % (len(pool) - 32)) + 32])
        n += 32
    return n / (time.perf_counter() - t0), ex.backend, ex.device


def cell(url: str, token: str, clients: int, per: int, kind: str, body: str, pool: np.ndarray,
         seconds: float) -> dict:
    import httpx

    lat: list[float] = []
    count = [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds
    pngs = [png(f) for f in pool[:64]] if body == "png" else None

    def client(i: int) -> None:
        with httpx.Client(base_url=url, timeout=120,
                          headers={"Authorization": f"Bearer {token}"}) as h:
            k = i
            while time.perf_counter() < stop:
                s = (k * per) % (len(pool) - per)
                labels = [int(j % 10) for j in range(s, s + per)]
                if body == "png":
                    doc = {"images": [pngs[(s + j) % 64] for j in range(per)]}
                    if kind == "learn":
                        doc["y"] = labels
                    req = {"json": doc}
                else:
                    headers = {"Content-Type": "application/x-npy"}
                    if kind == "learn":
                        headers["X-Ciosl-Labels"] = json.dumps(labels)
                    req = {"content": npy(pool[s:s + per]), "headers": headers}
                t = time.perf_counter()
                r = h.post(f"/v1/{kind}", **req)
                dt = time.perf_counter() - t
                if r.status_code != 200:
                    raise SystemExit(f"{kind}: {r.status_code} {r.text[:200]}")
                with lock:
                    lat.append(dt)
                    count[0] += per
                k += clients

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    a = np.asarray(lat) * 1000
    return {"clients": clients, "per": per, "kind": kind, "body": body,
            "images_s": count[0] / secs, "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99)), "requests": len(a)}


class served:
    """``ciosl serve`` on a free loopback port for the ``with`` block: (url, token)."""

    def __init__(self, *args: str):
        self.args, self.token = args, "bench-token-0123456789abcdef"

    def __enter__(self):
        self.tmp = tempfile.TemporaryDirectory()
        env = {**os.environ, "CIOSL_TOKEN": self.token}
        self.proc = subprocess.Popen([sys.executable, "-m", "ciosl", "serve", "--dir",
                                      str(Path(self.tmp.name) / "srv"), "--port", "0",
                                      *self.args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"server did not start: {line} {self.proc.stderr.read()}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        return found.group(1), self.token

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=120)
        self.tmp.cleanup()


def loop(url: str, token: str, seconds: float, send, stop: threading.Event | None = None
         ) -> tuple[int, list[float]]:
    """``send(h, k)`` (-> samples) until ``seconds`` pass or ``stop`` is set: (samples,
    latencies)."""
    import httpx

    n, lat, k = 0, [], 0
    end = time.perf_counter() + seconds
    with httpx.Client(base_url=url, timeout=120,
                      headers={"Authorization": f"Bearer {token}"}) as h:
        while time.perf_counter() < end and not (stop is not None and stop.is_set()):
            t = time.perf_counter()
            n += send(h, k)
            lat.append(time.perf_counter() - t)
            k += 1
    return n, lat


def post(h, path: str, x: np.ndarray, labels=None) -> int:
    headers = {"Content-Type": "application/x-npy"}
    if labels is not None:
        headers["X-Ciosl-Labels"] = json.dumps(labels)
    r = h.post(path, content=npy(x), headers=headers)
    if r.status_code != 200:
        raise SystemExit(f"{path}: {r.status_code} {r.text[:200]}")
    return len(x)


def learning_under_predictions(methods, every: list[float], seconds: float, nice: int = 10
                               ) -> list[dict]:
    """Learns of 32 x 1280 alone, then while 2 clients predict (1 row each, back to back)."""
    import httpx

    rng = np.random.default_rng(0)
    Z = rng.normal(size=(8192, 1280)).astype(np.float32)
    y = [int(v) for v in rng.integers(0, 50, len(Z))]
    rows = []
    for method in methods:
        for T in every:
            with served("--method", method, "--answer-every-ms", str(T), "--writer-nice",
                        str(nice)) as (url, token):
                def learn(h, k):
                    s = (32 * k) % (len(Z) - 32)
                    return post(h, "/v1/learn", Z[s:s + 32], y[s:s + 32])
                loop(url, token, 1.0, learn)  # classes and warm paths
                alone, _ = loop(url, token, seconds, learn)
                t0 = time.perf_counter()  # the first answer catches up on every learn
                with httpx.Client(base_url=url, timeout=600,
                                  headers={"Authorization": f"Bearer {token}"}) as h:
                    post(h, "/v1/predict", Z[:1])
                first = time.perf_counter() - t0
                stop, answered = threading.Event(), []

                def ask(i, stop=stop, answered=answered):
                    answered.append(loop(url, token, seconds + 5, lambda h, k: post(
                        h, "/v1/predict", Z[(k * 7 + i) % len(Z)][None]), stop)[0])
                askers = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
                for t in askers:
                    t.start()
                time.sleep(0.5)
                t0 = time.perf_counter()
                both, _ = loop(url, token, seconds, learn)
                secs = time.perf_counter() - t0
                stop.set()
                for t in askers:
                    t.join()
            rows.append({"method": method, "answer_every_ms": T, "nice": nice, "alone": alone / seconds,
                         "with_predictions": both / secs, "ratio": both / secs / (
                             alone / seconds), "predictions_s": sum(answered) / (secs + 0.5),
                         "first_answer_s": first})
            print(f"| {method} | {T:g} | {nice} | {alone / seconds:.0f} | {both / secs:.0f} | "
                  f"{rows[-1]['ratio']:.2f} | {rows[-1]['predictions_s']:.0f} | {first:.1f} |",
                  flush=True)
    return rows


def small_learns(seconds: float, clients: int = 16) -> dict:
    """1 sample of width 64 per request from ``clients`` clients: acknowledged learns/s
    against the same server's parse-and-check floor (``POST /v1/learn?check=1``)."""
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(4096, 64)).astype(np.float32)
    out = {}
    with served("--method", "ncm") as (url, token):
        loop(url, token, 0.5, lambda h, k: post(h, "/v1/learn", Z[k % 4096][None], [k % 10]))
        for path in ("/v1/learn?check=1", "/v1/learn"):
            res: list = []

            def client(i, path=path, res=res):
                res.append(loop(url, token, seconds, lambda h, k: post(
                    h, path, Z[(k * clients + i) % 4096][None], [k % 10])))
            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            lat = np.concatenate([r[1] for r in res]) * 1000
            out[path] = {"requests_s": len(lat) / seconds, "p50_ms": float(np.median(lat)),
                         "p99_ms": float(np.percentile(lat, 99))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extractor", default="efficientnet_lite0@64")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--side", type=int, default=28, help="side of the frames sent")
    ap.add_argument("--part", choices=("images", "learning", "small", "all"), default="all")
    ap.add_argument("--methods", default="slda,ncm,rp_lda,ranpac")
    ap.add_argument("--answer-every", default="0,100", help="--answer-every-ms values, ms")
    ap.add_argument("--writer-nice", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    result: dict = {}
    if args.part in ("learning", "all"):
        print("| method | --answer-every-ms | --writer-nice | learned alone /s | while 2 clients predict /s | "
              "ratio | predictions /s | first answer s |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        result["learning"] = learning_under_predictions(
            args.methods.split(","), [float(v) for v in args.answer_every.split(",")],
            args.seconds, args.writer_nice)
    if args.part in ("small", "all"):
        small = result["small"] = small_learns(args.seconds)
        floor, real = small["/v1/learn?check=1"], small["/v1/learn"]
        print(f"\nsmall learns, 16 clients x 1 sample of width 64: {real['requests_s']:.0f} "
              f"acknowledged/s (p50 {real['p50_ms']:.1f} ms, p99 {real['p99_ms']:.1f}); the "
              f"parse-and-check floor {floor['requests_s']:.0f}/s (p50 {floor['p50_ms']:.1f} "
              f"ms): ratio {real['requests_s'] / floor['requests_s']:.2f}")
    if args.part in ("images", "all"):
        result["images"] = images(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def images(args) -> dict:
    """Served images against the same extractor in-process (the same run)."""
    pool = frames(2048, args.side, 0)
    before = in_process(args.extractor, pool, args.seconds)
    rows, floor = [], {}
    Z = np.random.default_rng(2).normal(size=(512, 1280)).astype(np.float32)
    with served("--method", "slda") as (url, token):  # the HTTP floor: one feature row
        loop(url, token, 0.5, lambda h, k: post(h, "/v1/learn", Z[:64], list(range(64))))
        for clients in (1, 16):
            res: list = []

            def ask(i, res=res, clients=clients):
                res.append(loop(url, token, args.seconds, lambda h, k: post(
                    h, "/v1/predict", Z[(k * clients + i) % 512][None])))
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            floor[clients] = sum(r[0] for r in res) / args.seconds
    with served("--method", "slda", "--extractor", args.extractor) as (url, token):
        cell(url, token, 1, 32, "learn", "npy", pool, 1.0)  # classes, warm paths
        for clients, per in ((1, 32), (1, 1), (4, 1), (16, 1), (4, 32), (16, 32)):
            for kind in ("learn", "predict"):
                rows.append(cell(url, token, clients, per, kind, "npy", pool, args.seconds))
        for kind in ("learn", "predict"):
            rows.append(cell(url, token, 1, 32, kind, "png", pool, args.seconds))
    after = in_process(args.extractor, pool, args.seconds)
    ref, backend, device = (before[0] + after[0]) / 2, after[1], after[2]
    print(f"\n{args.extractor}, {backend} on {device}, frames {args.side}x{args.side}; "
          f"in-process extraction {ref:.0f} images/s (mean of {before[0]:.0f} before the "
          f"servers and {after[0]:.0f} after); the HTTP floor (predict of one 1280-d feature "
          f"row, no extractor): {floor[1]:.0f} requests/s with 1 client, {floor[16]:.0f} with "
          f"16 ({floor[16] / ref:.2f} of in-process extraction)\n")
    print("| clients x images | body | endpoint | images/s | / in-process | p50 ms | p99 ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        r["ratio"] = r["images_s"] / ref
        print(f"| {r['clients']} x {r['per']} | {r['body']} | {r['kind']} | "
              f"{r['images_s']:.0f} | {r['ratio']:.2f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} |")
    one = {r["kind"]: r["p99_ms"] for r in rows if r["clients"] == 1 and r["per"] == 1}
    many = {r["kind"]: r["p99_ms"] for r in rows if r["clients"] == 16 and r["per"] == 1}
    for kind in one:
        print(f"p99 16 x 1 / p99 1 x 1 ({kind}): {many[kind] / one[kind]:.2f}")
    return {"in_process": ref, "in_process_before_after": [before[0], after[0]],
            "backend": backend, "device": device, "http_floor": floor, "rows": rows}


if __name__ == "__main__":
    main()
