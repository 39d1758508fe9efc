"""Many learners in one server (a real process on 127.0.0.1): created, listed, described and
deleted by name; names refused in one line; isolation (each its own log, a damaged one answers
503 alone); idle learners unloaded and reloaded; a single-learner folder still serves at the
old URLs and takes other learners besides; health, methods and /metrics."""

from __future__ import annotations

import time

import numpy as np
from server_helpers import Server

X = np.array([[0.0, 0.0], [4.0, 4.0]], np.float32)


def _wait(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout  # a hang guard, not a timing assertion
    while not predicate():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.05)


def test_create_list_describe_delete(tmp_path):
    with Server(tmp_path) as s, s.http() as h:
        assert h.get("/v1/health").json() == {"status": "ok", "learners": 0, "loaded": 0,
                                              "extractor": None}
        assert h.get("/v1/learners").json() == {"learners": []}
        assert h.post("/v1/learn", json={"x": [[1.0]], "y": [0]}).status_code == 404
        r = h.post("/v1/learners", json={"name": "shop-1", "method": "slda",
                                         "settings": {"shrinkage_estimator": "fixed",
                                                      "shrinkage": "0.01"}})
        assert r.status_code == 201, r.text
        assert r.json()["method"] == "slda" and r.json()["settings"]["shrinkage"] == 0.01
        assert h.post("/v1/learners", json={"name": "shop-2", "method": "ncm"}).status_code == 201
        again = h.post("/v1/learners", json={"name": "shop-1", "method": "ncm"})
        assert again.status_code == 409 and "exists" in again.json()["error"]
        h.post("/v1/learners/shop-1/learn", json={"x": X.tolist(), "y": ["a", "b"]})
        h.post("/v1/learners/shop-2/learn", json={"x": X[:1].tolist(), "y": [7]})
        rows = h.get("/v1/learners").json()["learners"]
        assert [(r["name"], r["seen"], r["classes"]) for r in rows] == [("shop-1", 2, 2),
                                                                      ("shop-2", 1, 1)]
        one = h.get("/v1/learners/shop-1").json()
        assert one["classes_list"] == ["a", "b"] and one["settings"]["shrinkage"] == 0.01
        assert h.post("/v1/learners/shop-2/predict",
                      json={"x": X.tolist()}).json()["label"] == [7, 7]  # its own classes
        no = h.delete("/v1/learners/shop-1")
        assert no.status_code == 400 and "confirm" in no.json()["error"]
        assert h.delete("/v1/learners/shop-1?confirm=shop-2").status_code == 400
        assert h.delete("/v1/learners/shop-1?confirm=shop-1").json() == {"deleted": "shop-1"}
        gone = h.get("/v1/learners/shop-1/classes")
        assert gone.status_code == 404
        assert gone.json() == {"error": "learner 'shop-1' does not exist"}
        assert [r["name"] for r in h.get("/v1/learners").json()["learners"]] == ["shop-2"]
        methods = h.get("/v1/methods").json()["methods"]
        ncm = next(m for m in methods if m["name"] == "ncm")
        assert ncm["description"] and all({"name", "default", "help", "type"} <= set(v)
                                          for v in ncm["settings"])
        text = h.get("/metrics").text
        assert 'ciosl_learner_seen{learner="shop-2"} 1.0' in text
        assert "ciosl_learners 1.0" in text
    trash = list((tmp_path / ".trash").iterdir())
    assert len(trash) == 1 and trash[0].name.startswith("shop-1-")
    assert (trash[0] / "ciosl-serve.json").exists()  # kept, not erased


def test_names_and_bodies_refused_in_one_line(tmp_path):
    bad = ["a/b", "..", ".hidden", "-x", "x" * 65, "", "caf\u00e9", "a b", 12]
    with Server(tmp_path) as s, s.http() as h:
        for name in bad:
            r = h.post("/v1/learners", json={"name": name, "method": "ncm"})
            assert r.status_code == 400 and "name" in r.json()["error"], (name, r.text)
            assert "\n" not in r.json()["error"]
        for body, words in [({"name": "a", "method": "nope"}, "method"),
                            ({"name": "a", "method": "os:system"}, "registered method"),
                            ({"name": "a", "method": "ncm", "settings": {"bogus": 1}}, "bogus"),
                            ({"name": "a", "method": "slda", "settings": {"shrinkage": -1}},
                             "shrinkage"),
                            ({"name": "a", "method": "ncm", "extra": 1}, "unknown field")]:
            r = h.post("/v1/learners", json=body)
            assert r.status_code == 400 and words in r.json()["error"], (body, r.text)
        assert h.get("/v1/learners/x" * 1 + "/classes").status_code == 404
        assert h.get("/v1/learners").json() == {"learners": []}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hub.lock"]  # nothing made


def test_idle_learners_are_unloaded_and_reloaded_with_their_state(tmp_path):
    with Server(tmp_path, "--unload-after", "0.3") as s, s.http() as h:
        for name in ("a", "b"):
            assert h.post("/v1/learners", json={"name": name, "method": "ncm"}).status_code \
                == 201
            h.post(f"/v1/learners/{name}/learn", json={"x": X.tolist(), "y": [name, "z"]})
        state = h.get("/v1/learners/a/state").json()
        _wait(lambda: h.get("/v1/health").json()["loaded"] == 0)
        rows = h.get("/v1/learners").json()["learners"]
        assert [(r["loaded"], r["seen"]) for r in rows] == [(False, 2), (False, 2)]
        assert "ciosl_learners_loaded 0.0" in h.get("/metrics").text
        assert h.get("/v1/learners/a/state").json() == state  # reloaded on demand
        assert h.get("/v1/health").json()["loaded"] == 1
    assert "unloaded after 0.3 s idle" in s.lines[0]


