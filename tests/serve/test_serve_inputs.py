"""What a served learner takes from a request, over real HTTP (red-team pass 6): labels that
are no text, raw UTF-8 headers, booleans among features, non-ASCII digits in a shape, and paths
that are not endpoints. Each refused in one line, naming the field, with the state unchanged."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
from server_helpers import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("srv"), "--method", "ncm") as s:
        with s.http() as h:  # a width (3) and string labels are known
            assert h.post("/v1/learn", json={"x": [[0, 0, 1.0]], "y": ["seed"]}).status_code \
                == 200
        yield s


def _raw(server, head: bytes, body: bytes = b"", timeout=60) -> bytes:
    """Bytes sent as they are (no client library escapes or refuses them), the answer read."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + body)
        out = b""
        while b"\r\n\r\n" not in out or len(out.split(b"\r\n\r\n", 1)[1]) < _length(out):
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
        return out


def _length(out: bytes) -> int:
    for line in out.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _answer(out: bytes) -> tuple[int, dict]:
    head, body = out.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def test_a_lone_surrogate_label_is_refused_and_everything_still_answers(server):
    """Finding 1: learned with 200, it made predict, classes and state answer 500 for ever."""
    with server.http() as h:
        before = h.get("/v1/state").json()
        body = '{"x": [[1, 2, 3]], "y": ["\\ud800"], "id": "sur-1"}'  # valid JSON
        r = h.post("/v1/learn", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"].startswith("y[0]: not valid Unicode text (a lone surrogate")
        body = '{"x": [[1, 2, 3]], "y": ["ok"], "id": "\\udfff"}'
        r = h.post("/v1/learn", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"].startswith("id: not valid Unicode")
        assert h.get("/v1/state").json() == before
        assert h.get("/v1/classes").status_code == 200
        assert h.post("/v1/predict", json={"x": [[1, 2, 3]]}).status_code == 200


def test_raw_utf8_in_the_labels_header_is_read_as_utf8(server):
    """Finding 10: ``X-Ciosl-Labels: ["café"]`` as raw UTF-8 (as curl sends it) was learned as
    ``cafÃ©``."""
    x = np.array([[3, 1, 4]], np.float32).tobytes()
    head = (b"POST /v1/learn HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
            server.token.encode() + b"\r\nContent-Type: application/octet-stream\r\n"
            b"X-Ciosl-Shape: 1,3\r\nX-Ciosl-Labels: [\"caf\xc3\xa9\"]\r\nX-Ciosl-Id: \xc3\xa9-1"
            b"\r\nContent-Length: " + str(len(x)).encode() + b"\r\nConnection: close\r\n\r\n")
    status, body = _answer(_raw(server, head, x))
    assert status == 200 and body["learned"] == 1
    with server.http() as h:
        assert "café" in h.get("/v1/classes").json()["classes"]
    bad = head.replace(b"caf\xc3\xa9", b"caf\xe9")  # Latin-1, not UTF-8
    status, body = _answer(_raw(server, bad, x))
    assert status == 400 and body["error"] == "X-Ciosl-Labels: not UTF-8 text"


@pytest.mark.parametrize("x", [[[True, 1.5, 2]], [[1.5, 2, False]]])
def test_a_boolean_among_features_is_refused(server, x):
    """Finding 11: ``[[true, 1.5, 2]]`` was learned as ``[1.0, 1.5, 2.0]``."""
    with server.http() as h:
        before = h.get("/v1/state").json()
        r = h.post("/v1/learn", json={"x": x, "y": ["b"]})
        j = 0 if isinstance(x[0][0], bool) else 2
        assert r.status_code == 400
        assert r.json()["error"] == f"x[0][{j}]: expected a number, got a boolean"
        assert h.get("/v1/state").json() == before


@pytest.mark.parametrize("shape", ["\u00b9,3", "\u0661,3", "1,\u00b3", "1, 3,"])
def test_a_shape_of_non_ascii_digits_is_refused_in_one_line(server, shape):
    """Finding 16: ``X-Ciosl-Shape: ¹,3`` (byte 0xB9) answered 500 with a traceback."""
    x = np.ones((1, 3), np.float32).tobytes()
    head = (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
            server.token.encode() + b"\r\nContent-Type: application/octet-stream\r\n"
            b"X-Ciosl-Shape: " + shape.encode("utf-8") + b"\r\nContent-Length: 12\r\n"
            b"Connection: close\r\n\r\n")
    status, body = _answer(_raw(server, head, x))
    assert status == 400 and body["error"].startswith("X-Ciosl-Shape: expected 'n,d'")
    assert not any("Traceback" in line for line in server.err)


def test_a_path_is_served_or_refused_never_redirected(server):
    """Unclear: ``/v1/classes/`` redirected to the Host header the client gave (reflected)."""
    head = (b"GET /v1/classes/ HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer " +
            server.token.encode() + b"\r\nConnection: close\r\n\r\n")
    out = _raw(server, head)
    status, body = _answer(out)
    assert status == 404 and b"evil.example" not in out
    assert body["error"].startswith("no endpoint GET /v1/classes/; endpoints: ")
    with server.http() as h:
        r = h.put("/v1/learn")
        assert r.status_code == 405 and r.json()["error"].startswith("method not allowed")
