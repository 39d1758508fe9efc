"""Connections held within bounds (uvicorn's httptools protocol, guarded): at most
``max_connections`` open at once (one more is answered 503 and closed at once, so the open-file
limit is never reached); a connection must send a complete request head (method, path,
headers) within ``head_seconds`` of opening or of its previous answer: an idle connection, or
headers sent a byte a second, are closed (with 408 once anything was sent); and a request head
is at most ``MAX_HEAD`` bytes (431 and closed: the parser would keep every header line). The
condition is said once per episode on stderr, never per connection.

httptools (the llhttp parser, in C) rather than h11 (pure Python): the HTTP stack's own cost
per request is what small requests pay (docs/findings/serving.md)."""

from __future__ import annotations

import json
import resource
import sys

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD = 64 * 1024  # bytes of one request head (request line and headers) at most


def _response(status: str, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class Guard:
    """The bounds shared by every connection of one server."""

    def __init__(self, max_connections: int, head_seconds: float, say=None):
        self.max_connections, self.head_seconds = max_connections, head_seconds
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.open = 0
        self.refused = 0  # connections refused at the limit, in all
        self.timed_out = 0  # connections closed for an incomplete head, in all
        self._said = False

    def full(self) -> bool:
        if self.open < self.max_connections:
            if self._said and self.open < self.max_connections // 2:
                self._said = False  # the episode is over: the next one is said again
            return False
        self.refused += 1
        if not self._said:
            self._said = True
            self.say(f"ciosl serve: {self.open} connections open, the most --max-connections "
                     "allows: new ones are answered 503 and closed until some close (said "
                     "once)")
        return True

    def protocol(self) -> type:
        guard = self

        class Guarded(HttpToolsProtocol):
            _refused = False
            _head_timer = None
            _heard = False  # bytes of the next request head have arrived
            _awaiting = True  # no request in hand: the next one's head is awaited
            _in_head = False  # a request's head begun (the parser said so), not complete
            _head_bytes = 0  # bytes received since the head was awaited or begun

            def connection_made(self, transport):
                if guard.full():
                    self._refused = True
                    transport.write(_response("503 Service Unavailable", "too many "
                                              "connections (--max-connections); retry"))
                    transport.close()
                    return
                guard.open += 1
                super().connection_made(transport)
                self._arm()

            def connection_lost(self, exc):
                if self._refused:
                    return
                guard.open -= 1
                self._disarm()
                super().connection_lost(exc)

            def data_received(self, data):
                heading = self._awaiting or self._in_head
                if heading:
                    self._heard = True
                    self._head_bytes += len(data)
                super().data_received(data)
                if (self._awaiting or self._in_head) and self._head_bytes > MAX_HEAD \
                        and not self.transport.is_closing():
                    self._disarm()
                    self.transport.write(_response(
                        "431 Request Header Fields Too Large", f"request head over "
                        f"{MAX_HEAD} bytes (the request line and headers)"))
                    self.transport.close()
                    return
                self._arm()

            def on_message_begin(self):
                self._in_head = True
                super().on_message_begin()

            def on_headers_complete(self):
                self._awaiting = self._in_head = self._heard = False
                self._head_bytes = 0
                super().on_headers_complete()

            def on_response_complete(self):
                pipelined = bool(self.pipeline)  # a next request's head already complete
                super().on_response_complete()
                if not pipelined and not self._in_head:
                    self._awaiting, self._heard, self._head_bytes = True, False, 0
                self._arm()

            def _arm(self):
                """A timer runs while the next request's head is awaited; none otherwise."""
                waiting = self._awaiting or self._in_head
                if not waiting or self.transport.is_closing():
                    self._disarm()
                elif self._head_timer is None:
                    self._head_timer = self.loop.call_later(guard.head_seconds, self._expire)

            def _disarm(self):
                if self._head_timer is not None:
                    self._head_timer.cancel()
                    self._head_timer = None

            def _expire(self):
                self._head_timer = None
                if self.transport.is_closing():
                    return
                guard.timed_out += 1
                if self._heard:  # a head begun and not finished: say why it is closed
                    self.transport.write(_response(
                        "408 Request Timeout", f"request head not complete within "
                        f"{guard.head_seconds:g} s (--header-timeout)"))
                self.transport.close()

        return Guarded


def open_files_limit() -> int:
    """The open-file limit, raised to the hard limit where the soft one is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft
