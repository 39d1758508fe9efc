"""Object-instance streams from real images (data/instances.py): clusters as instances,
nearest-neighbour walks as videos, the dataset's own test split."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ciosl.data import datasets as ds
from ciosl.data.instances import make_instance_dataset, nearest_neighbour_walk, split_class
from ciosl.data.orderings import ORDERINGS, make_ordering

REAL_FASHION = Path("/usr/share/datasets/fashion-mnist")


def test_walk_follows_a_line_from_its_end():
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 10, 30))
    perm = rng.permutation(30)
    pts = np.stack([t, 0.01 * t], 1)[perm]  # shuffled points on a line
    order = nearest_neighbour_walk(pts, start=int(np.argmin(pts[:, 0])))
    assert np.array_equal(pts[order, 0], t)  # left to right
    assert sorted(order.tolist()) == list(range(30))


def test_split_class_finds_separated_groups_and_keeps_their_cores():
    rng = np.random.default_rng(1)
    centres = rng.normal(0, 10, (3, 40))
    groups = np.repeat(np.arange(3), [50, 70, 90])
    x = centres[groups] + rng.normal(0, 1, (210, 40))
    parts = split_class(x, 3, 30, seed=0)
    assert [len(p) for p in parts] == [30, 30, 30]
    for p in parts:
        assert len(set(groups[p])) == 1  # an instance is one group
        core = np.linalg.norm(x[p] - x[groups == groups[p[0]]].mean(0), axis=1)
        rest = np.setdiff1d(np.flatnonzero(groups == groups[p[0]]), p)
        far = np.linalg.norm(x[rest] - x[groups == groups[p[0]]].mean(0), axis=1)
        assert np.median(core) < np.median(far)  # the core is nearer the centre
    assert len({int(i) for p in parts for i in p}) == 90
    all_parts = split_class(x, 3, None, seed=0)
    assert sorted(len(p) for p in all_parts) == [50, 70, 90]


@pytest.fixture(scope="module")
def digits_instances():
    return ds.load_dataset("digits-instances")


def test_digits_instances_are_real_digits_with_the_real_test_split(digits_instances):
    raw, src = digits_instances, ds.load_digits()
    idx = raw.meta["source_indices"]
    assert len(set(idx.tolist())) == len(idx)  # no image twice
    assert np.array_equal(raw.train_x.images, src.train_x.images[idx])
    assert np.array_equal(raw.train_y, src.train_y[idx])
    assert np.array_equal(raw.test_y, src.test_y)
    assert np.array_equal(raw.test_x.images, src.test_x.images)
    assert np.array_equal(raw.train_instance // 3, raw.train_y)  # 3 instances per class
    assert len(np.unique(raw.train_instance)) == 30
    counts = np.bincount(raw.train_instance)
    assert counts.max() == 40 and counts.min() >= 10
    for i in range(30):  # frames 0..n-1 in stored order
        assert np.array_equal(raw.train_frame[raw.train_instance == i], np.arange(counts[i]))
    again = ds.load_dataset("digits-instances")
    assert again.fingerprint == raw.fingerprint  # deterministic


def test_consecutive_frames_resemble_each_other(digits_instances):
    """Temporal correlation, the point of the instance orderings: a frame is nearer its
    successor than to a random frame of the same instance, and than to a random frame of another
    instance of its class."""
    raw = digits_instances
    x = raw.train_x.images.reshape(len(raw.train_y), -1).astype(float)
    rng = np.random.default_rng(0)
    step, same, other = [], [], []
    for i in range(30):
        f = np.flatnonzero(raw.train_instance == i)
        step += list(np.linalg.norm(np.diff(x[f], axis=0), axis=1))
        same += list(np.linalg.norm(x[f] - x[rng.permutation(f)], axis=1))
        o = np.flatnonzero((raw.train_y == raw.train_y[f[0]]) & (raw.train_instance != i))
        other += list(np.linalg.norm(x[f] - x[rng.choice(o, len(f))], axis=1))
    assert np.mean(step) < 0.8 * np.mean(same) < 0.8 * np.mean(other)


def test_every_ordering_works_on_the_instance_stream(digits_instances):
    raw, spec = digits_instances, ds.get_spec("digits-instances")
    assert set(spec.orderings) == set(ORDERINGS)
    for kind in ORDERINGS:
        o = make_ordering(kind, raw.train_y, seed=0, base_fraction=spec.base_fraction,
                          classes_per_step=spec.classes_per_step,
                          instances=raw.train_instance, frames=raw.train_frame)
        order = np.concatenate([o.base, o.stream])
        assert sorted(order.tolist()) == list(range(len(raw.train_y)))
        if kind in ("instance", "class_instance"):  # inside an instance, frames in order
            s = o.stream
            same = raw.train_instance[s[1:]] == raw.train_instance[s[:-1]]
            assert np.all(np.diff(raw.train_frame[s])[same] > 0)


# CI installs dataset-fashion-mnist (make data), so there this test never skips.
@pytest.mark.skipif(not REAL_FASHION.is_dir() and not os.environ.get("CI"),
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_instances_is_sized_like_icubworld():
    raw = ds.load_dataset("fashion-mnist-instances")
    assert len(raw.train_y) == 6000 and len(raw.test_y) == 10000
    assert np.array_equal(np.bincount(raw.train_instance), np.full(30, 200))
    assert np.array_equal(np.bincount(raw.train_y), np.full(10, 600))
    src = ds.load_fashion_mnist()
    assert np.array_equal(raw.train_x.images, src.train_x.images[raw.meta["source_indices"]])
    assert make_instance_dataset("x", src).fingerprint != make_instance_dataset(
        "x", src, seed=1).fingerprint
