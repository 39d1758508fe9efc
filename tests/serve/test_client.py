"""``ciosl.Client`` refuses what it cannot send at once, and never shows the token (red-team
pass 6, unclear: it retried for 7 s on a malformed URL or a token with a trailing newline, the
token in the exception's text)."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import TOKEN, Server

from ciosl import Client


@pytest.mark.parametrize("url", ["not a url", "127.0.0.1:8000", "ftp://host/", "http://",
                                 "http://[::1", ""])
def test_a_malformed_url_is_refused_at_once(url):
    with pytest.raises(ValueError, match="is not a URL such as http://127.0.0.1:8000"):
        Client(url, token=TOKEN)


@pytest.mark.parametrize("token", ["abc def-0123456789", "tok\x00en-0123456789",
                                   "t\u00f6ken-0123456789", "a\nb-0123456789"])
def test_a_token_that_cannot_be_sent_is_refused_and_never_shown(token):
    with pytest.raises(ValueError) as e:
        Client("http://127.0.0.1:1", token=token)
    assert "not shown" in str(e.value) and "0123456789" not in str(e.value)


def test_a_request_that_cannot_be_sent_is_not_retried(monkeypatch):
    c = Client("http://127.0.0.1:1", token=TOKEN, retries=8, backoff=10.0)
    calls = []

    def local(*a, **k):
        calls.append(1)
        raise httpx.LocalProtocolError("Illegal header value")

    monkeypatch.setattr(c._http, "request", local)
    with pytest.raises(httpx.LocalProtocolError):
        c.health()
    assert calls == [1]  # once: a backoff of 10 s would have made a retry obvious


def test_transport_failures_are_retried_and_said_without_the_token(monkeypatch):
    c = Client("http://127.0.0.1:1", token=TOKEN, retries=2, backoff=0.0)
    calls = []

    def refused(*a, **k):
        calls.append(1)
        raise httpx.ConnectError(f"refused (Authorization: Bearer {TOKEN})")

    monkeypatch.setattr(c._http, "request", refused)
    with pytest.raises(ConnectionError) as e:
        c.health()
    assert len(calls) == 3 and "after 3 tries" in str(e.value)
    assert "127.0.0.1:1" in str(e.value) and TOKEN not in str(e.value)


def test_a_token_read_from_a_file_works_with_its_newline(tmp_path):
    with Server(tmp_path, "--method", "ncm") as s, \
            Client(s.url, token=TOKEN + "\n") as c:
        c.learn_one([1.0, 2.0], "a")
        assert c.classes_ == ["a"]
