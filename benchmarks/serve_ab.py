"""Two builds of ``ciosl serve`` against each other, in one run: 16 clients sending one image
each (raw 28 x 28 frames as ``.npy``) to ``predict``, and one client alone, on a server of each
source tree in turn, rounds interleaved (the machine is shared: compare within a round).

    git worktree add /tmp/before <commit>
    python benchmarks/serve_ab.py /tmp/before/src src --rounds 2

The clients are ``http.client`` connections with bodies encoded before the clock starts, so
that on a 2-core machine the clients take as little of the CPU the server needs as they can.
In-process extraction (``open_extractor`` on batches of 32 of the same frames) is printed for
scale. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from serve_images import frames, in_process, npy, served  # noqa: E402


def clients(url: str, token: str, n: int, seconds: float, bodies: list[bytes]) -> dict:
    host, port = url.removeprefix("http://").split(":")
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(i: int) -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=120)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-npy"}
        k = i
        while time.perf_counter() < stop:
            t = time.perf_counter()
            c.request("POST", "/v1/predict", body=bodies[k % len(bodies)], headers=headers)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise SystemExit(f"predict: {r.status}")
            with lock:
                lat.append(time.perf_counter() - t)
            k += n
        c.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a = np.asarray(lat) * 1000
    return {"images_s": len(a) / (time.perf_counter() - t0),
            "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", help="source folders (each put first on PYTHONPATH)")
    ap.add_argument("--extractor", default="efficientnet_lite0@64")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    pool = frames(512, 28, 0)
    bodies = [npy(pool[i:i + 1]) for i in range(256)]
    labels = json.dumps([i % 10 for i in range(64)])
    print(f"in-process extraction: {in_process(args.extractor, pool, args.seconds)[0]:.0f} "
          "images/s", flush=True)
    print("| round | tree | 1 x 1 images/s | p99 ms | 16 x 1 images/s | p50 ms | p99 ms |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for r in range(args.rounds):
        for tree in args.trees:
            os.environ["PYTHONPATH"] = str(Path(tree).resolve())
            with served("--method", "slda", "--extractor", args.extractor) as (url, token):
                c = http.client.HTTPConnection(*url.removeprefix("http://").split(":"))
                c.request("POST", "/v1/learn", body=npy(pool[:64]), headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/x-npy",
                    "X-Ciosl-Labels": labels})
                assert c.getresponse().status == 200
                clients(url, token, 1, 1.0, bodies)  # warm
                one = clients(url, token, 1, args.seconds, bodies)
                many = clients(url, token, 16, args.seconds, bodies)
            print(f"| {r} | {tree} | {one['images_s']:.0f} | {one['p99_ms']:.1f} | "
                  f"{many['images_s']:.0f} | {many['p50_ms']:.1f} | {many['p99_ms']:.1f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
