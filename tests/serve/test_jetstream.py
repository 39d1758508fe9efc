"""``ciosl serve --log nats://...``: one JetStream server on a loopback port of the test's own,
ciosl replicas as real processes. Learns are acknowledged with the stream's seq, a retry by id
learns once, refused input never enters the stream; two replicas hold equal digests at equal
seq, equal to an in-process learner fed the stream's records in order; learners made through
one replica are served by the other; ``min_seq`` reads one's own writes; a record that fails to
apply is skipped alike everywhere; snapshots in the object store let a late replica catch up
after the stream was purged, skipping a damaged one."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest
from nats_helpers import NatsServer, free_port, learner_entry
from server_helpers import TOKEN, Server

from ciosl.learners.registry import get_method
from ciosl.serial import digest
from ciosl.serve import wal
from ciosl.serve.answers import apply_request

WAIT = "3"  # --min-seq-wait of the replicas here


# ---------------------------------------------------------------------- nats-py, in the test
def _nats(url: str, work):
    """Run ``work(js)`` (a coroutine function) on a fresh nats-py connection."""
    import nats

    async def go():
        nc = await nats.connect(url)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()
    return asyncio.run(go())


def _entry(url: str, name: str) -> dict:
    async def work(js):
        kv = await js.key_value("ciosl_learners")
        return json.loads((await kv.get(name)).value)
    return _nats(url, work)


def _info(url: str, stream: str) -> dict:
    async def work(js):
        s = (await js.stream_info(stream)).state
        return {"messages": s.messages, "first_seq": s.first_seq, "last_seq": s.last_seq}
    return _nats(url, work)


def _records(url: str, stream: str) -> list[wal.Record]:
    """Every record of ``stream`` in order, decoded with the folder log's decoder."""
    async def work(js):
        s = (await js.stream_info(stream)).state
        out = []
        for seq in range(max(1, s.first_seq), s.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            out.append(wal.decode_payload(seq, msg.data, stream))
        return out
    return _nats(url, work)


def _publish(url: str, subject: str, payload: bytes, msg_id: str) -> int:
    async def work(js):
        return (await js.publish(subject, payload, headers={"Nats-Msg-Id": msg_id})).seq
    return _nats(url, work)


def _in_process(records: list[wal.Record], method: str) -> tuple[str, int]:
    """The digest of a learner fed ``records`` in order (a record that raises: skipped),
    and how many were skipped."""
    learner, skipped = get_method(method)(), 0
    for r in records:
        try:
            apply_request(learner, r.x, r.y, r.seq)
        except Exception:
            skipped += 1
    return digest(learner.state_dict()), skipped


# ---------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def nats_url(tmp_path_factory):
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        server.wait_ready()
        yield server.url


@pytest.fixture(scope="module")
def pair(nats_url, tmp_path_factory):
    """Two replicas on the same log (the learner 'default' is ncm)."""
    root = tmp_path_factory.mktemp("replicas")
    args = ("--log", nats_url, "--min-seq-wait", WAIT, "--snapshot-every", "0",
            "--snapshot-seconds", "0")
    with Server(root / "r1", *args, "--method", "ncm") as r1, Server(root / "r2", *args) as r2:
        yield r1, r2


def _create(server, name: str, method: str = "ncm") -> None:
    with server.http() as h:
        r = h.post("/v1/learners", json={"name": name, "method": method})
        assert r.status_code == 201, r.text


def _learn(server, name: str, x, y, rid=None) -> httpx.Response:
    body = {"x": np.asarray(x, dtype=np.float32).tolist(), "y": y}
    if rid is not None:
        body["id"] = rid
    with server.http() as h:
        return h.post(f"/v1/learners/{name}/learn", json=body)


def _state(server, name: str, min_seq: int = 0) -> dict:
    with server.http() as h:
        if min_seq:  # wait until applied
            r = h.post(f"/v1/learners/{name}/predict?min_seq={min_seq}",
                       json={"x": [[0.0] * 4]})
            assert r.status_code == 200, r.text
        return h.get(f"/v1/learners/{name}/state").json()


# ---------------------------------------------------------------------- tests
def test_learns_are_acknowledged_with_the_stream_seq_once_per_id(pair, nats_url):
    r1, r2 = pair
    _create(r1, "ack")
    stream = _entry(nats_url, "ack")["stream"]
    rng = np.random.default_rng(0)
    first = _learn(r1, "ack", rng.normal(size=(3, 4)), [0, 1, 0], rid="req-1").json()
    assert first == {"learned": 3, "duplicate": False, "seq": 1, "seen": 3}
    again = _learn(r1, "ack", rng.normal(size=(3, 4)), [0, 1, 0], rid="req-1").json()
    assert again["duplicate"] is True and again["learned"] == 0 and again["seq"] == 1
    other = _learn(r2, "ack", rng.normal(size=(3, 4)), [0, 1, 0], rid="req-1").json()
    assert other["duplicate"] is True and other["learned"] == 0 and other["seq"] == 1
    assert _learn(r2, "ack", rng.normal(size=(1, 4)), [2]).json()["seq"] == 2
    assert _info(nats_url, stream)["messages"] == 2
    # refused input never enters the stream
    bad_label = _learn(r1, "ack", rng.normal(size=(1, 4)), [{"a": 1}])
    wide = _learn(r2, "ack", rng.normal(size=(1, 6)), [1])
    surrogate = r1.http().post("/v1/learners/ack/learn", content=b'{"x": [[1,2,3,4]], '
                               b'"y": ["\\ud800"]}', headers={"Content-Type": "application/json"})
    assert bad_label.status_code == 400 and "y" in bad_label.json()["error"]
    assert wide.status_code == 422 and "width 6" in wide.json()["error"]
    assert surrogate.status_code == 400 and "lone surrogate" in surrogate.json()["error"]
    assert _info(nats_url, stream)["messages"] == 2
    assert [r.id for r in _records(nats_url, stream)] == ["req-1", None]  # no id made up
    s1, s2 = _state(r1, "ack", 2), _state(r2, "ack", 2)
    assert s1["seen"] == s2["seen"] == 4 and s1["digest"] == s2["digest"]


def test_two_replicas_equal_each_other_and_an_in_process_learner(pair, nats_url):
    r1, r2 = pair
    _create(r1, "twin", "slda")
    rng = np.random.default_rng(1)
    seqs = []
    for i in range(24):
        server = (r1, r2)[i % 2]
        n = 1 + i % 3
        r = _learn(server, "twin", rng.normal(size=(n, 4)), [int(v) for v in
                                                              rng.integers(0, 5, n)], f"t-{i}")
        assert r.status_code == 200, r.text
        seqs.append(r.json()["seq"])
    assert sorted(seqs) == list(range(1, 25))
    s1, s2 = _state(r1, "twin", 24), _state(r2, "twin", 24)
    assert s1["seq"] == s2["seq"] == 24 and s1["digest"] == s2["digest"]
    records = _records(nats_url, _entry(nats_url, "twin")["stream"])
    assert [r.seq for r in records] == list(range(1, 25))
    assert sorted(r.id for r in records) == sorted(f"t-{i}" for i in range(24))
    assert _in_process(records, "slda") == (s1["digest"], 0)


def test_a_learner_made_through_one_replica_is_served_by_the_other(pair, nats_url):
    r1, r2 = pair
    _create(r1, "shared")
    r = _learn(r2, "shared", np.ones((2, 4)), ["a", "b"])  # at once, no waiting
    assert r.status_code == 200 and r.json()["seq"] == 1
    with r2.http() as h:
        assert "shared" in [row["name"] for row in h.get("/v1/learners").json()["learners"]]
        again = h.post("/v1/learners", json={"name": "shared", "method": "slda"})
        assert again.status_code == 409 and "exists already" in again.json()["error"]
        refused = h.delete("/v1/learners/shared")
        assert refused.status_code == 400 and "?confirm=shared" in refused.json()["error"]
        stream = _entry(nats_url, "shared")["stream"]
        gone = h.delete("/v1/learners/shared?confirm=shared")
        assert gone.status_code == 200 and gone.json() == {"deleted": "shared", "stream": stream}
        assert h.get("/v1/learners/shared/state").status_code == 404
    assert _info(nats_url, stream)["messages"] == 1  # the stream stays, for the operator
    with r1.http() as h:  # the other replica forgets it within its cache's second
        for _ in range(200):
            r = h.get("/v1/learners/shared/state")
            if r.status_code == 404:
                break
            threading.Event().wait(0.05)
        assert r.status_code == 404 and "does not exist" in r.json()["error"]
    _create(r1, "shared")  # made again: a new stream, nothing of the old one
    assert _entry(nats_url, "shared")["stream"] != stream
    assert _state(r2, "shared")["seq"] == 0


def test_predict_with_min_seq_waits_for_the_seq_or_says_how_far_it_is(pair):
    r1, r2 = pair
    _create(r1, "rw")
    seq = _learn(r1, "rw", np.ones((1, 4)), [1]).json()["seq"]
    answers = {}

    def ask():
        with r2.http() as h:
            answers["late"] = h.post(f"/v1/learners/rw/predict?min_seq={seq + 1}",
                                     json={"x": [[1.0, 1, 1, 1]]})
    with r2.http() as h:
        assert h.post(f"/v1/learners/rw/predict?min_seq={seq}",
                      json={"x": [[1.0, 1, 1, 1]]}).status_code == 200
        asking = threading.Thread(target=ask)
        asking.start()
        assert _learn(r1, "rw", np.zeros((1, 4)), [2]).json()["seq"] == seq + 1
        asking.join()
        assert answers["late"].status_code == 200, answers["late"].text
        assert answers["late"].json()["seq"] == seq + 1
        far = h.post(f"/v1/learners/rw/predict?min_seq={seq + 50}", json={"x": [[1.0] * 4]})
        assert far.status_code == 503
        assert far.json()["error"] == (f"this replica has applied up to seq {seq + 1}, "
                                       f"{seq + 50} asked; retry or ask another replica")
        bad = h.post("/v1/learners/rw/predict?min_seq=x", json={"x": [[1.0] * 4]})
        assert bad.status_code == 400 and "min_seq" in bad.json()["error"]
    client = r2.client(learner="rw")
    assert list(client.predict(np.ones((1, 4)), min_seq=seq + 1)) == [1]


def test_feedback_goes_to_the_replica_that_answered_and_is_applied_by_all(pair):
    r1, r2 = pair
    _create(r2, "fb")
    assert _learn(r2, "fb", np.eye(4)[:2], ["a", "b"]).status_code == 200
    with r1.http() as h1, r2.http() as h2:
        asked = h1.post("/v1/learners/fb/predict", json={"x": [[1.0, 0, 0, 0]]}).json()
        pid = asked["prediction_id"][0]
        other = h2.post("/v1/learners/fb/feedback", json={"prediction_id": pid, "y": "b"})
        assert other.status_code == 404 and "not issued by this replica" in other.json()["error"]
        own = h2.post("/v1/learners/fb/predict", json={"x": [[1.0, 0, 0, 0]]}).json()
        assert own["prediction_id"][0] != pid  # each replica numbers its own
        done = h1.post("/v1/learners/fb/feedback", json={"prediction_id": pid, "y": "b"})
        assert done.status_code == 200 and done.json()["learned"] == 1, done.text
        again = h1.post("/v1/learners/fb/feedback", json={"prediction_id": pid, "y": "b"})
        assert again.json()["learned"] == 0 and again.json()["duplicate"] == [True]
        seq = done.json()["seq"]
        s1, s2 = _state(r1, "fb", seq), _state(r2, "fb", seq)
        assert s1["digest"] == s2["digest"] and s1["seen"] == 3
        live = [h.get("/v1/learners/fb/metrics").json() for h in (h1, h2)]
        assert live[0]["feedback"] == live[1]["feedback"] == 1
        assert live[0]["accuracy"] == live[1]["accuracy"] == 0.0  # answered a, truly b


def test_two_replicas_with_the_same_tag_never_issue_the_same_prediction_id(pair, nats_url):
    """Prediction ids are numbered from an offset drawn from the replica's tag: two replicas
    whose tags gave the same offset (1 in 99,999) issued the same ids, and a correction sent to
    the wrong one corrected another answer. The offset is claimed in the bucket; a taken one is
    drawn again."""
    r1, r2 = pair
    _create(r1, "offsets")
    assert _learn(r1, "offsets", np.eye(4)[:2], ["a", "b"]).status_code == 200
    with r1.http() as h1:
        pid1 = h1.post("/v1/learners/offsets/predict", json={"x": [[1.0, 0, 0, 0]]}).json()[
            "prediction_id"][0]
    stream = learner_entry(nats_url, "offsets")["stream"]
    t1 = int((r1.folder / "streams" / stream / "replica").read_text(), 16)
    t2 = t1 + 99_999 if t1 + 99_999 < 16**12 else t1 - 99_999  # another tag, the same offset
    tag = f"{t2:012x}"
    own = r2.folder / "streams" / stream  # r2 has not loaded 'offsets' yet: it takes this tag
    own.mkdir(parents=True, exist_ok=True)
    (own / "replica").write_text(tag)
    with r2.http() as h2:
        pid2 = h2.post("/v1/learners/offsets/predict", json={"x": [[1.0, 0, 0, 0]]}).json()[
            "prediction_id"][0]
        assert pid2 != pid1  # the same number of the same offset before
        wrong = h2.post("/v1/learners/offsets/feedback", json={"prediction_id": pid1, "y": "b"})
        assert wrong.status_code == 404 and "not issued by this replica" in wrong.text
    assert (own / "replica").read_text().strip() != tag.strip()  # drawn again, and kept


def test_a_record_that_fails_to_apply_is_skipped_alike_on_every_replica(pair, nats_url):
    r1, r2 = pair
    _create(r1, "skip")
    entry = _entry(nats_url, "skip")
    assert _learn(r1, "skip", np.ones((2, 4)), [1, 2]).status_code == 200
    payload = wal.payload_of(np.ones((1, 6), np.float32), [3], "odd")  # width 6, not 4
    bad = _publish(nats_url, entry["subject"], payload, "odd")
    with r1.http() as h:  # its id again, within JetStream's window: as the original failed
        retry = h.post("/v1/learners/skip/learn", json={"x": [[0.0] * 4], "y": [3],
                                                        "id": "odd"})
        assert retry.status_code == 422 and retry.json()["seq"] == bad, retry.text
        assert "width 6" in retry.json()["error"]
    after = _learn(r2, "skip", np.zeros((1, 4)), [3])
    assert after.status_code == 200 and after.json()["seq"] == bad + 1
    # an id learned before, again in the stream (JetStream's window passed): learns nothing
    first = _learn(r1, "skip", np.ones((1, 4)), [1], rid="once").json()["seq"]
    again = _publish(nats_url, entry["subject"], wal.payload_of(
        np.zeros((1, 4), np.float32), [2], "once"), "another-msg-id")
    assert again == first + 1
    s1, s2 = _state(r1, "skip", again), _state(r2, "skip", again)
    assert s1["skipped"] == s2["skipped"] == 1 and s1["seen"] == s2["seen"] == 4
    assert s1["digest"] == s2["digest"]
    records = _records(nats_url, entry["stream"])
    assert _in_process(records[:-1], "ncm") == (s1["digest"], 1)  # the repeated id left out
    with r1.http() as h:
        assert h.get("/v1/learners/skip").json()["skipped"] == 1
        assert 'ciosl_learner_skipped{learner="skip"} 1.0' in h.get("/metrics").text
    assert any(f"record {bad} of " in line and "skipped" in line for line in r1.err + r2.err)


def test_a_late_replica_catches_up_from_a_snapshot_and_skips_a_damaged_one(pair, nats_url,
                                                                             tmp_path):
    r1, r2 = pair
    stream = _entry(nats_url, "default")["stream"]
    rng = np.random.default_rng(2)

    def teach(server, k):
        for _ in range(k):
            assert _learn(server, "default", rng.normal(size=(2, 4)),
                          [int(v) for v in rng.integers(0, 4, 2)]).status_code == 200
    teach(r1, 10)
    with r1.http() as h:
        first = h.post("/v1/snapshot").json()["seq"]
    teach(r2, 10)
    with r2.http() as h:
        second = h.post("/v1/snapshot").json()["seq"]
    teach(r1, 5)
    assert first == 10 and second == 20
    info = _info(nats_url, stream)
    assert info["first_seq"] == first and info["last_seq"] == 25  # purged below the oldest
    args = ("--log", nats_url, "--snapshot-every", "0", "--snapshot-seconds", "0")
    with Server(tmp_path / "r3", *args) as r3:
        assert "5 log records replayed" in r3.lines[0]  # from the snapshot at 20
        assert _state(r3, "default")["digest"] == _state(r1, "default", 25)["digest"]

    async def damage(js):  # a newer snapshot whose bytes do not match its checksum
        obs = await js.object_store("ciosl_snapshots")
        got = await obs.get(f"{stream}/{second:012d}")
        blob = bytearray(got.data)
        blob[len(blob) // 2] ^= 0xFF
        from nats.js.api import ObjectMeta
        await obs.put(f"{stream}/{25:012d}", bytes(blob), meta=ObjectMeta(
            name=f"{stream}/{25:012d}", description=got.info.description))
    _nats(nats_url, damage)
    with Server(tmp_path / "r4", *args) as r4:
        assert "5 log records replayed" in r4.lines[0]  # the damaged one at 25 skipped
        assert _state(r4, "default")["digest"] == _state(r1, "default", 25)["digest"]
        assert any(f"snapshot {stream}/{25:012d} skipped" in line and "SHA-256" in line
                   for line in r4.err)


def test_a_replica_left_behind_by_a_purge_continues_from_the_snapshot(nats_url, tmp_path):
    """In process: replica b's delivery paused while a learns and snapshots twice (the
    stream purged below the older); b, delivered again from where it was, finds the records
    gone and loads the snapshot that covers them instead of stopping."""
    from ciosl.serve.common import Options
    from ciosl.serve.jetstream import Log
    from ciosl.serve.replica import StreamService

    log = Log([nats_url]).connect()
    entry = {"method": "ncm", "settings": {}, "stream": "CIOSL_behind_0000abcd",
             "subject": "ciosl.behind.0000abcd"}
    log.ensure_stream(entry["stream"], entry["subject"])
    options = Options(snapshot_every=0, snapshot_seconds=0, snapshot_on_close=False)
    a = StreamService(log, "behind", entry, tmp_path / "a", options=options).open()
    b = StreamService(log, "behind", entry, tmp_path / "b", options=options).open()
    try:
        rng = np.random.default_rng(4)

        def teach(k):
            for _ in range(k):
                answer = a.submit_learn(rng.normal(size=(1, 4)).astype(np.float32),
                                        [int(rng.integers(0, 3))], None).result(30)
                assert answer.status == 200, answer.body
        teach(3)
        assert b.wait_applied(3, 30)
        b._delivery.stop()  # b falls behind
        teach(5)
        assert a.submit_snapshot().result(30).body["seq"] == 8
        teach(4)
        assert a.submit_snapshot().result(30).body["seq"] == 12
        teach(2)
        assert _info(nats_url, entry["stream"])["first_seq"] == 8 and b.seq == 3
        b._delivery = log.deliver(entry["stream"], entry["subject"], 4, b._queue)
        assert b.wait_applied(14, 30) and b.dead() is None
        assert b.state()["digest"] == a.state()["digest"]
        assert b.skipped == 0
    finally:
        a.close()
        b.close()
        log.close()


def test_a_replica_stopped_cleanly_restarts_on_its_dir_from_its_snapshot(tmp_path):
    with NatsServer(tmp_path / "nats") as server:
        server.wait_ready()
        args = ("--log", server.url, "--snapshot-every", "0", "--snapshot-seconds", "0")
        first = Server(tmp_path / "r", *args, "--method", "ncm")
        with first.client() as c:
            for i in range(4):
                c.learn_one(np.full(3, i, np.float32), i % 2)
        before = _state(first, "default")
        assert first.stop() == 0 and "Traceback" not in "".join(first.err)
        with Server(tmp_path / "r", *args) as again:
            assert "(seen 4, 2 classes, 0 log records replayed" in again.lines[0]
            assert _state(again, "default") == before


def test_a_log_that_does_not_acknowledge_is_503_and_answers_go_on(tmp_path):
    with NatsServer(tmp_path / "nats") as server:
        server.wait_ready()
        with Server(tmp_path / "r", "--log", server.url, "--method", "ncm") as r, \
                r.http() as h:
            assert _learn(r, "default", np.ones((1, 3)), [1], rid="x1").json()["seq"] == 1
            server.kill()
            down = h.post("/v1/learn", json={"x": [[2.0, 2, 2]], "y": [2], "id": "x2"})
            assert down.status_code == 503
            assert down.json()["error"].startswith(f"the log {server.url} did not acknowledge (")
            assert down.json()["error"].endswith("); retry with the same id")
            # what this replica holds still answers without the log
            assert h.post("/v1/predict", json={"x": [[1.0, 1, 1]]}).json()["label"] == [1]
            assert h.get("/v1/state").json()["seq"] == 1
            server.start()
            server.wait_ready()
            for _ in range(100):  # the client's retry, same id, once the log is back
                again = h.post("/v1/learn", json={"x": [[2.0, 2, 2]], "y": [2], "id": "x2"})
                if again.status_code != 503:
                    break
            assert again.status_code == 200 and again.json()["seq"] == 2, again.text
            assert h.get("/v1/state").json()["seen"] == 2


def _cli(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "ciosl", "serve", "--port", "0", *args],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CIOSL_TOKEN": TOKEN})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


def test_an_unreachable_log_fails_at_start_in_one_line(tmp_path):
    port = free_port()
    line = _cli("--dir", str(tmp_path / "d"), "--log", f"nats://127.0.0.1:{port}")
    assert f"--log nats://127.0.0.1:{port}: no NATS server answers there" in line
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flags, says", [
    (("--log", "http://127.0.0.1:4222"), "--log http://127.0.0.1:4222: expected 'folder' or "
     "nats://HOST:PORT"),
    (("--log", "nats://127.0.0.1:4222,nohost"), "'nohost' is not HOST:PORT"),
    (("--log-replicas", "9"), "--log-replicas must be in 1..5, got 9"),
    (("--log-dedupe-window", "0"), "--log-dedupe-window must be a number of seconds"),
    (("--min-seq-wait", "nan"), "--min-seq-wait must be a number of seconds in 0..3600"),
])
def test_the_log_flags_are_checked_in_one_line(tmp_path, flags, says):
    assert says in _cli("--dir", str(tmp_path / "d"), *flags)
    assert not (tmp_path / "d").exists()


