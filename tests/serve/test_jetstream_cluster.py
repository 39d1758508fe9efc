"""``ciosl serve --log nats://...`` (issue 59) on real ``nats-server`` processes on loopback:

- a three-server JetStream cluster and two ciosl replicas, SIGKILLed (a NATS server, a replica,
  or both) at least 20 times while three clients teach, ask and correct with retries by id:
  every acknowledged learn and correction is applied exactly once on every replica, and both
  replicas' digests equal an in-process learner fed the stream's records in order;
- a replica started after 10,000 learn records catches up from a snapshot plus the tail;
- a duplicate id within JetStream's window is learned once; beyond it, the replica's own id
  window still answers it; beyond both, it is learned again (the documented limit).

``nats-server`` comes from PATH or ``sys.prefix/bin`` (``nats_helpers``): when it is missing
these tests fail with one line saying what to install; they never skip."""

from __future__ import annotations

import collections
import io
import re
import threading
import time

import httpx
import numpy as np
from nats_helpers import (
    NatsCluster,
    NatsServer,
    learner_entry,
    publish,
    read_stream,
    snapshot_names,
    stream_state,
)
from server_helpers import TOKEN, Server

from ciosl import make_learner
from ciosl.serial import digest
from ciosl.serve import wal
from ciosl.serve.answers import apply_request

KILLS = 20  # SIGKILLs while some client still had work, at least
D = 16  # feature width
GUARD = 300.0  # a hang guard (seconds), never a timing assertion


# ---------------------------------------------------------------------- replicas
class Replica:
    """A ``ciosl serve --log URL`` process in its own ``--dir``, killed and started again."""

    def __init__(self, folder, log: str, *flags: str):
        self.folder, self.log, self.flags = folder, log, flags
        self.server: Server | None = None
        self.lines: list[str] = []

    def start(self) -> Replica:
        self.server = Server(self.folder, "--log", self.log, *self.flags,
                             env={"CIOSL_TRACEBACK": "1"})  # a failure to start says where
        self.lines.append(self.server.lines[0])
        return self

    @property
    def url(self) -> str | None:
        s = self.server
        return s.url if s is not None and s.proc.poll() is None else None

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server = None

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {TOKEN}"})

    def state(self, name: str = "default") -> dict:
        with self.http() as h:
            r = h.get(f"/v1/learners/{name}/state")
            assert r.status_code == 200, r.text
            return r.json()

    def wait_seq(self, seq: int, name: str = "default") -> dict:
        """This replica's state once it has applied ``seq`` (a hang guard, no timing)."""
        deadline = time.monotonic() + GUARD
        while True:
            st = self.state(name)
            if st["seq"] >= seq:
                return st
            assert time.monotonic() < deadline, f"replica stuck at seq {st['seq']} < {seq}"
            time.sleep(0.05)


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(x, np.float32), allow_pickle=False)
    return buf.getvalue()


class Retry(Exception):
    """The outcome of this try is unknown (a replica or NATS down): send it again."""


def _call(replica: Replica, method: str, path: str, **kw) -> dict:
    url = replica.url
    if url is None:
        raise Retry("replica down")
    try:
        with httpx.Client(base_url=url, timeout=15,
                          headers={"Authorization": f"Bearer {TOKEN}"}) as h:
            r = h.request(method, path, **kw)
    except httpx.HTTPError as e:
        raise Retry(str(e)) from None
    if r.status_code == 503:
        raise Retry(r.text)
    assert r.status_code == 200, (path, r.status_code, r.text)
    return r.json()


