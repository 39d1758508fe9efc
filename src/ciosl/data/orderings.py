"""The four data orderings of the streaming protocol, as pure functions.

``make_ordering(kind, labels, seed=..., base_fraction=..., classes_per_step=..., instances=...,
frames=...)`` returns which training samples form the base initialization, the order in which
the rest arrive, and the testing events:

- ``iid``: a random ``base_fraction`` of the samples for base init, the rest shuffled.
- ``class_iid``: classes in a seed-permuted order, ``classes_per_step`` per step; base init on
  the first step's classes; then each step's samples, shuffled, one step after the other.
- ``instance``: a random ``base_fraction`` for base init; the rest in temporally ordered chunks
  of ``chunk`` (50) frames per object instance, round-robin over the instances (seed-permuted)
  until every instance is exhausted; ``chunk=None`` plays each instance's video whole.
- ``class_instance``: as class_iid, but inside a step whole classes come one after the other,
  and inside a class instance after instance (seed-permuted), frames in temporal order.

Testing events: class orderings test after base init and after each class step on the classes
seen so far; iid / instance test at the same number of evenly spaced stream positions (the
first right after base init, the last at the end) on all classes. ``max_events=N`` (a long
stream of many classes: 100,000 classes in steps of 2 would be 50,000 events) keeps at most N
of them, evenly spaced over the events (class orderings: over the class steps, the base event
and the last step always kept); the stream itself does not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ORDERINGS = ("iid", "class_iid", "instance", "class_instance")
TEMPORAL = ("instance", "class_instance")
# CORe50's official scenarios (data/streams.py ``official_ordering``): only datasets that ship
# their batches accept them
OFFICIAL = ("ni", "nc", "nic")


@dataclass(frozen=True)
class Ordering:
    kind: str
    seed: int
    base: np.ndarray  # (n_base,) training indices for base init
    stream: np.ndarray  # (n_stream,) training indices in arrival order
    events: np.ndarray  # (T,) stream positions (samples learned so far) of the testing events
    event_classes: tuple[tuple[int, ...], ...] | None  # classes tested at each event; None: all
    class_order: tuple[int, ...]  # seed-permuted class order (class orderings), else sorted

    def test_mask(self, test_y: np.ndarray, t: int) -> np.ndarray:
        """Which test samples are scored at event t: those of the classes learned by then
        (class orderings: the steps so far; iid and instance: every class of the training set;
        a test label that no training sample has, e.g. Stream-51's novel images, is never
        scored for accuracy, only as novel by the open-set protocol)."""
        return np.isin(test_y, self.known(t))

    def known(self, t: int) -> tuple[int, ...]:
        """The classes learned by event t; a test sample of any other class is novel there."""
        return self.class_order if self.event_classes is None else self.event_classes[t]

    def seen(self, t: int) -> np.ndarray:
        """Training indices learned by event t (base init + stream prefix)."""
        return np.concatenate([self.base, self.stream[: self.events[t]]])


def check_kind(kind: str) -> str:
    if kind not in ORDERINGS + OFFICIAL:
        raise ValueError(f"unknown ordering {kind!r}; valid choices: "
                         f"{', '.join(ORDERINGS + OFFICIAL)}")
    return kind


def n_steps(n_classes: int, classes_per_step: int) -> int:
    """Number of testing events: base init plus one per class step."""
    return int(np.ceil(n_classes / classes_per_step))


def _class_steps(classes: np.ndarray, classes_per_step: int, rng) -> list[np.ndarray]:
    order = rng.permutation(classes)
    return [order[i : i + classes_per_step] for i in range(0, len(order), classes_per_step)]


def _random_base(n: int, base_fraction: float, rng) -> tuple[np.ndarray, np.ndarray]:
    perm = rng.permutation(n)
    n_base = min(n - 1, max(1, int(round(base_fraction * n))))
    return np.sort(perm[:n_base]), perm[n_base:]


def _even_events(n_stream: int, n_events: int) -> np.ndarray:
    return np.unique(np.linspace(0, n_stream, max(2, n_events)).round().astype(np.int64))


def _pick_events(n_events: int, max_events: int | None) -> np.ndarray:
    """Indices of at most ``max_events`` of ``n_events`` events, evenly spaced, the first and
    the last included (all of them when ``max_events`` is None or not smaller)."""
    if max_events is None or max_events >= n_events:
        return np.arange(n_events)
    return np.unique(np.linspace(0, n_events - 1, max_events).round().astype(np.int64))


def _indices_of(labels: np.ndarray, classes: np.ndarray) -> dict[int, np.ndarray]:
    """The ascending training indices of each class, in one sort (not one scan per class)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], classes, side="left")
    ends = np.append(bounds[1:], len(order))
    return {int(c): order[a:b] for c, a, b in zip(classes, bounds, ends, strict=True)}


