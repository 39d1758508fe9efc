"""The events of a served learner, for ``GET /v1/learners/NAME/events`` (Server-Sent Events):
``learn`` ({"learned", "seen", "seq"}), ``class`` ({"label"}: a class new to the learner),
``feedback`` ({"prediction_id", "y", "answered", "correct"}) and ``score`` (the live metrics,
about once a second while someone listens and something changed).

Each event has an id, increasing integers per learner from 1 (the server's life: the events are
held in memory, the last ``KEEP`` of them; a learner unloaded keeps its events). A client that
reconnects with ``Last-Event-ID: k`` gets every event after ``k`` still kept, then the live
ones; a ``k`` above the last id (the server restarted) gets every event kept."""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

KEEP = 1000


class EventLog:
    def __init__(self, keep: int = KEEP):
        self.events: collections.deque = collections.deque(maxlen=keep)
        self.last_id = 0
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
