"""Replay memory: invariants under random streams, replacement and selection statistics, state."""

from __future__ import annotations

import copy
import io
import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ciosl.learners.memory import REPLACEMENTS, SELECTIONS, ReplayMemory

SIGMAS = 5.0  # tolerance of every frequency check, in binomial standard deviations
DIM = 3


def binomial_ok(counts: np.ndarray, n: int, p: np.ndarray) -> bool:
    """Every count within SIGMAS binomial standard deviations of n * p."""
    sd = np.sqrt(n * p * (1 - p))
    return bool(np.all(np.abs(counts - n * p) <= SIGMAS * sd + 1e-9))


def item(i: int, y: int, n_cls: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (DIM,) with the unique id in column 0, and logits (n_cls,) derived from it."""
    z = torch.tensor([float(i), float(y), 1.0])
    return z, float(i) + 0.01 * torch.arange(1, n_cls + 1, dtype=torch.float32)


# one stream element: (label, loss, uncertainty, grow the logits before it, logits missing)
element = st.tuples(
    st.integers(0, 6),
    st.one_of(st.just(0.0), st.floats(0, 10)),
    st.floats(0, 3),
    st.booleans(),
    st.integers(0, 2),
)


def run_stream(mem: ReplayMemory, stream: list, rng: np.random.Generator) -> dict:
    """Feed ``stream`` and check the invariants after every offer; returns slot -> record."""
    held: dict[int, dict] = {}
    n_cls = 0
    for i, (y, loss, unc, grow, short) in enumerate(stream):
        n_cls = max(n_cls, y + 1) + int(grow)
        if grow:
            mem.grow_logits(n_cls)
        n = max(0, n_cls - short)  # fewer logits than stored before: the rest must be zeroed
        z, h = item(i, y, n)
        before = mem.size
        slot = mem.offer(z, y, logits=h, loss=loss, uncertainty=unc, rng=rng)
        if before < mem.capacity or mem.replacement in ("lawcbr", "class_balanced_random"):
            assert slot is not None
        if before < mem.capacity:
            assert slot == before
        if slot is not None:
            held[slot] = {"id": i, "y": y, "n": n, "loss": loss, "unc": unc}
        assert mem.size == len(held) <= mem.capacity
        assert mem.n_offered == i + 1
        assert mem.class_counts() == dict(Counter(mem.y[: mem.size].tolist()))
    return held


def check_contents(mem: ReplayMemory, held: dict) -> None:
    ids = mem.z[: mem.size, 0].long().tolist()
    assert len(set(ids)) == len(ids)  # no duplicated item
    slots = np.arange(mem.size)
    assert ids == [held[s]["id"] for s in slots]
    assert mem.y[: mem.size].tolist() == [held[s]["y"] for s in slots]
    logits, mask = mem.distill_targets(slots)
    n = torch.tensor([held[s]["n"] for s in slots])
    assert torch.equal(mem.n_logits[: mem.size], n)
    assert torch.equal(mask, torch.arange(mem.width)[None, :] < n[:, None])
    for s in slots:
        _, h = item(held[s]["id"], held[s]["y"], held[s]["n"])
        assert torch.equal(logits[s, : held[s]["n"]], h)
        assert not logits[s, held[s]["n"]:].any()  # left-aligned, zero-padded


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.integers(1, 50),
    replacement=st.sampled_from(REPLACEMENTS),
    stream=st.lists(element, min_size=1, max_size=150),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_streams_keep_invariants(capacity, replacement, stream, seed):
    mem = ReplayMemory(capacity, DIM, replacement=replacement)
    held = run_stream(mem, stream, np.random.default_rng(seed))
    assert mem.size == min(capacity, len(stream))
    check_contents(mem, held)
    z, y = mem.batch(np.arange(mem.size))
    assert z.shape == (mem.size, DIM) and torch.equal(y, mem.y[: mem.size])


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 50),
    replacement=st.sampled_from(REPLACEMENTS),
    stream=st.lists(element, min_size=1, max_size=100),
    data=st.data(),
)
def test_update_changes_only_given_slots(capacity, replacement, stream, data):
    mem = ReplayMemory(capacity, DIM, replacement=replacement)
    run_stream(mem, stream, np.random.default_rng(0))
    slots = np.array(
        data.draw(st.lists(st.integers(0, mem.size - 1), unique=True, max_size=mem.size)),
        dtype=np.int64,
    )
    width = mem.width + data.draw(st.integers(0, 2))  # the logits may grow on update
    k = len(slots)
    new_h = torch.randn(k, width)
    new_loss, new_unc = torch.rand(k) * 5, torch.rand(k)
    old = {name: getattr(mem, name).clone() for name in ("z", "y", "n_logits", "loss",
                                                           "uncertainty", "logits")}
    mem.update(slots, logits=new_h, loss=new_loss, uncertainty=new_unc)
    rest = np.setdiff1d(np.arange(mem.capacity), slots)
    for name, before in old.items():
        after = getattr(mem, name)
        now = after[rest, : before.shape[1]] if before.ndim == 2 else after[rest]
        assert torch.equal(now, before[rest]), name
    assert not mem.logits[rest, old["logits"].shape[1]:].any()
    assert torch.equal(mem.logits[slots, :width], new_h)
    assert torch.equal(mem.n_logits[slots], torch.full((k,), width))
    assert torch.equal(mem.loss[slots], new_loss)
    assert torch.equal(mem.uncertainty[slots], new_unc)
    _, mask = mem.distill_targets(slots)
    assert mask[:, :width].all() and not mask[:, width:].any()


def test_logits_grow_between_stores():
    mem = ReplayMemory(4, DIM)
    rng = np.random.default_rng(0)
    mem.offer(torch.zeros(DIM), 0, logits=torch.tensor([1.0, 2.0]), loss=1, uncertainty=0,
              rng=rng)
    mem.grow_logits(4)
    mem.offer(torch.zeros(DIM), 3, logits=torch.arange(4.0), loss=1, uncertainty=0, rng=rng)
    mem.offer(torch.zeros(DIM), 4, logits=torch.arange(5.0), loss=1, uncertainty=0, rng=rng)
    logits, mask = mem.distill_targets(np.arange(3))
    assert logits.shape == mask.shape == (3, 5)
    assert mask.sum(1).tolist() == [2, 4, 5]
    assert logits[0].tolist() == [1, 2, 0, 0, 0]
    mem.update([0], logits=torch.ones(1, 5))
    assert mem.distill_targets([0])[1].all()


def test_reservoir_keeps_every_item_with_equal_probability():
    capacity, n_items, reps = 10, 100, 4000
    p = capacity / n_items
    rng = np.random.default_rng(1234)
    zs = torch.arange(n_items, dtype=torch.float32)[:, None].expand(-1, DIM).contiguous()
    empty = torch.zeros(0)
    counts = np.zeros(n_items)
    for _ in range(reps):
        mem = ReplayMemory(capacity, DIM, replacement="reservoir")
        for i in range(n_items):
            mem.offer(zs[i], 0, logits=empty, loss=1.0, uncertainty=0.0, rng=rng)
        counts[mem.z[:, 0].long().numpy()] += 1
    assert counts.sum() == reps * capacity
    assert binomial_ok(counts, reps, np.full(n_items, p))
    # aggregate: sum of squared standardized deviations has mean n_items (chi-square-like)
    stat = np.sum((counts - reps * p) ** 2 / (reps * p * (1 - p)))
    assert abs(stat - n_items) <= SIGMAS * np.sqrt(2 * n_items)


LABELS = [0, 0, 0, 0, 1, 1]
LOSSES = [0.5, 1.0, 2.0, 4.0, 0.25, 1.0]


def expected_victims(replacement: str) -> np.ndarray:
    """Victim probabilities (given that the new item is stored) on the LABELS/LOSSES memory."""
    y, loss = np.array(LABELS), np.array(LOSSES)
    counts = np.bincount(y)
    w = {
        "reservoir": np.ones(len(y)),
        "lawrrr": counts[y] / loss,
        "lawcbr": (y == counts.argmax()) / loss,
        "class_balanced_random": (y == counts.argmax()).astype(float),
    }[replacement]
    return w / w.sum()


@pytest.mark.parametrize("replacement", REPLACEMENTS)
def test_victim_frequencies_match_policy_weights(replacement):
    mem = ReplayMemory(len(LABELS), DIM, replacement=replacement)
    rng = np.random.default_rng(7)
    for i, (y, loss) in enumerate(zip(LABELS, LOSSES, strict=True)):
        mem.offer(torch.full((DIM,), float(i)), y, logits=torch.zeros(2), loss=loss,
                  uncertainty=0, rng=rng)
    full = mem.state()
    trials = 12000
    victims = np.zeros(len(LABELS))
    for _ in range(trials):
        mem.load(full)
        slot = mem.offer(torch.full((DIM,), -1.0), 2, logits=torch.zeros(3), loss=1.0,
                         uncertainty=0, rng=rng)
        if slot is not None:
            victims[slot] += 1
    stored = int(victims.sum())
    if replacement in ("reservoir", "lawrrr"):  # Vitter's condition: capacity / n_offered
        p_store = len(LABELS) / (len(LABELS) + 1)
        assert binomial_ok(np.array([stored]), trials, np.array([p_store]))
    else:
        assert stored == trials
    p = expected_victims(replacement)
    assert np.all(victims[p == 0] == 0)
    assert binomial_ok(victims, stored, p)


def test_zero_loss_is_evicted_first_by_loss_aware_policies():
    for replacement in ("lawrrr", "lawcbr"):
        mem = ReplayMemory(3, DIM, replacement=replacement)
        rng = np.random.default_rng(0)
        for y, loss in [(0, 1.0), (0, 0.0), (0, 2.0)]:
            mem.offer(torch.zeros(DIM), y, logits=torch.zeros(1), loss=loss, uncertainty=0,
                      rng=rng)
        slots = [mem.offer(torch.zeros(DIM), 0, logits=torch.zeros(1), loss=1.0, uncertainty=0,
                           rng=rng) for _ in range(20)]
        first = next(s for s in slots if s is not None)
        assert first == 1  # the zero-loss item goes at the first eviction


@pytest.mark.parametrize("replacement", ["lawcbr", "class_balanced_random"])
def test_class_balancing_policies_evict_from_the_largest_class(replacement):
    rng = np.random.default_rng(99)
    for _ in range(200):
        capacity = int(rng.integers(1, 30))
        n_classes = int(rng.integers(1, 5))
        mem = ReplayMemory(capacity, DIM, replacement=replacement)
        for _ in range(capacity + 20):
            before = mem.class_counts()
            was_full = mem.size == mem.capacity
            y = int(rng.integers(n_classes))
            loss = float(rng.choice([0.0, rng.exponential()]))
            slot = mem.offer(torch.zeros(DIM), y, logits=torch.zeros(n_classes), loss=loss,
                             uncertainty=0, rng=rng)
            after = Counter(before)
            after[y] += 1
            if was_full:
                largest = max(before.values())
                evicted = min(c for c, n in before.items() if n == largest)  # ties: lowest
                after[evicted] -= 1
                assert int(mem.y[slot]) == y
            assert mem.class_counts() == {c: n for c, n in after.items() if n}


def filled(scores_loss, scores_unc, capacity=None) -> ReplayMemory:
    mem = ReplayMemory(capacity or max(1, len(scores_loss)), DIM)
    rng = np.random.default_rng(0)
    for i, (loss, unc) in enumerate(zip(scores_loss, scores_unc, strict=True)):
        mem.offer(torch.full((DIM,), float(i)), i % 3, logits=torch.zeros(3), loss=loss,
                  uncertainty=unc, rng=rng)
    return mem


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    size=st.integers(0, 40),
    strategy=st.sampled_from(SELECTIONS),
    n=st.integers(0, 45),
)
def test_selection_picks_distinct_extreme_slots(data, size, strategy, n):
    score = st.integers(0, 5).map(float)  # few values: many ties
    loss = data.draw(st.lists(score, min_size=size, max_size=size))
    unc = data.draw(st.lists(score, min_size=size, max_size=size))
    mem = filled(loss, unc, capacity=size + data.draw(st.integers(0, 5)) or 1)
    slots = mem.select(n, strategy, np.random.default_rng(n))
    assert slots.dtype == np.int64 and len(slots) == min(n, size)
    assert len(set(slots.tolist())) == len(slots)
    assert np.all((slots >= 0) & (slots < size))
    if strategy == "uniform":
        return
    v = np.array(unc if strategy == "uapn" else loss)
    if size <= n:
        assert sorted(slots.tolist()) == list(range(size))
        return
    order = np.lexsort((np.arange(size), v))  # ascending (score, slot)
    assert sorted(slots[: n // 2].tolist()) == sorted(order[size - n // 2:].tolist())
    assert sorted(slots[n // 2:].tolist()) == sorted(order[: n - n // 2].tolist())
    again = mem.select(n, strategy, np.random.default_rng(n + 1))
    assert np.array_equal(slots, again)  # deterministic, no randomness used


@settings(max_examples=100, deadline=None)
@given(
    data=st.data(),
    size=st.integers(1, 40),
    strategy=st.sampled_from(["uapn", "lapn"]),
    n=st.integers(0, 20),
    candidates=st.integers(1, 45),
)
def test_selection_from_a_candidate_pool_takes_the_pools_extremes(data, size, strategy, n,
                                                                  candidates):
    """candidates > 0: the extremes of a pool of max(candidates, n) items drawn uniformly
    (the same draw sample_uniform makes); a pool as large as the memory is the memory."""
    score = st.integers(0, 5).map(float)
    loss = data.draw(st.lists(score, min_size=size, max_size=size))
    unc = data.draw(st.lists(score, min_size=size, max_size=size))
    mem = filled(loss, unc)
    slots = mem.select(n, strategy, np.random.default_rng(7), candidates)
    assert len(slots) == min(n, size) and len(set(slots.tolist())) == len(slots)
    if candidates >= size or n >= size:
        assert np.array_equal(slots, mem.select(n, strategy, np.random.default_rng(8)))
        return
    pool = np.sort(mem.sample_uniform(max(candidates, n), np.random.default_rng(7)))
    assert set(slots.tolist()) <= set(pool.tolist())
    v = np.array(unc if strategy == "uapn" else loss)[pool]
    order = pool[np.lexsort((pool, v))]  # the pool ascending by (score, slot)
    assert sorted(slots[: n // 2].tolist()) == sorted(order[len(pool) - n // 2:].tolist())
    assert sorted(slots[n // 2:].tolist()) == sorted(order[: n - n // 2].tolist())


def test_a_candidate_pool_spreads_the_replay_over_the_memory():
    """Whole-memory UAPN replays the same extremes at every step; a pool of 8 of 40 items
    gives every item a chance: each is replayed, none at every step."""
    size, n, reps = 40, 4, 2000
    mem = filled([0.0] * size, [float(i) for i in range(size)])
    rng = np.random.default_rng(3)
    whole, pooled = np.zeros(size), np.zeros(size)
    for _ in range(reps):
        whole[mem.select(n, "uapn", rng)] += 1
        pooled[mem.select(n, "uapn", rng, 8)] += 1
    assert np.count_nonzero(whole) == n and whole.max() == reps
    assert np.count_nonzero(pooled) == size and pooled.max() < reps / 2
    with pytest.raises(ValueError, match="candidates"):
        mem.select(n, "uapn", rng, -1)


@pytest.mark.parametrize("how", ["select", "sample_uniform"])
def test_uniform_selection_frequencies(how):
    size, n, reps = 20, 5, 4000
    mem = filled(list(range(size)), list(range(size)))
    rng = np.random.default_rng(5)
    counts = np.zeros(size)
    for _ in range(reps):
        slots = mem.select(n, "uniform", rng) if how == "select" else mem.sample_uniform(n, rng)
        assert len(set(slots.tolist())) == n
        counts[slots] += 1
    assert binomial_ok(counts, reps, np.full(size, n / size))


def only_plain(v) -> bool:
    if isinstance(v, dict):
        return all(isinstance(k, str) and only_plain(x) for k, x in v.items())
    if isinstance(v, list | tuple):
        return all(only_plain(x) for x in v)
    return isinstance(v, torch.Tensor | int | float | str | bool | type(None))


@pytest.mark.parametrize("replacement", REPLACEMENTS)
def test_state_round_trip_continues_identically(replacement):
    gen = np.random.default_rng(3)
    stream = [(int(gen.integers(5)), float(gen.choice([0.0, gen.exponential()])),
               float(gen.random()), bool(gen.random() < 0.1), 0) for _ in range(120)]
    mem = ReplayMemory(25, DIM, replacement=replacement)
    rng = np.random.default_rng(11)
    run_stream(mem, stream[:60], rng)
    state = mem.state()
    assert only_plain(state)
    assert all(len(state[k]) == mem.size for k in ("z", "y", "logits", "loss"))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    twin = ReplayMemory.from_state(torch.load(buf, weights_only=True))
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = rng.bit_generator.state

    def go(m: ReplayMemory, r: np.random.Generator) -> list:
        out = []
        for i, (y, loss, unc, *_) in enumerate(stream[60:]):
            z, h = item(60 + i, y, 8)
            out.append(m.offer(z, y, logits=h, loss=loss, uncertainty=unc, rng=r))
            for strategy in SELECTIONS:
                s = m.select(4, strategy, r)
                out.append(s.tolist())
                m.update(s, loss=torch.arange(len(s), dtype=torch.float32) + i)
            out.append(m.sample_uniform(3, r).tolist())
        return out

    assert go(mem, rng) == go(twin, rng2)
    a, b = mem.state(), twin.state()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k], k
    assert mem.class_counts() == twin.class_counts()


def test_nbytes_counts_the_preallocated_storage():
    mem = ReplayMemory(10, 4)
    base = mem.nbytes()
    assert base >= 10 * 4 * 4
    mem.grow_logits(3)  # the logit columns are allocated by capacity doubling
    assert mem.width == 3 and mem.logits.shape == (10, 3)
    assert mem.nbytes() == base + 10 * mem._logits.shape[1] * 4 >= base + 10 * 3 * 4


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="capacity"):
        ReplayMemory(0, 3)
    with pytest.raises(ValueError, match="reservoir, lawrrr, lawcbr, class_balanced_random"):
        ReplayMemory(5, 3, replacement="fifo")
    mem = ReplayMemory(5, 3)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="width"):
        mem.offer(torch.zeros(4), 0, logits=torch.zeros(1), loss=1, uncertainty=0, rng=rng)
    with pytest.raises(ValueError, match=">= 0"):
        mem.offer(torch.zeros(3), -1, logits=torch.zeros(1), loss=1, uncertainty=0, rng=rng)
    with pytest.raises(ValueError, match="loss"):
        mem.offer(torch.zeros(3), 0, logits=torch.zeros(1), loss=float("nan"), uncertainty=0,
                  rng=rng)
    assert mem.size == 0 and mem.n_offered == 0  # rejected items leave no trace
    with pytest.raises(ValueError, match="uniform, uapn, lapn"):
        mem.select(2, "random", rng)
    mem.offer(torch.zeros(3), 0, logits=torch.zeros(1), loss=1, uncertainty=0, rng=rng)
    with pytest.raises(IndexError):
        mem.update([1], loss=torch.zeros(1))


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
def test_a_copied_memory_writes_its_own_storage(duplicate):
    """The bookkeeping writes through numpy views of the storage: a copy must write into its
    own tensors, and never into the original's."""
    rng = np.random.default_rng(0)
    mem = ReplayMemory(4, 3)
    mem.offer(np.ones(3), 1, logits=torch.zeros(2), loss=0.5, uncertainty=0.1, rng=rng)
    twin = duplicate(mem)
    twin.offer(np.full(3, 2.0), 2, logits=torch.ones(2), loss=0.7, uncertainty=0.2, rng=rng)
    twin.update([0], loss=torch.tensor([0.9]))  # same logit width: no storage is replaced
    assert twin.y[:2].tolist() == [1, 2] and twin.logits[1].tolist() == [1.0, 1.0]
    assert twin.loss[:2].tolist() == pytest.approx([0.9, 0.7])
    assert len(mem) == 1 and mem.y[:2].tolist() == [1, 0] and float(mem.loss[0]) == 0.5


@pytest.mark.parametrize("bad", [dict(loss=[0.5, float("nan")]), dict(loss=[0.5, -1.0]),
                                 dict(uncertainty=[float("nan"), 0.0]), dict(loss=[0.5])],
                         ids=["nan-loss", "negative-loss", "nan-uncertainty", "short-loss"])
def test_update_is_all_or_nothing(bad):
    """A refused score leaves the logits given in the same call unwritten too."""
    rng = np.random.default_rng(0)
    mem = ReplayMemory(4, 3)
    for i in range(3):
        mem.offer(np.full(3, float(i)), i, logits=torch.zeros(2), loss=0.1, uncertainty=0.2,
                  rng=rng)
    before = {k: v.clone() for k, v in mem.state().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="loss|uncertainty"):
        mem.update([0, 2], logits=torch.ones(2, 3), **{k: torch.tensor(v) for k, v in
                                                       bad.items()})
    after = mem.state()
    assert mem.width == 2
    for name, t in before.items():
        assert torch.equal(after[name], t), name


def test_batch_into_out_equals_the_gather():
    rng = np.random.default_rng(0)
    mem = ReplayMemory(6, 3)
    for i in range(6):
        mem.offer(np.array([i, 2 * i, -i], dtype=np.float32), i % 3, logits=torch.zeros(3),
                  loss=0.1, uncertainty=0.2, rng=rng)
    slots = np.array([4, 0, 4, 2])
    out = torch.full((6, 3), -7.0)
    Z, y = mem.batch(slots, out=out[2:])
    assert torch.equal(out[2:], mem.z[torch.from_numpy(slots)]) and torch.equal(out[:2],
                                                                               torch.full((2, 3), -7.0))
    assert Z.data_ptr() == out[2:].data_ptr() and y.tolist() == [1, 0, 1, 2]
    Z2, _ = mem.batch(slots)
    assert torch.equal(Z2, out[2:])


@pytest.mark.parametrize("replacement", REPLACEMENTS)
def test_rollback_after_updates_and_overwrites_of_the_same_rows(replacement):
    """A call that rescores rows (``update`` journals their logits and scores only) and then
    overwrites some of them and others (``offer`` journals the features too), with the logits
    widened, is put back exactly by ``rollback``: every field and the class counts."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        mem = ReplayMemory(8, DIM, replacement=replacement)
        for i in range(8):
            mem.offer(rng.normal(size=DIM).astype(np.float32), i % 3,
                      logits=rng.normal(size=3).astype(np.float32), loss=float(rng.random()),
                      uncertainty=float(rng.random()), rng=rng)
        before = mem.state()
        counts = mem.class_counts()
        token = mem.begin()
        slots = rng.integers(0, mem.size, 5)  # repeats: one row journalled once
        mem.update(slots, logits=torch.randn(5, 4), loss=torch.rand(5), uncertainty=torch.rand(5))
        for _ in range(6):
            mem.offer(rng.normal(size=DIM).astype(np.float32), int(rng.integers(0, 5)),
                      logits=rng.normal(size=5).astype(np.float32), loss=float(rng.random()),
                      uncertainty=float(rng.random()), rng=rng)
        mem.rollback(token)
        after = mem.state()
        for name, value in before.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(after[name], value), (seed, name)
            else:
                assert after[name] == value, (seed, name)
        assert mem.class_counts() == counts
