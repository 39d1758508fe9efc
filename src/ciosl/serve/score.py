"""A served learner's live score: test-then-train on feedback, as river's
``progressive_val_score`` does. Each feedback row scores the answer that was given (kept in the
prediction window) against the label given later, and only then is learned.

The score is a deterministic function of the learner's log: the writer updates it when a
feedback record is applied, recovery when it is replayed, and a snapshot keeps it (``state``),
so a recovered learner's score equals a replay of its log. Figures:

- ``accuracy``: of every answer corrected since the learner was made; ``accuracy_last``: of the
  last ``window`` ones;
- ``recall``: per true label, since start; ``counts``: samples learned per label (learns and
  feedback);
- ``confusion``: true (rows) x answered (columns), over the last ``window`` feedback rows;
- ``new_class``: feedback whose label was new to the learner when it answered: ``n`` of them,
  ``answered_known`` (its novelty below the threshold: taken for a known class), their ``rate``,
  and the ``auroc`` of the novelty score separating them from known-class rows (last
  ``window``);
- the novelty threshold (``threshold``): the 95th percentile of the novelty of the last
  ``window`` feedback rows whose label was known, once there are ``MIN_KNOWN`` of them (until
  then nothing is ``novel``).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np

MIN_KNOWN = 20  # known-class feedback rows before the threshold exists
QUANTILE = 0.95


class LiveScore:
    def __init__(self, window: int):
        self.window = int(window)
        self.n = 0
        self.correct = 0
        self.per_class: dict[Any, list[int]] = {}  # true label -> [rows, correct]
        self.counts: dict[Any, int] = {}  # label -> samples learned
        # the last ``window`` rows: (true, answered, novelty, new at the time, novel)
        self.last: collections.deque = collections.deque(maxlen=self.window)
        self.new_n = 0
        self.new_known = 0
        self._threshold: tuple[int, float | None] = (-1, None)

    # ------------------------------------------------------------------ updates (the writer)
    def learned(self, y: list) -> None:
        for lab in y:
            self.counts[lab] = self.counts.get(lab, 0) + 1

    def scored(self, y: Any, answered: Any, novelty: float, new: bool, novel: bool) -> None:
        """One feedback row: the answer given, then the label (before it is learned)."""
        self.n += 1
        ok = same(answered, y)
        self.correct += ok
        row = self.per_class.setdefault(y, [0, 0])
        row[0] += 1
        row[1] += ok
        if new:
            self.new_n += 1
            self.new_known += not novel
        self.last.append((y, answered, float(novelty), bool(new), bool(novel)))

    def threshold(self) -> float | None:
        if self._threshold[0] != self.n:  # computed once per feedback row
            known = [v for (_, _, v, new, _) in self.last if not new]
            value = None if len(known) < MIN_KNOWN else float(
                np.quantile(np.asarray(known), QUANTILE, method="higher"))
            self._threshold = (self.n, value)
        return self._threshold[1]

    # ------------------------------------------------------------------ figures
    def figures(self) -> dict:
        last = list(self.last)
        acc_last = sum(same(a, t) for t, a, *_ in last) / len(last) \
            if last else None
        labels = sorted({t for t, *_ in last} | {a for _, a, *_ in last}, key=_order)
        index = {lab: i for i, lab in enumerate(labels)}
        matrix = [[0] * len(labels) for _ in labels]
        for t, a, *_ in last:
            matrix[index[t]][index[a]] += 1
        return {
            "feedback": self.n,
            "accuracy": self.correct / self.n if self.n else None,
            "accuracy_last": acc_last,
            "window": self.window,
            "recall": {str(k): c / r for k, (r, c) in sorted(self.per_class.items(),
                                                               key=lambda kv: _order(kv[0]))},
            "counts": {str(k): v for k, v in sorted(self.counts.items(),
                                                     key=lambda kv: _order(kv[0]))},
            "confusion": {"labels": labels, "matrix": matrix},
            "new_class": {"n": self.new_n, "answered_known": self.new_known,
                          "rate": self.new_known / self.new_n if self.new_n else None,
                          "auroc": auroc([v for *_, v, new, _ in last if new],
                                         [v for *_, v, new, _ in last if not new])},
            "threshold": self.threshold(),
        }

    # ------------------------------------------------------------------ snapshots
    def state(self) -> dict:
        return {"window": self.window, "n": self.n, "correct": self.correct,
                "per_class": [[k, r, c] for k, (r, c) in self.per_class.items()],
                "counts": [[k, v] for k, v in self.counts.items()],
                "last": [list(r) for r in self.last], "new": [self.new_n, self.new_known]}

    @classmethod
    def from_state(cls, state: dict, window: int) -> LiveScore:
        """A score kept by a snapshot; a window other than the one it was kept with keeps
        the newest rows that fit."""
        s = cls(window)
        s.n, s.correct = int(state["n"]), int(state["correct"])
        s.per_class = {k: [int(r), int(c)] for k, r, c in state["per_class"]}
        s.counts = {k: int(v) for k, v in state["counts"]}
        s.last.extend(tuple(r) for r in state["last"])
        s.new_n, s.new_known = (int(v) for v in state["new"])
        return s


def _order(label: Any) -> tuple:
    return (isinstance(label, str), label)


def auroc(positive: list[float], negative: list[float]) -> float | None:
    """The probability that a positive (a new class) scores above a negative, ties counting
    half (Mann-Whitney U); None without both."""
    if not positive or not negative:
        return None
    pos, neg = np.asarray(positive), np.sort(np.asarray(negative))
    below = np.searchsorted(neg, pos, side="left")
    equal = np.searchsorted(neg, pos, side="right") - below
    return float((below + 0.5 * equal).sum() / (len(pos) * len(neg)))


def same(answered: Any, y: Any) -> bool:
    """An answer is correct when it is the label itself (1 is not "1")."""
    return answered == y and type(answered) is type(y)


class Rates:
    """Learns and predictions of one learner over the last ``SPAN`` seconds (samples per second)
    and the median time of the last ``KEEP`` requests of each; measured, not part of the log."""

    SPAN, KEEP = 10.0, 1000

    def __init__(self):
        self.began = time.monotonic()
        self.kinds = {k: collections.deque(maxlen=self.KEEP) for k in ("learn", "predict")}
        self._lock = threading.Lock()

    def record(self, kind: str, seconds: float, samples: int) -> None:
        with self._lock:
            self.kinds[kind].append((time.monotonic(), seconds, samples))

    def figures(self) -> dict:
        now = time.monotonic()
        span = min(self.SPAN, max(now - self.began, 1e-3))
        out = {}
        with self._lock:
            for kind, rows in self.kinds.items():
                recent = sum(n for t, _, n in rows if now - t <= span)
                out[f"{kind}_per_s"] = round(recent / span, 3)
                times = [s for _, s, _ in rows]
                out[f"{kind}_p50_ms"] = round(1000 * float(np.median(times)), 3) if times \
                    else None
        return out
