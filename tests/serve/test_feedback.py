"""Feedback by prediction id on a real server: learned once, durably, from the features kept in
the prediction window (which survives a restart and a SIGKILL); unknown, expired and malformed
ids refused in one line; the live score is test-then-train on the answers that were given;
events stream with ids, and a reconnect with Last-Event-ID misses nothing."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from server_helpers import Server

from ciosl.serve.client import ServerError


def _blobs(rng, n, classes, d=6):
    y = rng.integers(0, classes, size=n)
    x = rng.normal(size=(n, d)).astype(np.float32) + 3.0 * y[:, None]
    return x, [int(v) for v in y]


@pytest.fixture
def server(tmp_path):
    with Server(tmp_path, "--method", "ncm", "--feedback-window", "8") as s:
        yield s


def test_feedback_twice_is_learned_once_and_scores_the_answer_given(server):
    rng = np.random.default_rng(0)
    x, y = _blobs(rng, 30, 2)
    with server.client() as c:
        c.learn_many(x, y)
        seen = c.state()["seen"]
        q = np.array([[0.0] * 6, [3.0] * 6], np.float32)
        answer = c.predict_ids(q)
        assert answer["label"] == [0, 1] and len(set(answer["prediction_id"])) == 2
        assert len(answer["novelty"]) == 2 and answer["novel"] == [False, False]
        pid = answer["prediction_id"][0]
        first = c.feedback(pid, 1)  # the answer 0 was wrong
        assert first["learned"] == 1 and first["duplicate"] == [False]
        assert first["correct"] == [False]
        again = c.feedback(pid, 1)
        assert again["learned"] == 0 and again["duplicate"] == [True]
        both = c.feedback(answer["prediction_id"], [1, 1])  # one old, one new
        assert both["learned"] == 1 and both["duplicate"] == [True, False]
        assert both["correct"] == [False, True]
        assert c.state()["seen"] == seen + 2
        live = c.live()
        text = c.metrics()  # the same figures, labelled by learner
    assert 'ciosl_learner_accuracy{learner="default"} 0.5' in text
    assert 'ciosl_learner_recall{label="1",learner="default"} 0.5' in text
    assert 'ciosl_learner_feedback{learner="default"} 2.0' in text
    assert live["feedback"] == 2 and live["accuracy"] == 0.5
    assert live["recall"] == {"1": 0.5}
    assert live["confusion"] == {"labels": [0, 1], "matrix": [[0, 0], [1, 1]]}
    assert live["counts"]["1"] == y.count(1) + 2


def test_unknown_expired_and_malformed_ids_are_refused_in_one_line(server):
    rng = np.random.default_rng(1)
    x, y = _blobs(rng, 10, 2)
    with server.client() as c, server.http() as h:
        c.learn_many(x, y)
        first = c.predict_ids(x[:1])["prediction_id"][0]
        for _ in range(9):  # the window holds the last 8
            c.predict_ids(x[:1])
        cases = [({"prediction_id": first, "y": 0}, 410, "no longer in the feedback window"),
                 ({"prediction_id": "p-999999", "y": 0}, 404, "never issued"),
                 ({"prediction_id": "q-1", "y": 0}, 400, "prediction_id"),
                 ({"prediction_id": ["p-1", 3], "y": [0, 0]}, 400, "prediction_id[1]"),
                 ({"prediction_id": "p-9", "y": [0]}, 400, "y: one label"),
                 ({"prediction_id": "p-9", "y": 1.5}, 400, "y: labels are"),
                 ({"prediction_id": "p-9"}, 400, "y: missing"),
                 ({"prediction_id": "p-9", "y": 0, "x": 1}, 400, "unknown field")]
        for body, status, words in cases:
            r = h.post("/v1/learners/default/feedback", json=body)
            assert r.status_code == status, (body, r.text)
            assert words in r.json()["error"] and "\n" not in r.json()["error"]
        assert h.post("/v1/learners/nobody/feedback",
                      json={"prediction_id": "p-1", "y": 0}).status_code == 404
        seen = c.state()["seen"]
    assert seen == 10  # nothing refused was learned


def test_the_window_survives_a_restart_and_a_kill(tmp_path):
    rng = np.random.default_rng(2)
    x, y = _blobs(rng, 20, 3)
    with Server(tmp_path, "--method", "slda") as s, s.client() as c:
        c.learn_many(x, y)
        pids = c.predict_ids(x[:4])["prediction_id"]
        c.feedback(pids[0], y[0])
        s.stop()
    with Server(tmp_path) as s, s.client() as c:
        assert c.feedback(pids[0], y[0])["duplicate"] == [True]
        assert c.feedback(pids[1], y[1])["learned"] == 1
        more = c.predict_ids(x[4:6])["prediction_id"]
        assert int(more[0][2:]) > int(pids[-1][2:])  # ids never issued twice
        s.kill()
    with Server(tmp_path) as s, s.client() as c:
        assert c.feedback(pids[1], y[1])["duplicate"] == [True]
        assert c.feedback(more[1], y[5])["learned"] == 1
        assert c.live()["feedback"] == 3
        assert c.state()["seen"] == 23


def _events(h, url, headers, want):
    """The first ``want`` events of the stream as (id, name, data)."""
    out = []
    with h.stream("GET", url, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event: dict = {}
        for line in r.iter_lines():
            if line.startswith(("id:", "event:", "data:")):
                key, _, value = line.partition(":")
                event[key] = value.strip()
            elif not line and "id" in event:
                out.append((int(event["id"]), event["event"], json.loads(event["data"])))
                event = {}
                if len(out) == want:
                    return out
    return out


def test_events_stream_and_a_reconnect_misses_nothing(server):
    rng = np.random.default_rng(3)
    x, y = _blobs(rng, 4, 2)
    url = "/v1/learners/default/events"
    with server.client() as c, server.http() as h:
        c.learn_many(x[:2], [0, 0])
        c.learn_many(x[2:], [1, 1])
        pid = c.predict_ids(x[:1])["prediction_id"][0]
        c.feedback(pid, 1)
        got = _events(h, url, {}, 7)
        names = [n for _, n, _ in got]
        assert names[:6] == ["learn", "class", "learn", "class", "learn", "feedback"]
        assert got[1][2] == {"label": 0} and got[3][2] == {"label": 1}
        assert got[5][2] == {"prediction_id": pid, "y": 1, "answered": 0, "correct": False}
        assert "score" in names and [i for i, _, _ in got] == sorted({i for i, _, _ in got})
        k = got[2][0]
        again = _events(h, url, {"Last-Event-ID": str(k)}, 3)
        assert again[0][0] == k + 1 and again[:3] == got[3:6]
        assert h.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_client_of_a_named_learner(server):
    with server.client() as c:
        c.create("shop-1", "ncm")
        with pytest.raises(ServerError) as e:
            c.create("shop-1", "ncm")
        assert e.value.status == 409
    with server.client(learner="shop-1") as c:
        c.learn_one(np.ones(3, np.float32), "cup")
        assert c.predict_one(np.ones(3, np.float32)) == "cup"
        assert c.classes_ == ["cup"]
    with pytest.raises(ValueError, match="no learner name"):
        server.client(learner="../x")


def test_a_reconnect_after_a_restart_gets_every_event_of_the_new_life():
    """Event ids restarted at 1 with the server: a console that reconnected with the id of the
    6th event of the old life got the new life's events after its 6th only (5 events lost)."""
    from ciosl.serve.events import EventLog

    before = time.time_ns() // 1000
    old = EventLog()
    assert old.add("learn", {"seq": 1}) >= before  # numbered from the life's start
    old_ids = [old.add("learn", {"seq": s}) for s in range(2, 7)]
    new = EventLog(first=old_ids[-1] + 1_000_000)  # a later life (one second later)
    new_ids = [new.add("learn", {"seq": s}) for s in range(10)]
    got = new.after(old_ids[-1])
    assert [e[0] for e in got] == new_ids and new_ids == sorted(set(new_ids))
    assert [e[0] for e in new.after(new_ids[3])] == new_ids[4:]
    assert [e[0] for e in new.after(new_ids[-1] + 5)] == new_ids  # a clock set back