def test_the_folder_log_takes_min_seq_too(tmp_path):
    with Server(tmp_path / "f", "--method", "ncm") as s, s.http() as h:
        assert h.post("/v1/learn", json={"x": [[1.0, 2.0]], "y": [1]}).json()["seq"] == 1
        assert h.post("/v1/predict?min_seq=1", json={"x": [[1.0, 2.0]]}).status_code == 200
        r = h.post("/v1/predict?min_seq=2", json={"x": [[1.0, 2.0]]})
        assert r.status_code == 503 and r.json()["error"] == (
            "this replica has applied up to seq 1, 2 asked; retry or ask another replica")
        assert h.get("/v1/state").json()["skipped"] == 0


def test_a_log_url_with_credentials_connects_and_never_prints_them(nats_url, tmp_path):
    """nats://user:password@host:port: the reachability check read 'user:password@host' as the
    host and the server refused to start; the first line printed the URL as given."""
    secret_url = nats_url.replace("nats://", "nats://ciosl:hunter2-secret@")
    with Server(tmp_path / "r", "--log", secret_url) as r:
        _create(r, "guarded")
        assert _learn(r, "guarded", np.eye(4)[:1], ["a"]).status_code == 200
        assert "log: nats://***@127.0.0.1:" in r.lines[0]
        r.stop()
    said = "".join(r.lines) + "".join(r.err)
    assert "hunter2" not in said
    bad = subprocess.run([sys.executable, "-m", "ciosl", "serve", "--dir", str(tmp_path / "b"),
                          "--log", "nats://ciosl:hunter2-secret@127.0.0.1:x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--log nats://***@127.0.0.1:x" in bad.stderr
    assert "hunter2" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
