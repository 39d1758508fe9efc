"""``ciosl serve`` started by a careless operator (red-team pass 6): a token file others can
read, a dangling link where a token or a folder should be, a time that is not finite, an empty
``--dir``; each refused in one line before anything is written. And what it prints: an IPv6
address as a URL; a dead writer fails health."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest
from server_helpers import TOKEN, Server


def _cli(*args, cwd=None, env=None):
    environ = {**os.environ, "CIOSL_TOKEN": TOKEN, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ciosl", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=environ)


def _one_line(r) -> str:
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o602])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    """Finding 12: ``--token-file`` at 0644 or 0666 was taken silently (``DIR/token`` was not)."""
    token = tmp_path / "token.txt"
    token.write_text("a-token-of-enough-length-123\n")
    token.chmod(mode)
    line = _one_line(_cli("--dir", str(tmp_path / "d"), "--method", "ncm",
                          "--token-file", str(token)))
    assert f"--token-file {token}: readable or writable by others (mode {oct(mode)})" in line
    assert "a-token-of" not in line and not (tmp_path / "d").exists()


def test_a_private_token_file_is_taken(tmp_path):
    token = tmp_path / "token.txt"
    token.write_text("a-token-of-enough-length-123\n")
    token.chmod(0o600)
    with Server(tmp_path / "d", "--method", "ncm", "--token-file", str(token),
                token="a-token-of-enough-length-123") as s, s.client() as c:
        assert c.health()["status"] == "ok" and c.state()["seq"] == 0


def test_dangling_links_are_named_not_file_exists(tmp_path):
    """Unclear: a dangling link as ``--dir`` or ``DIR/token`` gave "File exists"."""
    (tmp_path / "dir").symlink_to(tmp_path / "gone")
    line = _one_line(_cli("--dir", str(tmp_path / "dir"), "--method", "ncm"))
    assert "a dangling symbolic link" in line and "File exists" not in line
    (tmp_path / "d2").mkdir()
    (tmp_path / "d2" / "token").symlink_to(tmp_path / "gone")
    env = {k: v for k, v in os.environ.items() if k != "CIOSL_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "ciosl", "serve", "--port", "0", "--dir",
                        str(tmp_path / "d2"), "--method", "ncm"], capture_output=True,
                       text=True, timeout=120, env=env)
    line = _one_line(r)
    assert "token: a dangling symbolic link" in line and "File exists" not in line
    line = _one_line(_cli("--dir", str(tmp_path / "d3"), "--method", "ncm", "--token-file",
                          str(tmp_path / "dir")))
    assert "--token-file" in line and "a dangling symbolic link" in line


@pytest.mark.parametrize(("flag", "value"), [
    ("--snapshot-seconds", "inf"), ("--snapshot-seconds", "nan"),
    ("--snapshot-seconds", "-1"), ("--header-timeout", "inf"), ("--body-timeout", "0"),
    ("--max-connections", "0"), ("--id-window-bytes", "10")])
def test_times_and_bounds_that_are_not_finite_are_refused_at_start(tmp_path, flag, value):
    """Finding 13: ``--snapshot-seconds inf`` started, then the writer died (OverflowError)
    and every learn hung."""
    line = _one_line(_cli("--dir", str(tmp_path / "d"), "--method", "ncm", flag, value))
    assert line.startswith(f"error: {flag} must be") and value in line
    assert not (tmp_path / "d").exists()


def test_an_empty_dir_is_refused_and_nothing_written(tmp_path):
    """Finding 18: ``--dir ''`` was taken as the current folder (an empty .lock written)."""
    (tmp_path / "mine.txt").write_text("x")
    line = _one_line(_cli("--dir", "", "--method", "ncm", cwd=tmp_path))
    assert "--dir '': give a folder" in line
    line = _one_line(_cli("--dir", str(tmp_path), "--method", "ncm"))
    assert "not a ciosl serve folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


@pytest.mark.parametrize(("host", "url"), [
    ("::1", "http://[::1]:8000"), ("fe80::1%eth0", "http://[fe80::1%eth0]:8000"),
    ("127.0.0.1", "http://127.0.0.1:8000"), ("localhost", "http://localhost:8000"),
])
def test_an_ipv6_address_is_printed_as_a_url(host, url):
    """Unclear: ``http://::1:PORT`` was printed. The printed URL comes from ``url_of`` (a
    server's tests listen on 127.0.0.1 only, so the IPv6 form is checked on the function)."""
    from ciosl.serve.server import url_of

    assert url_of(host, 8000) == url


def test_a_dead_writer_fails_health(tmp_path, monkeypatch):
    """Finding 13: health said ok while every learn hung behind a dead writer."""
    from ciosl.serve import service as sv
    from ciosl.serve.app import build_app
    from ciosl.serve.hub import Hub

    hub = Hub(tmp_path, sv.Options(snapshot_on_close=False, snapshot_seconds=0),
              warn=lambda line: None).open("ncm")
    s = hub._entries["default"].service
    app = build_app(hub, TOKEN)

    async def talk():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
            auth = {"Authorization": f"Bearer {TOKEN}"}
            ok = await h.get("/v1/health")
            monkeypatch.setattr(s, "_learn_group", lambda jobs: 1 / 0)
            learn = await h.post("/v1/learn", json={"x": [[1.0, 2.0]], "y": [0]}, headers=auth)
            dead = await h.get("/v1/health")
            return ok, learn, dead

    ok, learn, dead = asyncio.run(talk())
    hub.close()
    assert ok.status_code == 200 and ok.json()["status"] == "ok"
    assert learn.status_code == 503 and "ZeroDivisionError" in learn.json()["error"]
    assert dead.status_code == 503 and dead.json()["status"] == "broken"
    assert dead.json()["error"] == learn.json()["error"]
