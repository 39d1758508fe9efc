"""Property tests of the four orderings (pure functions of labels, instances, frames, seed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ciosl.cli import main
from ciosl.data.orderings import ORDERINGS, limit_per_class, make_ordering


@st.composite
def temporal_data(draw):
    """Random labelled data with object instances and (shuffled) frame indices."""
    n_classes = draw(st.integers(2, 6))
    per_class_inst = draw(st.integers(1, 3))
    labels, inst, frames = [], [], []
    for c in range(n_classes):
        for j in range(per_class_inst):
            n = draw(st.integers(1, 120))
            labels += [c] * n
            inst += [c * per_class_inst + j] * n
            frames += list(range(n))
    perm = np.random.default_rng(draw(st.integers(0, 99))).permutation(len(labels))
    return (np.asarray(labels)[perm], np.asarray(inst)[perm], np.asarray(frames)[perm],
            draw(st.integers(1, 3)), draw(st.sampled_from([0.02, 0.1, 0.5])),
            draw(st.integers(0, 1000)))


def _make(kind, data):
    labels, inst, frames, cps, frac, seed = data
    if kind.startswith("class") and len(np.unique(labels)) <= cps:
        cps = 1
    return make_ordering(kind, labels, seed=seed, base_fraction=frac, classes_per_step=cps,
                         instances=inst, frames=frames)


@pytest.mark.parametrize("kind", ORDERINGS)
@settings(max_examples=40, deadline=None)
@given(data=temporal_data())
def test_every_sample_exactly_once(kind, data):
    o = _make(kind, data)
    everything = np.concatenate([o.base, o.stream])
    assert np.array_equal(np.sort(everything), np.arange(len(data[0])))
    assert len(o.base) > 0 and len(o.stream) > 0
    assert o.events[0] == 0 and o.events[-1] == len(o.stream)
    assert np.all(np.diff(o.events) > 0)


@pytest.mark.parametrize("kind", ["class_iid", "class_instance"])
@settings(max_examples=40, deadline=None)
@given(data=temporal_data())
def test_class_orderings_never_show_a_later_class_early(kind, data):
    labels = data[0]
    o = _make(kind, data)
    assert set(labels[o.base]) == set(o.event_classes[0])
    for t in range(1, len(o.events)):
        block = labels[o.stream[o.events[t - 1]:o.events[t]]]
        new = set(o.event_classes[t]) - set(o.event_classes[t - 1])
        assert set(block) == new  # exactly this step's classes, nothing from later steps
        # testing at event t uses the classes seen so far
        assert set(labels[o.seen(t)]) == set(o.event_classes[t])


@settings(max_examples=40, deadline=None)
@given(data=temporal_data())
def test_instance_ordering_keeps_temporal_order_and_round_robin_chunks(data):
    labels, inst, frames, *_ = data
    o = _make("instance", data)
    s_inst, s_frames = inst[o.stream], frames[o.stream]
    for i in np.unique(s_inst):
        assert np.all(np.diff(s_frames[s_inst == i]) > 0)
    # runs of one instance are at most 50 frames long (the paper's 50-frame chunks) unless a
    # single instance is all that is left
    change = np.flatnonzero(np.diff(s_inst) != 0) + 1
    runs = np.diff(np.concatenate([[0], change, [len(s_inst)]]))
    assert np.all(runs[:-1] <= 50)


@settings(max_examples=40, deadline=None)
@given(data=temporal_data())
def test_class_instance_is_class_after_class_instance_after_instance(data):
    labels, inst, frames, *_ = data
    o = _make("class_instance", data)
    s_lab, s_inst, s_frames = labels[o.stream], inst[o.stream], frames[o.stream]
    # each class and each instance appears as one contiguous block
    for arr in (s_lab, s_inst):
        blocks = arr[np.concatenate([[True], arr[1:] != arr[:-1]])]
        assert len(blocks) == len(np.unique(arr))
    for i in np.unique(s_inst):
        assert np.all(np.diff(s_frames[s_inst == i]) == 1)


def test_orderings_are_deterministic_and_seed_dependent():
    labels = np.repeat(np.arange(10), 30)
    a = make_ordering("class_iid", labels, seed=3, base_fraction=0.1, classes_per_step=2)
    b = make_ordering("class_iid", labels, seed=3, base_fraction=0.1, classes_per_step=2)
    c = make_ordering("class_iid", labels, seed=4, base_fraction=0.1, classes_per_step=2)
    assert np.array_equal(a.stream, b.stream) and a.class_order == b.class_order
    assert not np.array_equal(a.stream, c.stream)
    assert len(a.events) == 5  # base + 4 steps of 2 classes


def test_iid_uses_base_fraction_and_the_same_number_of_events():
    labels = np.repeat(np.arange(10), 100)
    o = make_ordering("iid", labels, seed=0, base_fraction=0.02, classes_per_step=2)
    assert len(o.base) == 20 and len(o.stream) == 980
    assert len(o.events) == 5 and o.event_classes is None
    assert np.allclose(np.diff(o.events), 245, atol=1)


def test_temporal_orderings_need_instances():
    labels = np.repeat(np.arange(4), 10)
    with pytest.raises(ValueError, match="instance"):
        make_ordering("instance", labels, seed=0, base_fraction=0.1, classes_per_step=2)
    with pytest.raises(ValueError, match="valid choices"):
        make_ordering("random", labels, seed=0, base_fraction=0.1, classes_per_step=2)


def test_limit_per_class_keeps_temporal_spread():
    labels = np.repeat([0, 1], 300)
    inst = np.repeat([0, 1, 2, 3], 150)
    frames = np.tile(np.arange(150), 4)
    keep = limit_per_class(labels, 30, instances=inst, frames=frames)
    assert np.bincount(labels[keep]).tolist() == [30, 30]
    assert set(inst[keep]) == {0, 1, 2, 3}  # every instance survives
    keep2 = limit_per_class(labels, 1000)
    assert len(keep2) == 600


def test_ordering_with_unknown_name_lists_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["run", "--method", "ncm", "--ordering", "shuffled"])
    assert "class_instance" in capsys.readouterr().err