def _temporal(idx: np.ndarray, instances: np.ndarray, frames: np.ndarray) -> dict[int, np.ndarray]:
    """Indices of each instance, in temporal (frame) order."""
    out = {}
    for inst in np.unique(instances[idx]):
        sel = idx[instances[idx] == inst]
        out[int(inst)] = sel[np.argsort(frames[sel], kind="stable")]
    return out


def make_ordering(
    kind: str,
    labels: np.ndarray,
    *,
    seed: int,
    base_fraction: float,
    classes_per_step: int,
    instances: np.ndarray | None = None,
    frames: np.ndarray | None = None,
    chunk: int | None = 50,
    max_events: int | None = None,
) -> Ordering:
    check_kind(kind)
    if kind in OFFICIAL:
        raise ValueError(f"the {kind!r} ordering is CORe50's official scenario: its batches "
                         "come from the dataset's LUP.pkl (data.streams.official_ordering)")
    labels = np.asarray(labels)
    n = len(labels)
    if n < 2:
        raise ValueError(f"ordering needs at least 2 training samples, got {n}")
    if classes_per_step < 1:
        raise ValueError(f"classes_per_step must be >= 1, got {classes_per_step}")
    if max_events is not None and max_events < 2:
        raise ValueError(f"--max-events must be >= 2 (base init and the end), got {max_events}")
    if kind in TEMPORAL and (instances is None or frames is None):
        raise ValueError(
            f"the {kind!r} ordering needs object-instance ids and frame indices; this dataset "
            "has none (use iid or class_iid, or a temporally ordered dataset)"
        )
    rng = np.random.default_rng([seed, ORDERINGS.index(kind)])
    classes = np.unique(labels)
    T = n_steps(len(classes), classes_per_step)

    if kind in ("iid", "instance"):
        base, rest = _random_base(n, base_fraction, rng)
        if kind == "iid":
            stream = rest
        else:
            by_inst = _temporal(np.sort(rest), instances, frames)
            order = rng.permutation(list(by_inst))
            if chunk is None:  # whole videos, one after another
                chunk = max((len(v) for v in by_inst.values()), default=1)
            parts, r = [], 0
            while True:
                round_parts = [by_inst[i][r * chunk : (r + 1) * chunk] for i in order]
                round_parts = [p for p in round_parts if len(p)]
                if not round_parts:
                    break
                parts += round_parts
                r += 1
            stream = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        events = _even_events(len(stream), min(T, max_events or T))
        return Ordering(kind, seed, base, stream.astype(np.int64), events, None,
                        tuple(int(c) for c in classes))

    steps = _class_steps(classes, classes_per_step, rng)
    if len(steps) < 2:
        raise ValueError(
            f"{kind}: {len(classes)} classes with {classes_per_step} per step leave no class "
            "for the stream"
        )
    idx_of = _indices_of(labels, classes)
    base = np.sort(np.concatenate([idx_of[int(c)] for c in steps[0]]))
    parts, events, n_seen = [], [0], [len(steps[0])]
    pos = 0
    for step in steps[1:]:
        if kind == "class_iid":
            block = rng.permutation(np.concatenate([idx_of[int(c)] for c in step]))
        else:
            block_parts = []
            for c in step:
                by_inst = _temporal(idx_of[int(c)], instances, frames)
                block_parts += [by_inst[i] for i in rng.permutation(list(by_inst))]
            block = np.concatenate(block_parts)
        parts.append(block)
        pos += len(block)
        events.append(pos)
        n_seen.append(n_seen[-1] + len(step))
    class_order = tuple(int(c) for s in steps for c in s)
    kept = _pick_events(len(events), max_events)  # the classes seen at each kept event
    seen = tuple(class_order[:n_seen[t]] for t in kept)
    return Ordering(kind, seed, base, np.concatenate(parts).astype(np.int64),
                    np.asarray(events, dtype=np.int64)[kept], seen, class_order)


def limit_per_class(labels: np.ndarray, n: int, *, instances: np.ndarray | None = None,
                    frames: np.ndarray | None = None) -> np.ndarray:
    """Sorted indices keeping at most ``n`` training samples per class (for quick runs).

    Deterministic. With temporal data the kept frames are evenly spaced along each class's
    (instance, frame) order, so every instance stays a temporally ordered sequence.
    """
    if n < 1:
        raise ValueError(f"limit per class must be >= 1, got {n}")
    labels = np.asarray(labels)
    keep = []
    rng = np.random.default_rng(0)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) <= n:
            keep.append(idx)
        elif instances is not None and frames is not None:
            idx = idx[np.lexsort((frames[idx], instances[idx]))]
            keep.append(idx[np.linspace(0, len(idx) - 1, n).round().astype(np.int64)])
        else:
            keep.append(rng.choice(idx, size=n, replace=False))
    return np.sort(np.concatenate(keep))
