"""``ciosl serve --log nats://...`` (issue 59) against the local folder log, on this machine:
every process on loopback (NATS servers, ciosl replicas, clients), so the figures are ratios
measured in one run, not a network's. Prints a table (``--out FILE``: the same as JSON):

- served learns/s (``--method``, ``--batch`` samples per request, ``--clients`` learning
  clients, ``--seconds`` each) through the local folder log (an fsync per group commit),
  JetStream R1 (one server) and R3 (a three-server cluster) with the servers' default
  ``sync_interval`` (an fsync every 2 minutes) and with ``sync_interval: always`` (an fsync
  per write), interleaved over ``--rounds``; each against the same learner learning the same
  batches in this process;
- a new replica's catch-up: the records of the R3 stream read and applied at its start
  (``N log records replayed in S s``) against in-process learning of the same records;
- the lag from a learn's acknowledgement by replica 1 to its being applied by replica 2 (R3;
  polled on replica 2's ``/v1/health``, whose ``seen`` the ack names): p50 / p99 / max;
- the time learns are refused after a NATS server is SIGKILLed (R3), for the stream's leader
  and for a follower: from the kill to the next acknowledged learn, and the refusals;
- predictions/s (``--predictors`` clients, ``--predict-rows`` rows) against one replica and
  spread over two (both on this machine's cores: with two cores, a second replica adds no CPU).

    python benchmarks/serve_cluster.py                       # slda, d=1280, batch 32
    python benchmarks/serve_cluster.py --dim 256 --seconds 10 --out cluster.json
"""

from __future__ import annotations

import argparse
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

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
from nats_helpers import NatsCluster, NatsServer, learner_entry, read_stream  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


