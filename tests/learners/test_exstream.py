"""ExStream's characteristic rule, tested directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ciosl.learners import make_learner
from ciosl.learners.exstream import nearest_pair, pairwise
from helpers import mixture


def reference_insert(protos: list, x: np.ndarray, cap: int) -> None:
    """The ExStream rule in float64 on a list of [vector, count] (cap >= 2)."""
    if len(protos) < cap:
        protos.append([x.astype(np.float64), 1])
        return
    P = np.stack([p for p, _ in protos])
    D = np.linalg.norm(P[:, None] - P[None], axis=2) + np.diag(np.full(len(P), np.inf))
    i, j = sorted(np.unravel_index(np.argmin(D), D.shape))
    (pi, ci), (pj, cj) = protos[i], protos[j]
    protos[i] = [(ci * pi + cj * pj) / (ci + cj), ci + cj]
    protos[j] = [x.astype(np.float64), 1]


def test_nearest_pair_is_the_closest():
    P = torch.tensor([[0.0, 0.0], [10.0, 0.0], [4.0, 4.0], [10.5, 0.2], [-6.0, 1.0]])
    assert nearest_pair(pairwise(P)) == (1, 3)


def test_exstream_merges_nearest_pair_into_count_weighted_mean():
    Z, _ = mixture(60, 6, seed=0)
    learner = make_learner("exstream", buffer=5, n_replay=4, base_epochs=0)
    learner.fit_base(Z[:1], ["a"])  # one class: capacity 5
    ref = [[Z[0].astype(np.float64), 1]]
    for z in Z[1:]:
        learner.learn_one(z, "a")
        reference_insert(ref, z, cap=5)
        np.testing.assert_allclose(learner.protos[0].numpy(), np.stack([p for p, _ in ref]),
                                   rtol=1e-4, atol=1e-4)
        assert learner.counts[0].tolist() == [c for _, c in ref]
        if learner._dist[0] is not None:  # the incremental cache equals a fresh computation
            assert torch.equal(learner._dist[0], pairwise(learner.protos[0]))
    assert learner._dist[0] is not None and int(learner.counts[0].sum()) == len(Z)


def test_exstream_single_merge_by_hand():
    learner = make_learner("exstream", buffer=3, n_replay=2, base_epochs=0)
    Zb = np.array([[0.0, 0.0], [1.0, 0.0], [9.0, 9.0]], dtype=np.float32)
    learner.fit_base(Zb, [0, 0, 0])
    learner.counts[0][:] = torch.tensor([3, 1, 2])  # as if slots 0 and 2 summarised more
    learner.learn_one(np.array([5.0, -5.0], dtype=np.float32), 0)
    # the nearest pair is (0, 1): slot 0 = (3 * [0, 0] + 1 * [1, 0]) / 4, slot 1 = the new one
    np.testing.assert_allclose(learner.protos[0].numpy(), [[0.25, 0.0], [5.0, -5.0], [9.0, 9.0]])
    assert learner.counts[0].tolist() == [4, 1, 2]


@pytest.mark.parametrize("buffer", [2, 4, 7, 12])
def test_exstream_rebalancing_keeps_counts_and_capacity(buffer):
    Z, y = mixture(120, 5, seed=1, k=4)
    order = np.argsort(y, kind="stable")  # classes arrive one after another
    Z, y = Z[order], y[order]
    base = y < 1
    learner = make_learner("exstream", buffer=buffer, n_replay=2, base_epochs=1)
    learner.fit_base(Z[base], y[base])
    for z, c in zip(Z[~base], y[~base], strict=True):
        learner.learn_one(z, c)
        n_cls = len(learner.classes_)
        assert learner.memory_size() <= buffer
        assert all(len(P) <= buffer // n_cls for P in learner.protos)
    if buffer < len(learner.classes_):  # capacity 0: classes keep nothing (documented)
        assert learner.memory_size() == 0
        return
    for k, lab in enumerate(learner.classes_):
        Zk = Z[y == lab].astype(np.float64)
        n, P = learner.counts[k], learner.protos[k].double()
        assert int(n.sum()) == len(Zk)
        if learner._dist[k] is not None:  # the incremental cache equals a fresh computation
            assert torch.equal(learner._dist[k], pairwise(learner.protos[k]))  # every sample of the class is summarised once
        # count-weighted means preserve the class's sum, whatever was merged
        np.testing.assert_allclose((n[:, None] * P).sum(0).numpy(), Zk.sum(0), rtol=1e-4,
                                   atol=1e-3)


def test_exstream_replay_draws_stored_prototypes():
    Z, y = mixture(80, 4, seed=2)
    learner = make_learner("exstream", buffer=12, n_replay=5, base_epochs=1).fit_base(Z, y)
    X, Y = learner._replay()
    assert X.shape == (5, 4) and Y.shape == (5,)
    for x, c in zip(X, Y.tolist(), strict=True):
        assert (learner.protos[c] == x).all(1).any()
