"""The events of a served learner, for ``GET /v1/learners/NAME/events`` (Server-Sent Events):
``learn`` ({"learned", "seen", "seq"}), ``class`` ({"label"}: a class new to the learner),
``feedback`` ({"prediction_id", "y", "answered", "correct"}) and ``score`` (the live metrics,
about once a second while someone listens and something changed).

Each event has an id, increasing integers per learner (the events are held in memory, the last
``KEEP`` of them; a learner unloaded keeps its events). A server's life numbers them from the
microseconds since the epoch at which it first held the learner, so an id of an earlier life is
below every id of a later one (a learner produces far fewer than a million events a second). A
client that reconnects with ``Last-Event-ID: k`` gets every event after ``k`` still kept, then the
live ones: after a restart, every event of the new life kept; a ``k`` above the last id (a clock
set back) gets every event kept too."""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Any

KEEP = 1000


class EventLog:
    def __init__(self, keep: int = KEEP, first: int | None = None):
        self.events: collections.deque = collections.deque(maxlen=keep)
        self.last_id = (time.time_ns() // 1000 if first is None else first) - 1
        self.score_key: Any = None  # what the last score event described (seq, feedback)
        self._lock = threading.Lock()

    def add(self, name: str, data: dict) -> int:
        with self._lock:
            self.last_id += 1
            self.events.append((self.last_id, name, data))
            return self.last_id

    def after(self, k: int) -> list[tuple[int, str, dict]]:
        with self._lock:
            if k > self.last_id:  # ids from an earlier life of the server
                k = 0
            return [e for e in self.events if e[0] > k]

    def score_due(self, key: Any) -> bool:
        """Whether a score event describing ``key`` is news (and claim it)."""
        with self._lock:
            if key == self.score_key:
                return False
            self.score_key = key
            return True


def frame(event_id: int, name: str, data: dict) -> bytes:
    """One Server-Sent Event (its data on one line: JSON escapes every newline)."""
    return (f"id: {event_id}\nevent: {name}\ndata: "
            f"{json.dumps(data, separators=(',', ':'))}\n\n").encode()


def last_event_id(value: str | None) -> int:
    """The ``Last-Event-ID`` header as an integer (0 when absent or not one)."""
    if value is None or not value.strip().isdigit() or len(value.strip()) > 18:
        return 0
    return int(value.strip())
