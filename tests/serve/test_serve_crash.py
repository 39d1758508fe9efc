"""SIGKILL under load, 21 times: every acknowledged id survives, none is applied twice (retried
requests included), and the recovered state is the replay of the log, bit for bit."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
from server_helpers import Server

from ciosl import make_learner
from ciosl.serial import digest
from ciosl.serve.client import ServerError
from ciosl.serve.service import log_ids

KILLS = 21


def _requests(n=800, d=8, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        k = int(rng.integers(1, 4))
        y = [int(v) for v in rng.integers(0, 12, size=k)]
        out[f"r{i}"] = (rng.normal(size=(k, d)).astype(np.float32), y)
    return out


def test_sigkill_under_load_loses_no_acknowledged_learn_and_doubles_none(tmp_path):
    reqs = _requests()
    todo: queue.Queue = queue.Queue()
    for rid in reqs:
        todo.put(rid)
    acked: set[str] = set()
    duplicates: list[str] = []
    rng = np.random.default_rng(1)
    method = ["--method", "ncm", "--snapshot-every", "60"]
    for cycle in range(KILLS + 1):
        with Server(tmp_path, *(method if cycle == 0 else [])) as s:
            stop = threading.Event()

            def client(s=s, stop=stop):
                with s.client(retries=0, timeout=10) as c:
                    while not stop.is_set():
                        try:
                            rid = todo.get_nowait()
                        except queue.Empty:
                            return
                        x, y = reqs[rid]
                        try:
                            answer = c.learn_many(x, y, id=rid)
                        except (ServerError, Exception):  # noqa: BLE001 (killed: unknown)
                            todo.put(rid)  # its fate is unknown: send it again later
                            return
                        acked.add(rid)
                        if answer["duplicate"]:
                            duplicates.append(rid)

            threads = [threading.Thread(target=client) for _ in range(3)]
            for t in threads:
                t.start()
            if cycle < KILLS:
                time.sleep(float(rng.uniform(0.05, 0.5)))
                s.kill()  # SIGKILL, mid-load
                stop.set()
                for t in threads:
                    t.join()
            else:  # the last life: finish the queue, then read the state
                for t in threads:
                    t.join()
                with s.client() as c:
                    final = c.state()
                s.stop()
    assert todo.empty() and acked == set(reqs)
    applied = [rid for _, rid in log_ids(tmp_path)]
    assert len(applied) == len(set(applied)) == len(reqs)  # each exactly once
    ref = make_learner("ncm")
    for rid in applied:
        x, y = reqs[rid]
        (ref.learn_one(x[0], y[0]) if len(y) == 1 else ref.learn_many(x, y))
    assert final["seen"] == sum(len(y) for _, y in reqs.values())
    assert digest(ref.state_dict()) == final["digest"]