class Stream:
    """Batches of a stream of Gaussian classes (``classes`` of them, width ``dim``)."""

    def __init__(self, dim: int, classes: int, batch: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.centres = rng.normal(0, 2, size=(classes, dim)).astype(np.float32)
        self.rng, self.batch, self.lock = rng, batch, threading.Lock()

    def next(self) -> tuple[np.ndarray, list[int]]:
        with self.lock:
            y = self.rng.integers(0, len(self.centres), size=self.batch)
            x = self.centres[y] + self.rng.normal(size=(self.batch, self.centres.shape[1]))
        return x.astype(np.float32), [int(v) for v in y]


class Replica:
    ALL: list[Replica] = []  # every one started (killed at the end, whatever happened)

    def __init__(self, folder: str, *args: str):
        env = {**os.environ, "CIOSL_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "ciosl", "serve", "--dir", folder,
                                      "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        Replica.ALL.append(self)
        self.line = self.proc.stdout.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", self.line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"the server did not start: {self.line!r}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.url = found.group(1)

    def http(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def learn(h: httpx.Client, x: np.ndarray, y: list, rid: str | None = None) -> httpx.Response:
    headers = {"Content-Type": "application/x-npy", "X-Ciosl-Labels": json.dumps(y)}
    if rid is not None:
        headers["X-Ciosl-Id"] = rid
    return h.post("/v1/learn", content=_npy(x), headers=headers)


def load(urls: list[str], clients: int, seconds: float, stream: Stream) -> float:
    """``clients`` threads learning batches for ``seconds``: samples acknowledged per second."""
    stop, counts = threading.Event(), []

    def run(url):
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as h:
            while not stop.is_set():
                x, y = stream.next()
                learn(h, x, y).raise_for_status()
                counts.append(len(y))

    threads = [threading.Thread(target=run, args=(urls[i % len(urls)],))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def predictions(urls: list[str], clients: int, seconds: float, x: np.ndarray) -> tuple:
    stop, lat = threading.Event(), []
    body = _npy(x)

    def run(url):
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as h:
            while not stop.is_set():
                t0 = time.perf_counter()
                h.post("/v1/predict", content=body,
                       headers={"Content-Type": "application/x-npy"}).raise_for_status()
                lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=run, args=(urls[i % len(urls)],))
               for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return len(lat) / (time.perf_counter() - t0), pct(lat, 50), pct(lat, 99)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else float("nan")


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


def replay_in_process(method: str, records: list) -> float:
    """Seconds for this process to decode and apply ``records`` (stream messages) as a replica
    does: the same decoder, the same calls."""
    import torch

    from ciosl import make_learner
    from ciosl.serve import wal
    from ciosl.serve.answers import apply_request

    torch.set_num_threads(1)
    learner = make_learner(method)
    t0 = time.perf_counter()
    for seq, data, _mid in records:
        rec = wal.decode_payload(seq, data, "stream")
        apply_request(learner, rec.x, rec.y)
    return time.perf_counter() - t0


def seen_of(url: str) -> int:
    return int(httpx.get(url + "/v1/health", timeout=30).json().get("seen", -1))


def lag(one: Replica, two: Replica, stream: Stream, n: int) -> list[float]:
    """Seconds from replica 1's acknowledgement of a learn to replica 2's ``seen`` reaching
    the ``seen`` that acknowledgement named (one learn at a time)."""
    out = []
    with one.http() as h, httpx.Client(base_url=two.url, timeout=30) as h2:
        for _ in range(n):
            x, y = stream.next()
            r = learn(h, x, y)
            t0 = time.perf_counter()
            r.raise_for_status()
            seen = r.json()["seen"]
            while int(h2.get("/v1/health").json().get("seen", -1)) < seen:
                time.sleep(0.0005)
            out.append(time.perf_counter() - t0)
    return out


def refused(cluster: NatsCluster, one: Replica, stream: Stream, victim: int,
            after: int = 30) -> dict:
    """One client learning one batch at a time (retried with its id on 503 or a transport
    failure) while NATS server ``victim`` is SIGKILLed: the longest wait between two
    acknowledged learns from the last before the kill to the ``after``-th after it (how long
    learning stalled), the refused tries (503s) meanwhile, and the typical wait before; then
    the server is started again."""
    stop, acks, fails = threading.Event(), [], []

    def run():
        with one.http(timeout=30) as h:
            i = 0
            while not stop.is_set():
                x, y = stream.next()
                rid = f"refused-{victim}-{i}"
                while not stop.is_set():
                    try:
                        r = learn(h, x, y, rid)
                    except httpx.HTTPError:
                        fails.append(time.perf_counter())
                        continue
                    if r.status_code == 200:
                        acks.append(time.perf_counter())
                        break
                    fails.append(time.perf_counter())
                    time.sleep(0.01)
                i += 1

    t = threading.Thread(target=run)
    t.start()
    while len(acks) < 20:
        time.sleep(0.01)
    t_kill = time.perf_counter()
    cluster.kill(victim)
    while sum(a > t_kill for a in acks) < after:
        time.sleep(0.01)
    stop.set()
    t.join()
    before = [a for a in acks if a <= t_kill]
    spans = [before[-1]] + [a for a in acks if a > t_kill][:after]
    gaps = [b - a for a, b in zip(before, before[1:], strict=False)]
    cluster.start(victim)
    cluster.wait_ready()
    return {"stalled_s": max(b - a for a, b in zip(spans, spans[1:], strict=False)),
            "refusals": sum(f > t_kill for f in fails), "typical_gap_ms": pct(gaps, 50)}


def connected_to(cluster: NatsCluster) -> int | None:
    """The server holding the one client connection left (replica 1's), by /connz."""
    for i, server in enumerate(cluster.servers):
        if server.alive:
            body = httpx.get(f"http://127.0.0.1:{server.monitor}/connz", timeout=5).json()
            if body.get("num_connections", 0) > 0:
                return i
    return None


def stream_leader(url: str, stream: str) -> str:
    import asyncio

    import nats

    async def go():
        nc = await nats.connect(servers=url.split(","))
        try:
            info = await nc.jetstream().stream_info(stream)
            return info.cluster.leader
        finally:
            await nc.close()

    return asyncio.run(go())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="slda")
    p.add_argument("--dim", type=int, default=1280)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lag-learns", type=int, default=300)
    p.add_argument("--catchup-rounds", type=int, default=3)
    p.add_argument("--predictors", type=int, default=4)
    p.add_argument("--predict-rows", type=int, default=8)
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    t_start = time.perf_counter()
    rows: dict = {"config": vars(a).copy(), "load": os.getloadavg()}
    flags = ["--method", a.method, "--snapshot-every", "0", "--snapshot-seconds", "0"]
    stream = Stream(a.dim, a.classes, a.batch)
    warm = [stream.next() for _ in range(max(1, 2 * a.classes // a.batch))]
    local = in_process_rate(a.method, Stream(a.dim, a.classes, a.batch, seed=1), warm,
                            a.seconds)
    rows["in_process_learns_per_s"] = local
    with tempfile.TemporaryDirectory() as tmp:
        single = NatsServer(Path(tmp) / "single")
        cluster = NatsCluster(Path(tmp) / "cluster", 3)
        single_sync = NatsServer(Path(tmp) / "single-sync", sync="always")
        cluster_sync = NatsCluster(Path(tmp) / "cluster-sync", 3, sync="always")
        try:
            single.wait_ready()
            single_sync.wait_ready()
            servers = {"folder": Replica(f"{tmp}/folder", *flags),
                       "R1": Replica(f"{tmp}/r1", "--log", single.url, *flags),
                       "R3": Replica(f"{tmp}/r3", "--log", cluster.url, *flags),
                       "R1 sync": Replica(f"{tmp}/r1s", "--log", single_sync.url, *flags),
                       "R3 sync": Replica(f"{tmp}/r3s", "--log", cluster_sync.url, *flags)}
            for s in servers.values():
                with s.http() as h:
                    for x, y in warm:
                        learn(h, x, y).raise_for_status()
            rates: dict[str, list[float]] = {k: [] for k in servers}
            for _ in range(a.rounds):  # interleaved: the machine's drift spread over all
                for name, s in servers.items():
                    rates[name].append(load([s.url], a.clients, a.seconds, stream))
            rows["learns_per_s"] = {k: float(np.mean(v)) for k, v in rates.items()}
            for k in ("folder", "R1", "R1 sync", "R3 sync"):
                servers[k].kill()
            single_sync.close()
            cluster_sync.close()

            # new replicas on the R3 stream: their catch-up against this process's, in
            # alternating rounds (the median of each)
            entry = learner_entry(cluster.url)
            records = read_stream(cluster.url, entry["stream"], entry["subject"])
            ins, outs, starts = [], [], []
            for r in range(a.catchup_rounds):
                ins.append(replay_in_process(a.method, records))
                t0 = time.perf_counter()
                two = Replica(f"{tmp}/late{r}", "--log", cluster.url, *flags)
                with two.http() as h:
                    while h.get("/v1/state").json()["seq"] < records[-1][0]:
                        time.sleep(0.01)
                starts.append(time.perf_counter() - t0)
                found = re.search(r"(\d+) log records replayed in (\S+) s", two.line)
                assert found and int(found.group(1)) == len(records), two.line
                outs.append(float(found.group(2)))
                if r < a.catchup_rounds - 1:
                    two.kill()
            in_proc, secs = float(np.median(ins)), float(np.median(outs))
            rows["catch_up"] = {"records": len(records), "replica_s": secs,
                                "in_process_s": in_proc, "rounds": a.catchup_rounds,
                                "with_process_start_s": float(np.median(starts)),
                                "ratio": in_proc / secs}

            one = servers["R3"]
            lags = lag(one, two, stream, a.lag_learns)
            rows["lag_ms"] = {"p50": pct(lags, 50), "p99": pct(lags, 99),
                              "max": max(lags) * 1e3, "n": len(lags)}

            probe = stream.next()[0][: a.predict_rows]
            rows["predict"] = {
                "one": predictions([one.url], a.predictors, a.seconds, probe),
                "two": predictions([one.url, two.url], a.predictors, a.seconds, probe)}

            two.kill()  # from here on only replica 1 holds a NATS connection
            rows["refused"] = {}
            for _ in range(4):  # each role once: the replica moves when its server dies
                leader = int(stream_leader(cluster.url, entry["stream"])[1:])
                own = connected_to(cluster)
                other = next((i for i in range(3) if i not in (leader, own)), None)
                choices = [("replica's own follower", own if own != leader else None),
                           ("leader", leader), ("other follower", other)]
                role, victim = next(((k, v) for k, v in choices
                                     if v is not None and k not in rows["refused"]),
                                    (None, None))
                if role is None:
                    break
                rows["refused"][role] = {**refused(cluster, one, stream, victim),
                                         "server": f"n{victim}", "leader": leader == victim,
                                         "replica_connected": own == victim}
            one.kill()
        finally:
            for rep in Replica.ALL:
                if rep.proc.poll() is None:
                    rep.kill()
            single.close()
            cluster.close()
            single_sync.close()
            cluster_sync.close()
    rows["seconds"] = time.perf_counter() - t_start
    print_table(rows, a)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


def print_table(r: dict, a) -> None:
    lp = r["learns_per_s"]
    local = r["in_process_learns_per_s"]
    print(f"{a.method}, d={a.dim}, batch {a.batch}, {a.clients} learning clients, "
          f"{a.rounds} x {a.seconds:g} s each (load at start {r['load'][0]:.2f})")
    print("| log (sync: the NATS servers' sync_interval always) | learns/s | / folder | "
          "/ in process |")
    print("|---|---:|---:|---:|")
    for k in ("folder", "R1", "R3", "R1 sync", "R3 sync"):
        print(f"| {k} | {lp[k]:.0f} | {lp[k] / lp['folder']:.2f} | {lp[k] / local:.2f} |")
    print(f"| in process | {local:.0f} | {local / lp['folder']:.2f} | 1.00 |")
    c = r["catch_up"]
    print(f"catch-up (R3), median of {c['rounds']}: {c['records']} records in "
          f"{c['replica_s']:.2f} s at a new replica's start (process start and all: "
          f"{c['with_process_start_s']:.2f} s); in process {c['in_process_s']:.2f} s -> rate "
          f"ratio {c['ratio']:.2f}")
    lg = r["lag_ms"]
    print(f"lag, ack on replica 1 -> applied on replica 2 (R3, {lg['n']} learns): p50 "
          f"{lg['p50']:.1f} ms, p99 {lg['p99']:.1f} ms, max {lg['max']:.1f} ms")
    for f in r["refused"].values():
        what = "the stream's leader" if f["leader"] else "a follower"
        own = ", replica 1's own server" if f["replica_connected"] else ""
        print(f"SIGKILL of {what} ({f['server']}{own}): learning stalled {f['stalled_s']:.2f} s "
              f"at most ({f['refusals']} tries refused; a learn took "
              f"{f['typical_gap_ms']:.1f} ms before)")
    one, two = r["predict"]["one"], r["predict"]["two"]
    print(f"predictions ({a.predictors} clients x {a.predict_rows} rows): 1 replica "
          f"{one[0]:.0f}/s (p50 {one[1]:.1f} ms, p99 {one[2]:.1f} ms); 2 replicas "
          f"{two[0]:.0f}/s (p50 {two[1]:.1f} ms, p99 {two[2]:.1f} ms) -> "
          f"{two[0] / one[0]:.2f}x on {os.cpu_count()} cores")
    print(f"whole run: {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