# ---------------------------------------------------------------------- the clients
def _script(seed: int, learns: int = 260, asks: int = 90):
    """A client's operations: learns (id -> features, labels of 0-4) and questions (rows,
    true labels of 0-6: 5 and 6 are only ever learned from corrections)."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(0, 3, size=(7, D)).astype(np.float32)
    learn_rows, questions = {}, {}
    for i in range(learns):
        y = [int(v) for v in rng.integers(0, 5, size=int(rng.integers(1, 4)))]
        learn_rows[f"c{seed}-l{i}"] = (centres[y] + rng.normal(size=(len(y), D)).astype(
            np.float32), y)
    for i in range(asks):
        y = [int(v) for v in rng.integers(0, 7, size=int(rng.integers(1, 3)))]
        questions[f"q{i}"] = (centres[y] + rng.normal(size=(len(y), D)).astype(np.float32), y)
    ops: collections.deque = collections.deque()
    qs = iter(questions)
    for i, rid in enumerate(learn_rows):
        ops.append(("learn", rid))
        if i % 3 == 2:
            ops.append(("ask", next(qs)))
    ops.extend(("ask", q) for q in qs)
    return learn_rows, questions, ops


class Worker:
    """One client: its script done in order, each operation tried again (same id) until it is
    answered; a correction goes to the replica that answered the prediction."""

    def __init__(self, seed: int, replicas: list[Replica], gate: threading.Event):
        self.seed, self.replicas, self.gate = seed, replicas, gate  # gate: closed in restarts
        self.learns, self.questions, self.ops = _script(seed)
        self.rng = np.random.default_rng(seed + 1000)
        self.acked: dict[str, int] = {}  # learn id -> the seq answered
        self.answers: dict[tuple[int, str], tuple] = {}  # (replica, pid) -> (x, y, answered)
        self.corrected: dict[tuple[int, str], dict] = {}
        self.last_seq = 0  # the last seq this client saw acknowledged (read-your-writes)
        self.done = 0  # operations answered (kills wait for a count of them)
        self.stalled = False  # its last try failed
        self.retries = 0
        self.error: BaseException | None = None

    def run(self, stop: threading.Event) -> None:
        try:
            self._run(stop)
        except BaseException as e:  # noqa: BLE001 (the test reports it)
            self.error = e

    def _run(self, stop: threading.Event) -> None:
        since = time.monotonic()
        while self.ops and not stop.is_set():
            self.gate.wait()
            op = self.ops[0]
            try:
                self._do(op)
            except Retry:
                self.stalled, self.retries = True, self.retries + 1
                assert time.monotonic() - since < GUARD, f"{op} unanswered for {GUARD} s"
                if op[0] == "correct":  # its replica is down: the rest goes on meanwhile
                    self.ops.rotate(-1)
                time.sleep(0.02)
                continue
            self.ops.popleft()
            self.done, self.stalled, since = self.done + 1, False, time.monotonic()

    def _pick(self) -> int:
        up = [i for i, r in enumerate(self.replicas) if r.url is not None]
        if not up:
            raise Retry("no replica up")
        return int(self.rng.choice(up))

    def _do(self, op) -> None:
        kind, key = op
        if kind == "learn":
            x, y = self.learns[key]
            a = _call(self.replicas[self._pick()], "POST", "/v1/learn", content=_npy(x),
                      headers={"Content-Type": "application/x-npy",
                               "X-Ciosl-Labels": str(y), "X-Ciosl-Id": key})
            assert a["learned"] == (0 if a["duplicate"] else len(y)), a
            assert key not in self.acked or self.acked[key] == a["seq"], (key, a)
            self.acked[key] = a["seq"]
            self.last_seq = max(self.last_seq, a["seq"])
        elif kind == "ask":
            x, y = self.questions[key]
            k = self._pick()
            a = _call(self.replicas[k], "POST", f"/v1/predict?min_seq={self.last_seq}",
                      content=_npy(x), headers={"Content-Type": "application/x-npy"})
            assert a["seq"] >= self.last_seq, (a["seq"], self.last_seq)  # read your writes
            for i, pid in enumerate(a["prediction_id"]):
                self.answers[(k, pid)] = (x[i], y[i], a["label"][i])
                self.ops.insert(1, ("correct", (k, pid)))
        else:
            k, pid = key
            a = _call(self.replicas[k], "POST", "/v1/feedback",
                      json={"prediction_id": pid, "y": self.answers[key][1]})
            self.corrected.setdefault(key, a)
            self.last_seq = max(self.last_seq, a["seq"])


def _until(count, target: int, give_up=lambda: False) -> None:
    """Wait until ``count()`` reaches ``target`` (or ``give_up()``): counted work, never a
    timed sleep; the deadline is a hang guard."""
    deadline = time.monotonic() + GUARD
    while count() < target and not give_up():
        assert time.monotonic() < deadline, f"no progress within {GUARD} s"
        time.sleep(0.005)


# ---------------------------------------------------------------------- the stream replayed
def _records(url: str, name: str = "default") -> tuple[dict, list]:
    entry = learner_entry(url, name)
    msgs = read_stream(url, entry["stream"], entry["subject"])
    return entry, [(wal.decode_payload(seq, data, f"stream seq {seq}"), mid)
                   for seq, data, mid in msgs]


def _replay(method: str, records: list, settings: dict | None = None):
    """An in-process learner fed the records in order by the replicas' rules: a learn whose
    id was applied before is skipped (a duplicate past JetStream's window), a feedback row
    whose prediction was corrected before likewise, a record that raises is skipped (and
    counted). (learner, applied learn ids with their counts, applied corrections, skipped)."""
    learner = make_learner(method, **(settings or {}))
    ids: collections.Counter = collections.Counter()
    fed: collections.Counter = collections.Counter()
    skipped = 0
    for rec, _mid in records:
        x, y, fb = rec.x, rec.y, rec.fb
        if fb is None and rec.id is not None and rec.id in ids:
            continue
        if fb is not None:  # the rows of predictions not corrected before
            keep = [i for i, row in enumerate(fb)
                    if row[0] not in fed and row[0] not in {r[0] for r in fb[:i]}]
            x, y, fb = x[keep], [y[i] for i in keep], [fb[i] for i in keep]
            if not y:
                continue
        try:
            apply_request(learner, x, y)
        except Exception:  # noqa: BLE001 (a record every replica skips alike)
            skipped += 1
            continue
        if fb is None:
            ids[rec.id] += 1
        for row in fb or ():
            fed[row[0]] += 1
    return learner, ids, fed, skipped


# ---------------------------------------------------------------------- the tests
def test_cluster_sigkills_lose_nothing_and_replicas_agree(tmp_path):
    """20+ SIGKILLs of NATS servers, ciosl replicas or both while three clients teach, ask
    (read-your-writes: ``min_seq`` = the client's last acknowledged seq) and correct. Each kill
    comes after a counted number of answered operations, the restart after a few more; the
    clients wait at a gate while a process starts again (seconds, in which the other replica
    would otherwise take most of the scripts: 20 kills need work left to kill under)."""
    rng = np.random.default_rng(59)
    flags = ("--method", "ncm", "--snapshot-every", "0", "--snapshot-seconds", "0")
    with NatsCluster(tmp_path / "nats", 3) as cluster:
        replicas = [Replica(tmp_path / f"r{i}", cluster.url, *flags) for i in range(2)]
        try:
            for r in replicas:  # one after the other: the first makes the learner
                r.start()
            gate = threading.Event()
            gate.set()
            workers = [Worker(s, replicas, gate) for s in range(3)]
            stop = threading.Event()
            threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
            for t in threads:
                t.start()
            done = lambda: sum(w.done for w in workers)  # noqa: E731
            finished = lambda: not any(t.is_alive() for t in threads)  # noqa: E731
            stuck = lambda: finished() or all(w.stalled or not w.ops for w in workers)  # noqa: E731
            kinds = collections.Counter()
            busy = 0
            try:
                while busy < KILLS and not finished():
                    _until(done, done() + int(rng.integers(5, 31)), finished)
                    kind = ("nats", "replica", "both")[int(rng.integers(0, 3))]
                    i, k = int(rng.integers(0, 3)), int(rng.integers(0, 2))
                    if kind in ("nats", "both"):
                        cluster.kill(i)
                    if kind in ("replica", "both"):
                        replicas[k].kill()
                    busy += any(w.ops for w in workers)
                    kinds[kind] += 1
                    # a few operations answered while it is down (or every client waiting)
                    _until(done, done() + int(rng.integers(1, 6)), stuck)
                    gate.clear()  # restarts take seconds: the scripts wait meanwhile
                    if kind in ("replica", "both"):  # ("both": while NATS server i is down)
                        replicas[k].start()
                    if kind in ("nats", "both"):
                        cluster.start(i)
                        cluster.wait_ready()
                    gate.set()
                for t in threads:
                    t.join()
            finally:
                stop.set()
                gate.set()
                for t in threads:
                    t.join()
            for w in workers:
                assert w.error is None, f"client {w.seed}: {w.error!r}"
                assert not w.ops, f"client {w.seed}: unfinished"
            assert busy >= KILLS, f"only {busy} kills under load ({dict(kinds)})"

            entry, records = _records(cluster.url)
            last = records[-1][0].seq
            assert [r.seq for r, _ in records] == list(range(1, last + 1))  # nothing purged
            states = [r.wait_seq(last) for r in replicas]
        finally:
            for r in replicas:
                r.kill()

    learned = collections.Counter(r.id for r, _ in records if r.fb is None)
    acked = {rid: seq for w in workers for rid, seq in w.acked.items()}
    every = {rid for w in workers for rid in w.learns}
    assert set(acked) == every and set(learned) == every  # every learn, each acknowledged
    for rid, seq in acked.items():  # the seq answered holds that id
        assert records[seq - 1][0].id == rid
    answers = {key: a for w in workers for key, a in w.answers.items()}
    corrected = {key for w in workers for key in w.corrected}
    assert corrected == set(answers)
    tags = [next((tmp_path / f"r{k}").rglob("replica")).read_text().strip() for k in (0, 1)]
    rows = {row[0]: row for r, _ in records for row in r.fb or ()}
    named = {f"{tags[k]}/{pid}": (k, pid) for k, pid in answers}
    assert set(rows) == set(named)  # every correction, under its replica's prediction id
    for pid, row in rows.items():  # scored against the answer the client was given
        assert row[1] == answers[named[pid]][2], (pid, row)

    ref, ids, fed, skipped = _replay("ncm", records)
    assert set(ids) == every and set(fed) == set(rows)
    # exactly once on each replica: every learn's samples and every correction, counted
    total = sum(len(w.learns[rid][1]) for w in workers for rid in w.learns) + len(answers)
    assert ref.n_seen_ == total
    assert skipped == 0
    assert states[0]["seq"] == states[1]["seq"] == last
    assert states[0]["digest"] == states[1]["digest"] == digest(ref.state_dict())
    assert states[0]["seen"] == states[1]["seen"] == ref.n_seen_
    assert states[0]["skipped"] == states[1]["skipped"] == skipped


def test_a_new_replica_catches_up_from_a_snapshot_and_the_tail(tmp_path):
    """10,000 learn records, one sample each, published straight to the learner's stream
    (each with its msg id, the payload as replicas write it: ``wal.payload_of``): 10,000
    learns through HTTP would take minutes of a 2-core machine on round trips alone, and the
    claim is about the records a new replica reads, not the HTTP path (the test above covers
    it). Replica 1, up throughout with ``--snapshot-every 1000``, applies them and stores
    snapshots (the two newest kept, the stream purged below the older); 300 more records
    follow; replica 2, started then, loads the newest snapshot and applies the tail only."""
    flags = ("--method", "slda", "--snapshot-every", "1000", "--snapshot-seconds", "0")
    rng = np.random.default_rng(3)
    centres = rng.normal(0, 3, size=(6, D)).astype(np.float32)
    ys = rng.integers(0, 6, size=10_300)
    xs = centres[ys] + rng.normal(size=(10_300, D)).astype(np.float32)
    items = [(wal.payload_of(xs[i:i + 1], [int(ys[i])], f"bulk-{i}"), f"bulk-{i}")
             for i in range(10_300)]
    with NatsServer(tmp_path / "nats") as nats_server:
        nats_server.wait_ready()
        url = nats_server.url
        one = Replica(tmp_path / "r1", url, *flags).start()
        two = Replica(tmp_path / "r2", url, *flags)
        try:
            entry = learner_entry(url)
            acks = publish(url, entry["subject"], items[:10_000], stream=entry["stream"])
            seqs = [seq for seq, _ in acks]
            assert sorted(seqs) == list(range(1, 10_001))
            one.wait_seq(10_000)
            deadline = time.monotonic() + GUARD  # a hang guard: its snapshot of the end
            while True:
                snaps = [int(n.rpartition("/")[2]) for n in snapshot_names(
                    url, entry["stream"] + "/")]
                if snaps and max(snaps) > 9_000:
                    break
                assert time.monotonic() < deadline, f"no snapshot past 9,000: {snaps}"
                time.sleep(0.05)
            acks = publish(url, entry["subject"], items[10_000:], stream=entry["stream"])
            seqs += [seq for seq, _ in acks]
            last = max(seqs)
            assert sorted(seqs) == list(range(1, 10_301)) and not any(d for _, d in acks)
            st1 = one.wait_seq(last)
            snaps = [int(n.rpartition("/")[2]) for n in snapshot_names(
                url, entry["stream"] + "/")]
            state = stream_state(url, entry["stream"])
            assert len(snaps) == 2 and 1 < state["first_seq"] <= min(snaps)  # purged below
            assert state["messages"] == last - state["first_seq"] + 1 < last
            two.start()
            st2 = two.wait_seq(last)
            replayed = int(re.search(r"(\d+) log records replayed", two.lines[0]).group(1))
            assert replayed == last - max(snaps) >= 300, (two.lines[0], snaps)  # the tail
        finally:
            one.kill()
            two.kill()
    assert st2["digest"] == st1["digest"] and st2["seen"] == st1["seen"] == 10_300
    ref = make_learner("slda")  # and both are these samples learned in the stream's order
    for _seq, i in sorted(zip(seqs, range(10_300), strict=True)):
        apply_request(ref, xs[i:i + 1], [int(ys[i])])
    assert st1["digest"] == digest(ref.state_dict())


def test_duplicates_within_and_beyond_jetstreams_window(tmp_path):
    """Within JetStream's dedupe window a re-sent id is answered as a duplicate by either
    replica and learned once. With ``--log-dedupe-window 1`` the same id, once JetStream takes
    it again (polled by publishing it until its ack is no duplicate: no fixed sleep), lands in
    the stream a second time: every replica's own id window skips it (learned once). Beyond
    both windows (``--id-window 2``: two newer ids push it out) a re-sent id is learned again:
    the documented limit."""
    flags = ("--method", "ncm", "--snapshot-every", "0", "--snapshot-seconds", "0",
             "--log-dedupe-window", "1", "--id-window", "2", "--feedback-window", "2")
    x = np.arange(D, dtype=np.float32)[None]
    with NatsServer(tmp_path / "nats") as nats_server:
        nats_server.wait_ready()
        replicas = [Replica(tmp_path / f"r{i}", nats_server.url, *flags).start()
                    for i in range(2)]
        try:
            def learn(i, rid, y=0):
                with replicas[i].http() as h:
                    r = h.post("/v1/learn", json={"x": x.tolist(), "y": [y], "id": rid})
                    assert r.status_code == 200, r.text
                    return r.json()

            a = learn(0, "a")
            assert a["learned"] == 1 and not a["duplicate"]
            for i in (0, 1):  # within both windows: a duplicate, the original's seq
                b = learn(i, "a")
                assert b["duplicate"] and b["learned"] == 0 and b["seq"] == a["seq"]
            entry = learner_entry(nats_server.url)
            payload = wal.payload_of(x, [0], "a")
            tries = 0
            while True:  # until JetStream's 1 s window has passed: it takes "a" again
                (seq, dup), = publish(nats_server.url, entry["subject"], [(payload, "a")],
                                      stream=entry["stream"])
                tries += 1
                if not dup:
                    break
                assert tries < 10_000
                time.sleep(0.05)
            states = [r.wait_seq(seq) for r in replicas]
            assert [s["seen"] for s in states] == [1, 1]  # each replica's id window skipped it
            assert states[0]["digest"] == states[1]["digest"]
            for i in (0, 1):  # and a re-send through a replica is still its duplicate
                b = learn(i, "a")
                assert b["duplicate"] and b["learned"] == 0
            learn(0, "b")
            learn(0, "c")  # "a" leaves the replicas' id window (2 ids)
            n = 0
            while True:  # JetStream's window too
                n += 1
                c = learn(1, "a")
                if not c["duplicate"]:
                    break
                assert n < 10_000
                time.sleep(0.05)
            assert c["learned"] == 1  # beyond both windows: learned again
            last = c["seq"]
            states = [r.wait_seq(last) for r in replicas]
            assert [s["seen"] for s in states] == [4, 4]
            assert states[0]["digest"] == states[1]["digest"]
        finally:
            for r in replicas:
                r.kill()