def test_a_damaged_learner_fails_alone(tmp_path):
    with Server(tmp_path, "--unload-after", "0.3") as s, s.http() as h:
        for name in ("ok", "bad"):
            h.post("/v1/learners", json={"name": name, "method": "ncm"})
            h.post(f"/v1/learners/{name}/learn", json={"x": X.tolist(), "y": [0, 1]})
        _wait(lambda: h.get("/v1/health").json()["loaded"] == 0)
        # the unloaded learner's snapshot pointer damaged (a disk that lost its blocks)
        (tmp_path / "learners" / "bad" / "snapshot.json").write_bytes(b"\0" * 10)
        for _ in range(3):
            r = h.post("/v1/learners/bad/learn", json={"x": X.tolist(), "y": [0, 1]})
            assert r.status_code == 503 and "learner 'bad' cannot be loaded" in r.json()["error"]
            assert "\n" not in r.json()["error"]
            assert h.post("/v1/learners/ok/learn",
                          json={"x": X.tolist(), "y": [0, 1]}).status_code == 200
            assert h.post("/v1/learners/ok/predict", json={"x": X.tolist()}).status_code == 200
        assert h.get("/v1/learners/ok/state").json()["seen"] == 8
        assert h.get("/v1/health").status_code == 200  # no default: the server is well


def test_a_single_learner_folder_serves_as_default_and_takes_others(tmp_path):
    with Server(tmp_path, "--method", "ncm") as s, s.client() as c:
        c.learn_many(X, [0, 1])
        s.stop()
    assert (tmp_path / "ciosl-serve.json").exists()  # today's layout
    with Server(tmp_path) as s, s.http() as h:
        health = h.get("/v1/health").json()
        assert health["method"] == "ncm" and health["seen"] == 2 and health["learners"] == 1
        assert h.post("/v1/learners", json={"name": "other", "method": "ncm"}).status_code \
            == 201
        h.post("/v1/learners/other/learn", json={"x": X.tolist(), "y": [5, 6]})
        assert h.get("/v1/classes").json() == {"classes": [0, 1]}
        assert h.get("/v1/learners/default/classes").json() == {"classes": [0, 1]}
        assert h.get("/v1/learners/other/classes").json() == {"classes": [5, 6]}
        assert h.delete("/v1/learners/default?confirm=default").status_code == 200
        assert h.get("/v1/health").json()["learners"] == 1
        assert h.get("/v1/classes").status_code == 404
    assert not (tmp_path / "ciosl-serve.json").exists()
    assert (tmp_path / "learners" / "other" / "ciosl-serve.json").exists()


def _read_only(folder, on: bool) -> None:
    """``folder`` and what it holds made read-only (``on``) or writable again: the mode bits
    for a user, the immutable attribute for root (whom the mode bits do not stop)."""
    import os
    import subprocess

    paths = [folder, *sorted(folder.rglob("*"))]
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True,
                       capture_output=True)
    else:
        for p in paths:
            p.chmod((p.stat().st_mode & ~0o222) if on else (p.stat().st_mode | 0o200))


def test_a_learner_whose_folder_turns_read_only_fails_alone(tmp_path):
    with Server(tmp_path) as s, s.http() as h:
        for name in ("ok", "ro"):
            h.post("/v1/learners", json={"name": name, "method": "ncm"})
            h.post(f"/v1/learners/{name}/learn", json={"x": X.tolist(), "y": [0, 1]})
        folder = tmp_path / "learners" / "ro"
        _read_only(folder, True)
        try:
            r = h.post("/v1/learners/ro/learn", json={"x": X.tolist(), "y": [0, 1], "id": "r1"})
            assert r.status_code == 503, r.text  # not acknowledged: it could not be made durable
            assert "\n" not in r.json()["error"]
            for i in range(3):  # the others go on learning and answering
                assert h.post("/v1/learners/ok/learn", json={"x": X.tolist(), "y": [0, 1],
                                                             "id": f"ok{i}"}).status_code == 200
                assert h.post("/v1/learners/ok/predict",
                              json={"x": X.tolist()}).json()["label"] == [0, 1]
            assert h.post("/v1/learners/ro/learn", json={"x": X.tolist(), "y": [0, 1]}) \
                .status_code == 503  # it fails alone, and keeps failing
            assert h.get("/v1/learners/ok/state").json()["seen"] == 8
            assert h.get("/v1/health").status_code == 200
        finally:
            _read_only(folder, False)


def test_a_request_reaching_a_deleted_learner_hears_that_it_was_deleted(tmp_path):
    from ciosl.serve.hub import Hub

    hub = Hub(tmp_path).open()
    try:
        hub.create("gone", "ncm", {})
        service = hub.acquire("gone")  # held by a request in flight while another deletes
        service.submit_learn(X, [0, 1], "before").result()
        hub.release("gone")
        assert hub.delete("gone", "gone") == {"deleted": "gone"}
        answer = service.submit_learn(X, [0, 1], "after").result()
        assert answer.status == 503
        assert answer.body == {"error": "learner 'gone' was deleted"}
    finally:
        hub.close()
