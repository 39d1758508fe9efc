"""TinyER's characteristic rule: a step on the new sample plus replay, a reservoir memory."""

from __future__ import annotations

import numpy as np
import torch

from ciosl.learners import make_learner
from helpers import class_blobs


def test_tinyer_steps_on_new_sample_plus_replay(monkeypatch):
    Z, y = class_blobs(30, seed=1)
    learner = make_learner("tinyer", buffer=40, n_replay=16, base_epochs=1)
    learner.fit_base(Z[:30], y[:30])
    seen = []
    monkeypatch.setattr(learner, "_step", lambda X, Y: seen.append((X.clone(), Y.clone())))
    learner.learn_one(Z[30], y[30])
    X, Y = seen[0]
    assert X.shape == (17, Z.shape[1]) and len(Y) == 17  # one joint batch: new + N1'
    assert torch.equal(X[0], torch.from_numpy(Z[30])) and learner.classes_[int(Y[0])] == y[30]
    rows = {tuple(r) for r in learner.memory.z[:len(learner.memory)].tolist()}
    assert all(tuple(r) in rows for r in X[1:].tolist())  # replayed rows come from memory
    assert len({tuple(r) for r in X[1:].tolist()}) == 16  # without replacement


def test_tinyer_memory_is_a_reservoir():
    B, N = 20, 400
    late = []
    for seed in range(5):
        Z, y = class_blobs(N // 4, seed=seed)
        Z[:, 0] = np.arange(N)  # identifies each sample
        learner = make_learner("tinyer", buffer=B, base_epochs=0, lr=1e-4, seed=seed)
        learner.fit_base(Z[:10], y[:10])
        for i in range(10, N):
            learner.learn_one(Z[i], y[i])
            assert learner.memory_size() == min(i + 1, B)
        assert learner.memory.n_offered == N
        ids = learner.memory.z[:, 0].numpy()
        assert len(np.unique(ids)) == B
        late.append(int(np.sum(ids >= N // 2)))
    # each sample is held with probability B / N: half the memory from the second half
    assert 35 <= sum(late) <= 65, late
