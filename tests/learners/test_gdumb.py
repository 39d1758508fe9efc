"""GDumb's characteristic rule: a class-balanced memory, retraining from scratch."""

from __future__ import annotations

import numpy as np
import torch

from ciosl.learners import gdumb, make_learner
from ciosl.learners.head import train_offline
from helpers import class_blobs


def test_gdumb_memory_stays_class_balanced():
    B = 20
    learner = make_learner("gdumb", buffer=B, retrain_epochs=1)
    Z, y = class_blobs(30, n_classes=6, seed=3, shuffle=False)  # class after class
    learner.fit_base(Z[:60], y[:60])  # classes 0 and 1
    for k in range(2, 6):
        for i in np.flatnonzero(y == k):
            learner.learn_one(Z[i], y[i])
            assert learner.memory_size() <= B
        counts = learner.memory.class_counts()
        assert learner.memory_size() == B and len(counts) == k + 1
        assert max(counts.values()) - min(counts.values()) <= 1, counts
    # an iid stream too
    learner = make_learner("gdumb", buffer=B, retrain_epochs=1, seed=1)
    Z, y = class_blobs(50, n_classes=3, seed=4)
    learner.fit_base(Z[:5], y[:5])
    for z, k in zip(Z[5:], y[5:], strict=True):
        learner.learn_one(z, k)
    counts = learner.memory.class_counts()
    assert sorted(counts.values()) == [6, 7, 7]


def test_gdumb_retrains_from_scratch_only_when_memory_changes(monkeypatch):
    calls = []

    def counting(*args, **kw):
        calls.append(kw["seed"])
        return train_offline(*args, **kw)

    monkeypatch.setattr(gdumb, "train_offline", counting)
    Z, y = class_blobs(10, n_classes=2, seed=5)
    learner = make_learner("gdumb", buffer=10, retrain_epochs=3)
    learner.fit_base(Z[:10], y[:10])  # fills the memory; classes 5/5 (or so)
    with torch.no_grad():  # as the runner predicts: the retraining still has gradients
        P = learner.predict_proba(Z)
    assert len(calls) == 1
    np.testing.assert_array_equal(learner.predict_proba(Z), P)  # cached
    assert len(calls) == 1
    # from scratch: exactly a fresh train_offline on the memory
    Zm, ym = learner.memory.batch(np.arange(10))
    fresh = train_offline(Zm.numpy(), ym.numpy(), 2, epochs=3, batch_size=16, seed=calls[0])
    np.testing.assert_allclose(P, fresh.predict_proba(Z), rtol=1e-6)
    counts = learner.memory.class_counts()
    full = max(counts, key=counts.get)  # a class at (or above) its share: dropped, no change
    i = int(np.flatnonzero(y[10:] == full)[0]) + 10
    version = learner.version
    learner.learn_one(Z[i], y[i])
    assert counts[full] >= 5 and learner.version == version
    learner.predict_proba(Z)
    assert len(calls) == 1
    learner.learn_one(Z[0] + 100.0, 99)  # a new class (99) is always stored
    assert learner.version > version
    assert learner.predict_proba(Z).shape == (len(Z), 3)
    assert len(calls) == 2
