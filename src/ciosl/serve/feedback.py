"""The prediction window of a served learner: the features and the answer of its last ``size``
predictions, by prediction id, so that a label given later (feedback) can be learned from the
features that were asked about and can score the answer that was given.

Kept in memory and in one append-only file per learner, ``predictions.bin``: an entry per row
predicted, written (one ``write`` per request) before the prediction is answered, so it
survives a crash of the process (the page cache holds it; it is fsynced at each snapshot and at
a clean stop, not per prediction: a power cut may lose the last predictions, never a learn).
When the file holds twice the window, its last ``size`` entries are written to a new file that
replaces it (compaction): memory holds at most ``size`` rows, the disk at most ``2 * size``.

An entry: ``<4sII`` (b"PRED", JSON length, floats), the JSON ``{"p": number, "a": answered
label, "v": novelty, "k": classes at the time, "n": novel}``, the row as float32. A prediction
id is ``p-<number>``, numbers increasing per learner (also across restarts): an id above the
last issued was never issued (404), one below the window's oldest has left it (410). A torn last
entry (a crash in the middle of its write) is dropped at load.
"""

from __future__ import annotations

import collections
import json
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ciosl.serve import wal

FILE = "predictions.bin"
HEAD = struct.Struct("<4sII")
MAGIC = b"PRED"
PID = re.compile(r"p-(\d{1,18})", re.ASCII)


@dataclass(frozen=True)
class Kept:
    """One prediction row: its features, the answer given, its novelty, the number of classes
    the learner had then, and whether it was answered as novel."""

    x: np.ndarray  # (d,) float32
    answered: Any
    novelty: float
    known: int
    novel: bool


class Gone(LookupError):
    """A prediction id not in the window: ``status`` 404 (never issued) or 410 (left it)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def novelty_of(learner, X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """The learner's novelty score of ``X`` (1 - max probability, from ``P``, unless it has a
    score of its own)."""
    from ciosl.learners.base import Learner

    if type(learner)._novelty_score is Learner._novelty_score:
        return 1.0 - P.max(axis=1)
    return learner.novelty_score(X)


def parse_pid(value: Any, field: str) -> int:
    if not isinstance(value, str) or PID.fullmatch(value) is None:
        raise ValueError(f"{field}: expected a prediction id such as 'p-12', got "
                         f"{str(value)[:40]!r}")
    return int(value[2:])


class PredictionWindow:
    def __init__(self, folder: Path, size: int):
        self.path, self.size = Path(folder) / FILE, int(size)
        self.rows: collections.OrderedDict[int, Kept] = collections.OrderedDict()
        self.next = 0  # the number of the next prediction id
        self.in_file = 0  # entries in the file
        self._lock = threading.Lock()
        self._load()
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        pos = good = 0
        while pos + HEAD.size <= len(data):
            magic, m, n = HEAD.unpack_from(data, pos)
            end = pos + HEAD.size + m + 4 * n
            if magic != MAGIC or end > len(data):
                break  # a torn last entry (or zeros never written): dropped
            try:
                meta = json.loads(data[pos + HEAD.size: pos + HEAD.size + m])
                x = np.frombuffer(data, "<f4", n, pos + HEAD.size + m).astype(np.float32)
                self._keep(int(meta["p"]), Kept(x, meta["a"], float(meta["v"]),
                                                int(meta["k"]), bool(meta["n"])))
            except (ValueError, KeyError, TypeError):
                break
            pos = good = end
            self.in_file += 1
        if good < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good)

    def _keep(self, number: int, kept: Kept) -> None:
        self.rows[number] = kept
        self.next = max(self.next, number + 1)
        while len(self.rows) > self.size:
            self.rows.popitem(last=False)

    def add(self, X: np.ndarray, answered: list, novelty: list, known: int,
            novel: list) -> list[str]:
        """Keep the rows of one prediction (written before it is answered); their ids."""
        with self._lock:
            first = self.next
            blobs = []
            for i in range(len(X)):
                kept = Kept(np.array(X[i], np.float32), answered[i], float(novelty[i]), known,
                            bool(novel[i]))
                meta = json.dumps({"p": first + i, "a": kept.answered, "v": kept.novelty,
                                   "k": known, "n": kept.novel}, separators=(",", ":")).encode()
                blobs.append(HEAD.pack(MAGIC, len(meta), X.shape[1]) + meta
                             + kept.x.astype("<f4").tobytes())
                self._keep(first + i, kept)
            wal._write_all(self.fd, b"".join(blobs))
            self.in_file += len(X)
            if self.in_file > 2 * self.size:
                self._compact()
            return [f"p-{first + i}" for i in range(len(X))]

    def get(self, pid: str, field: str = "prediction_id") -> Kept:
        number = parse_pid(pid, field)
        with self._lock:
            kept = self.rows.get(number)
            if kept is not None:
                return kept
            if number >= self.next:
                raise Gone(404, f"{field} {pid}: never issued by this learner")
            raise Gone(410, f"{field} {pid}: no longer in the feedback window (the last "
                       f"{self.size} predictions)")

    def _compact(self) -> None:
        tmp = self.path.with_name(f".{FILE}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            blobs = []
            for number, k in self.rows.items():
                meta = json.dumps({"p": number, "a": k.answered, "v": k.novelty, "k": k.known,
                                   "n": k.novel}, separators=(",", ":")).encode()
                blobs.append(HEAD.pack(MAGIC, len(meta), len(k.x)) + meta
                             + k.x.astype("<f4").tobytes())
            wal._write_all(fd, b"".join(blobs))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.in_file = len(self.rows)

    def sync(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.fsync(self.fd)

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.fsync(self.fd)
                os.close(self.fd)
                self.fd = -1
