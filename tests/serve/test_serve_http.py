"""``ciosl serve`` as a real process on 127.0.0.1, spoken to with a real HTTP client."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest
from server_helpers import TOKEN, Server

from ciosl import make_learner
from ciosl.serial import digest


def _data(n=60, d=8, k=6, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, size=n)
    x = rng.normal(size=(n, d)).astype(np.float32) + 2 * np.eye(k, d, dtype=np.float32)[y]
    return x, [int(v) for v in y]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("srv"), "--method", "slda") as s:
        yield s


def test_health_needs_no_token_and_everything_else_does(server):
    r = httpx.get(server.url + "/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["method"] == "slda"
    for method, path in [("POST", "/v1/learn"), ("POST", "/v1/predict"), ("GET", "/v1/classes"),
                         ("GET", "/v1/state"), ("POST", "/v1/snapshot"), ("GET", "/metrics")]:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                        {"Authorization": TOKEN}):
            r = httpx.request(method, server.url + path, headers=headers, json={"x": [[1.0]]})
            assert r.status_code == 401, (path, headers)
            assert "token" in r.json()["error"]


def test_the_client_mirrors_an_in_process_learner(server):
    x, y = _data()
    ref = make_learner("slda")
    with server.client() as c, server.client(binary=False) as cj:
        for i in range(0, 40, 8):  # batches through npy, single samples through JSON
            c.learn_many(x[i:i + 8], y[i:i + 8])
            ref.learn_many(x[i:i + 8], y[i:i + 8])
        for i in range(40, 46):
            cj.learn_one(x[i], y[i])
            ref.learn_one(x[i], y[i])
        assert c.classes_ == ref.classes_
        np.testing.assert_allclose(c.predict_proba(x[46:]), ref.predict_proba(x[46:]),
                                   rtol=1e-6, atol=1e-9)
        assert list(cj.predict(x[46:])) == list(ref.predict(x[46:]))
        assert c.predict_one(x[50]) == ref.predict_one(x[50])
        assert c.state()["digest"] == digest(ref.state_dict())
        assert c.health()["seen"] == 46


def test_raw_float32_bodies_and_string_labels(tmp_path):
    x, y = _data(20)
    with Server(tmp_path, "--method", "ncm") as s, s.http() as h:
        labels = [f"item-{v}" for v in y]
        r = h.post("/v1/learn", content=x.tobytes(), headers={
            "Content-Type": "application/octet-stream", "X-Ciosl-Shape": "20,8",
            "X-Ciosl-Labels": __import__("json").dumps(labels), "X-Ciosl-Id": "raw-1"})
        assert r.status_code == 200 and r.json()["learned"] == 20
        p = h.post("/v1/predict", content=x[:3].tobytes(), headers={
            "Content-Type": "application/octet-stream", "X-Ciosl-Shape": "3,8"}).json()
        ref = make_learner("ncm")
        ref.learn_many(x, labels)
        assert p["label"] == list(ref.predict(x[:3]))
        assert p["classes"] == ref.classes_


BAD = [
    ({"x": [[1.0, 2.0]], "y": [0]}, 422, "width 2"),
    ({"x": [[1.0] * 8], "y": [0], "extra": 1}, 400, "unknown field"),
    ({"x": [[1.0] * 8], "y": [1.5]}, 400, "y[0]"),
    ({"x": [[1.0] * 8], "y": [None]}, 400, "y[0]"),
    ({"x": [[1.0] * 8], "y": [True]}, 400, "y[0]"),
    ({"x": [[1.0] * 8, [1.0] * 7], "y": [0, 1]}, 400, "x:"),
    ({"x": [["a"] * 8], "y": [0]}, 400, "x:"),
    ({"x": [[1e300] * 8], "y": [0]}, 400, "x: row 0"),
    ({"x": [[1.0] * 8], "y": [0, 1]}, 400, "y:"),
    ({"x": [[1.0] * 8], "y": ["s"]}, 422, "cannot be mixed"),
    ({"x": [[1.0] * 8], "y": [0], "id": 7}, 400, "id:"),
    ({"y": [0]}, 400, "exactly one of x and images"),
    ({"images": ["aGVsbG8="], "y": [0]}, 400, "no extractor"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(server, body, status, words):
    with server.client() as c, server.http() as h:
        x, y = _data(6)
        c.learn_many(x, y)  # a width and integer labels are known
        before = c.state()
        r = h.post("/v1/learn", json=body)
        assert r.status_code == status, r.text
        assert words in r.json()["error"] and "\n" not in r.json()["error"]
        assert c.state() == before


def test_non_finite_json_and_other_bodies(server):
    with server.http() as h, server.client() as c:
        before = c.state()
        for text in ('{"x": [[NaN, 1, 1, 1, 1, 1, 1, 1]], "y": [0]}',
                     '{"x": [[Infinity, 1, 1, 1, 1, 1, 1, 1]], "y": [0]}', "[1, 2", "[]"):
            r = h.post("/v1/learn", content=text, headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "body" in r.json()["error"]
        r = h.post("/v1/learn", content=b"x=1",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415 and "application/x-npy" in r.json()["error"]
        r = h.post("/v1/predict", content=b"\x93NUMPY garbage",
                   headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 400 and "npy" in r.json()["error"]
        buf = io.BytesIO()
        np.save(buf, np.array([[np.nan] * 8], np.float32))
        r = h.post("/v1/predict", content=buf.getvalue(),
                   headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 400 and "x: row 0" in r.json()["error"]
        assert c.state() == before


def test_limits_on_body_and_batch(tmp_path):
    with Server(tmp_path, "--method", "ncm", "--max-batch", "4", "--max-body", "2048") as s, \
            s.http() as h:
        r = h.post("/v1/learn", json={"x": [[1.0]] * 5, "y": [0] * 5})
        assert r.status_code == 413 and "at most 4" in r.json()["error"]
        r = h.post("/v1/learn", json={"x": [[1.0] * 1000], "y": [0]})
        assert r.status_code == 413 and "body" in r.json()["error"]
        assert h.get("/v1/health").json()["seen"] == 0


def test_metrics_are_prometheus_text(server):
    with server.client() as c:
        x, y = _data(4)
        c.learn_many(x, y)
        c.predict(x)
        text = c.metrics()
    for name in ("ciosl_requests_total", "ciosl_request_seconds_bucket",
                 "ciosl_samples_learned_total", "ciosl_log_fsync_seconds_count",
                 "ciosl_snapshot_age_seconds", "ciosl_classes", "ciosl_group_requests_bucket"):
        assert name in text, name
    assert 'endpoint="learn",status="200"' in text


def test_predict_before_anything_is_learned(tmp_path):
    with Server(tmp_path, "--method", "ncm") as s, s.http() as h:
        r = h.post("/v1/predict", json={"x": [[1.0, 2.0]]})
        assert r.status_code == 409 and "nothing learned" in r.json()["error"]


def test_four_learners_and_four_predictors_at_once(tmp_path):
    """No request fails, every answer's shape agrees with its classes, and the final state is
    the log's replay."""
    x, y = _data(400, k=40, seed=3)
    with Server(tmp_path, "--method", "ncm") as s:
        errors, answers = [], []

        def learner(part):
            with s.client() as c:
                for i in range(part, 400, 4):
                    try:
                        c.learn_one(x[i], y[i], id=f"s{i}")
                    except Exception as e:  # noqa: BLE001 (collected, asserted below)
                        errors.append(repr(e))

        def predictor():
            with s.client() as c:
                for _ in range(60):
                    try:
                        body = c._send("POST", "/v1/predict", json={"x": x[:5].tolist()})
                        answers.append((len(body["classes"]), np.shape(body["proba"])))
                    except Exception as e:  # noqa: BLE001
                        if "nothing learned" not in str(e):
                            errors.append(repr(e))

        threads = [threading.Thread(target=learner, args=(p,)) for p in range(4)]
        threads += [threading.Thread(target=predictor) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert answers and all(shape == (5, k) for k, shape in answers)
        with s.client() as c:
            state = c.state()
        assert state["seen"] == 400
        s.stop()
    from ciosl.serve.service import log_ids

    order = [rid for _, rid in log_ids(tmp_path)]
    assert sorted(order) == sorted(f"s{i}" for i in range(400))
    ref = make_learner("ncm")
    for rid in order:
        i = int(rid[1:])
        ref.learn_one(x[i], y[i])
    assert digest(ref.state_dict()) == state["digest"]


def test_sigterm_applies_the_queue_and_snapshots(tmp_path):
    x, y = _data(30)
    with Server(tmp_path, "--method", "slda") as s:
        with s.client() as c:
            c.learn_many(x, y)
            live = c.state()["digest"]
        assert s.stop() == 0
    assert (tmp_path / "snapshot.json").exists()
    with Server(tmp_path) as s, s.client() as c:
        assert "0 log records replayed" in s.lines[0]
        assert c.state()["digest"] == live


def test_a_generated_token_is_private_and_printed(tmp_path):
    with Server(tmp_path, "--method", "ncm", token=None, wait=False) as s:
        line = s.proc.stdout.readline()
        path = tmp_path / "token"
        assert f"token: {path}" in line
        assert (path.stat().st_mode & 0o777) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 32
        s.proc.kill()


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ciosl", "serve", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_cli_errors_are_one_line(tmp_path):
    r = _cli("--dir", str(tmp_path / "new"), "--max-loaded", "0")  # a new --dir needs no
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--max-loaded" in r.stderr
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data.csv").write_text("1,2\n")
    r = _cli("--dir", str(tmp_path / "theirs"), "--method", "ncm")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not a ciosl serve folder" in r.stderr
    r = _cli("--dir", str(tmp_path / "a"), "--method", "ncm", "--set", "bogus=1")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "bogus" in r.stderr
    r = _cli("--dir", str(tmp_path / "c"), "--feedback-window", "20", "--id-window", "10")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--feedback-window" in r.stderr
    assert not (tmp_path / "c").exists()
    r = _cli("--dir", str(tmp_path / "b"), "--method", "nope")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "nope" in r.stderr
    assert "Traceback" not in r.stderr


def _png(rng, size=40):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_images_through_the_extractor(tmp_path):
    rng = np.random.default_rng(0)
    with Server(tmp_path, "--method", "ncm", "--extractor", "efficientnet_lite0@32") as s, \
            s.http() as h:
        imgs = [_png(rng) for _ in range(4)]
        r = h.post("/v1/learn", json={"images": imgs, "y": ["a", "b", "a", "b"]})
        assert r.status_code == 200, r.text
        p = h.post("/v1/predict", json={"images": imgs[:2]}).json()
        assert p["classes"] == ["a", "b"] and len(p["proba"]) == 2
        assert h.get("/v1/health").json()["dim"] == 1280
        r = h.post("/v1/predict", json={"images": [base64.b64encode(b"not an image").decode()]})
        assert r.status_code == 400 and "images[0]" in r.json()["error"]


def test_the_readmes_serve_example_runs(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (code,) = re.findall(r"```python\n(# serve client.*?)```", readme, re.S)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    with Server(tmp_path, "--method", "ncm") as s:
        classes, labels, accuracy = scope["serve_demo"](s.url, s.token)
    assert classes == ["espresso-cup", "saucer"] and labels == ["espresso-cup"]
    assert accuracy == 0.0  # the one answer given was corrected


def test_images_through_a_users_module_backbone(tmp_path):
    (tmp_path / "mybackbone.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3), torch.nn.ReLU())\n"
        "    return net, {'size': 16}\n")
    rng = np.random.default_rng(1)
    env = {"PYTHONPATH": f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}"}
    with Server(tmp_path / "srv", "--method", "ncm", "--extractor", "module:mybackbone:make",
                env=env) as s, s.http() as h:
        imgs = [_png(rng, 24) for _ in range(4)]
        r = h.post("/v1/learn", json={"images": imgs, "y": [0, 1, 0, 1]})
        assert r.status_code == 200, r.text
        assert h.get("/v1/health").json()["dim"] == 5  # the module's channels, pooled
