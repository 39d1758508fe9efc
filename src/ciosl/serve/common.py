"""What the served learner's modules share: the server's options (``Options``), a method's
settings from ``--set``, the check that labels and ids are Unicode text, one-line errors, and
``log_ids`` (the ids a folder holds, for checks and tests)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ciosl.errors import LearnerError
from ciosl.learners.registry import get_method
from ciosl.learners.settings import parse_value, plain
from ciosl.serve import ids as ids_mod
from ciosl.serve import wal
from ciosl.serve.folder import POINTER, ServeError

MAX_SECONDS = 30 * 86400  # a time setting above this is a mistake (and overflows a wait)


@dataclass
class Options:
    snapshot_every: int = 100_000  # samples learned between two snapshots (0: never by count)
    snapshot_seconds: float = 300.0  # seconds between two snapshots when there is news (0: never)
    id_window: int = 1_000_000  # how many of the last idempotency ids are remembered
    id_window_bytes: int = 64 * 2**20  # and at most this many bytes of them (the ids file)
    max_group: int = 512  # requests in one group commit at most
    snapshot_on_close: bool = True
    # the writer thread's nice value (Linux: per thread): under load the scheduler gives the
    # CPU to the threads that answer first, so learning slows down before answers do
    writer_nice: int = 10
    feedback_window: int = 10_000  # predictions whose features are kept for feedback
    # a closed form's answer (ncm, slda, rp_lda, ranpac) is brought current at most every this
    # many ms while predictions are asked (0: after every learn, exact); answers say their seq
    answer_every_ms: float = 0.0
    # where the learners' records go: "folder" (each learner's own write-ahead log, the
    # default) or nats://HOST:PORT[,HOST:PORT...] (JetStream: jetstream.py, replica.py)
    log: str = "folder"
    log_replicas: int | None = None  # JetStream replicas (None: min(3, servers given))
    log_dedupe_window: float = 120.0  # JetStream's duplicate window (seconds)
    min_seq_wait: float = 5.0  # seconds a predict with min_seq waits for that seq at most

    def __post_init__(self) -> None:
        """Each value checked, its flag named (one line): a bad one fails at start, never in
        the writer thread later."""
        if not (isinstance(self.snapshot_every, int) and self.snapshot_every >= 0):
            raise ServeError(f"--snapshot-every must be >= 0, got {self.snapshot_every}")
        t = self.snapshot_seconds
        if not (isinstance(t, int | float) and math.isfinite(t) and 0 <= t <= MAX_SECONDS):
            raise ServeError(f"--snapshot-seconds must be a number in 0..{MAX_SECONDS}, got {t}")
        if not 1 <= self.id_window <= 100_000_000:
            raise ServeError(f"--id-window must be in 1..100000000, got {self.id_window}")
        if not 1 << 16 <= self.id_window_bytes <= ids_mod.MAX_WINDOW_BYTES:
            raise ServeError(f"--id-window-bytes must be in {1 << 16}.."
                             f"{ids_mod.MAX_WINDOW_BYTES}, got {self.id_window_bytes}")
        if not 1 <= self.feedback_window <= 10_000_000:
            raise ServeError(f"--feedback-window must be in 1..10000000, got "
                             f"{self.feedback_window}")
        t = self.answer_every_ms
        if not (isinstance(t, int | float) and math.isfinite(t) and 0 <= t <= 60_000):
            raise ServeError(f"--answer-every-ms must be a number in 0..60000, got {t}")
        if self.feedback_window > self.id_window:
            raise ServeError(f"--feedback-window {self.feedback_window} must be at most "
                             f"--id-window {self.id_window}: a prediction is corrected once "
                             "while its id is remembered")
        if not 0 <= self.writer_nice <= 19:
            raise ServeError(f"--writer-nice must be in 0..19, got {self.writer_nice}")
        self._check_log()

    def _check_log(self) -> None:
        if self.log != "folder":
            from ciosl.serve.jetstream import parse_log

            urls = parse_log(self.log)  # one line naming --log
            if self.log_replicas is None:
                self.log_replicas = min(3, len(urls))
        r = self.log_replicas
        if r is not None and not (isinstance(r, int) and 1 <= r <= 5):
            raise ServeError(f"--log-replicas must be in 1..5, got {r}")
        t = self.log_dedupe_window
        if not (isinstance(t, int | float) and math.isfinite(t) and 0.1 <= t <= 86400):
            raise ServeError(f"--log-dedupe-window must be a number of seconds in 0.1..86400, "
                             f"got {t}")
        t = self.min_seq_wait
        if not (isinstance(t, int | float) and math.isfinite(t) and 0 <= t <= 3600):
            raise ServeError(f"--min-seq-wait must be a number of seconds in 0..3600, got {t}")


def settings_for(method: str, overrides: dict[str, str]) -> dict[str, Any]:
    """The settings of ``--method`` with ``--set NAME=VALUE`` parsed by each setting's type and
    checked by the constructor."""
    cls = get_method(method)
    known = {s.name: s for s in cls.settings()}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ServeError(f"--set: unknown setting(s) {', '.join(unknown)} for method "
                         f"{cls.name!r}; valid settings: {', '.join(sorted(known))}")
    values = {k: parse_value(known[k], v) for k, v in overrides.items()}
    return plain(cls(**values).get_params())


def bad_text(y: list, rid: str | None) -> str | None:
    """What is not valid Unicode text among the labels and the id (a lone surrogate such as
    ``"\\ud800"`` is valid JSON but no text: no file or answer could hold it), or None."""
    for name, v in [*((f"y[{i}]", lab) for i, lab in enumerate(y)), ("id", rid)]:
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return (f"{name}: not valid Unicode text (a lone surrogate "
                        f"U+{ord(v[e.start]):04X} at character {e.start})")
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if isinstance(e, LearnerError | ValueError | TypeError) else \
        f"{type(e).__name__}: {line}"


def log_ids(folder: str | Path) -> list[tuple[int, str | None]]:
    """Every (sequence number, id) the folder's snapshot ids and log hold, in order (the
    requests applied, as far as the id window reaches back). For checks and tests; the server
    must not be running."""
    folder = Path(folder)
    snap_seq, out = 0, []
    pointer = folder / POINTER
    if pointer.exists():
        p = json.loads(pointer.read_text())
        snap_seq = p["seq"]
        out = ids_mod.read_ids(folder / "snapshots" / p["ids"])
    for r in wal.iter_log(folder / "log", snap_seq, {}):
        if r.fb is None:
            out.append((r.seq, r.id))
        else:  # a feedback record: one id per prediction id it corrects
            out.extend((r.seq, f"fb:{row[0]}") for row in r.fb)
    return out
