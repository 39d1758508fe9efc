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


def in_process(extractor: str, pool: np.ndarray, seconds: float) -> float:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--extractor", default="efficientnet_lite0@64")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--side", type=int, default=28, help="side of the frames sent")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    pool = frames(2048, args.side, 0)
    token = "bench-token-0123456789abcdef"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "CIOSL_TOKEN": token}
        proc = subprocess.Popen([sys.executable, "-m", "ciosl", "serve", "--dir",
                                 str(Path(tmp) / "srv"), "--method", "slda", "--port", "0",
                                 "--extractor", args.extractor], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            line = proc.stdout.readline()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if not found:
                raise SystemExit(f"server did not start: {line} {proc.stderr.read()}")
            url = found.group(1)
            rows = []
            warm = cell(url, token, 1, 32, "learn", "npy", pool, 1.0)  # classes, warm paths
            del warm
            for clients, per in ((1, 32), (1, 1), (4, 1), (16, 1), (4, 32), (16, 32)):
                for kind in ("learn", "predict"):
                    rows.append(cell(url, token, clients, per, kind, "npy", pool, args.seconds))
            for kind in ("learn", "predict"):
                rows.append(cell(url, token, 1, 32, kind, "png", pool, args.seconds))
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    ref, backend, device = in_process(args.extractor, pool, args.seconds)
    print(f"{args.extractor}, {backend} on {device}, frames {args.side}x{args.side}; in-process "
          f"extraction {ref:.0f} images/s (same run)\n")
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
        print(f"\np99 16 x 1 / p99 1 x 1 ({kind}): {many[kind] / one[kind]:.2f}", end="")
    print()
    if args.json:
        Path(args.json).write_text(json.dumps({"in_process": ref, "backend": backend,
                                               "device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
