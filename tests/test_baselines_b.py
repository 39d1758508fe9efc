"""ExStream and REMIND: each method's characteristic rule, tested directly."""

from __future__ import annotations

import io

import faiss
import numpy as np
import pytest
import torch

from ciosl.learners import make_learner
from ciosl.learners.exstream import nearest_pair, pairwise


def mixture(n: int, d: int, seed: int, k: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(n, d) float32 Gaussian mixture features and (n,) int labels in [0, k)."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(7).normal(0.0, 3.0, (k, d))
    y = rng.integers(k, size=n)
    return (centers[y] + rng.normal(0.0, 1.0, (n, d))).astype(np.float32), y


# ---------------------------------------------------------------------------- ExStream
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


# ---------------------------------------------------------------------------- REMIND
D_FEAT = 40  # not a multiple of 32: padded to 64, two dimensions per sub-vector


def recon_error(learner, Z: np.ndarray) -> float:
    return float(np.mean((learner.reconstruct(Z) - Z) ** 2))


@pytest.fixture(scope="module")
def remind():
    Z, y = mixture(600, D_FEAT, seed=3)
    return make_learner("remind", buffer=50, base_epochs=2).fit_base(Z, y)


def test_remind_codes_equal_faiss_own(remind):
    Z, _ = mixture(50, D_FEAT, seed=4)
    assert remind.pad_dim_ == 64 and remind.nbits_ == 8
    padded = np.zeros((len(Z), 64), dtype=np.float32)
    padded[:, :D_FEAT] = Z
    codes = remind.pq.compute_codes(padded)
    np.testing.assert_array_equal(remind.encode(Z), codes)
    np.testing.assert_array_equal(remind.reconstruct(Z), remind.pq.decode(codes)[:, :D_FEAT])
    err = np.mean((remind.pq.decode(codes)[:, :D_FEAT] - Z) ** 2)
    assert recon_error(remind, Z) == pytest.approx(err)


def test_remind_reconstruction_error_falls_as_codebook_trains():
    Z, y = mixture(600, D_FEAT, seed=3)
    Zt, _ = mixture(300, D_FEAT, seed=5)
    errors = []
    for n_base in (40, 100, 300, 600):  # 5, 6, 8, 8 bits: more points, finer codebooks
        learner = make_learner("remind", base_epochs=0).fit_base(Z[:n_base], y[:n_base])
        errors.append(recon_error(learner, Zt))
        # the same codebook shape before k-means (random init) is much worse
        cb = faiss.vector_to_array(learner.pq.centroids)
        rand = np.random.default_rng(0).normal(0.0, Z.std(), cb.shape).astype(np.float32)
        faiss.copy_array_to_vector(rand, learner.pq.centroids)
        assert recon_error(learner, Zt) > 2 * errors[-1]
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[-2]


def test_remind_small_base_lowers_nbits():
    Z, y = mixture(40, D_FEAT, seed=6)
    learner = make_learner("remind", base_epochs=0).fit_base(Z, y)
    assert learner.nbits_ == 5 and learner.get_params()["pq_nbits"] == 8
    assert learner.code_size_ == 20  # 32 sub-vectors * 5 bits
    one = make_learner("remind", base_epochs=0).fit_base(Z[:1], y[:1])
    assert one.nbits_ == 1


def test_remind_memory_holds_uint8_codes(remind):
    assert remind.codes.dtype == torch.uint8 and remind.codes.shape == (50, 32)
    assert remind.memory_size() == 50
    assert remind.compression_ratio() == pytest.approx(4 * D_FEAT / 32)
    assert remind.state_dict()["state"]["codes"].nbytes == 50 * 32


def test_remind_state_round_trip_rebuilds_identical_quantizer(remind):
    buf = io.BytesIO()
    torch.save(remind.state_dict(), buf)
    buf.seek(0)
    twin = remind.clone().load_state_dict(torch.load(buf, weights_only=True))
    np.testing.assert_array_equal(faiss.vector_to_array(twin.pq.centroids),
                                  faiss.vector_to_array(remind.pq.centroids))
    Z, _ = mixture(100, D_FEAT, seed=7)
    np.testing.assert_array_equal(twin.encode(Z), remind.encode(Z))
    np.testing.assert_array_equal(twin.codes[:50], remind.codes[:50])


def test_remind_predicts_on_reconstructions(remind):
    Z, _ = mixture(30, D_FEAT, seed=8)
    R = remind.reconstruct(Z)
    np.testing.assert_array_equal(remind.predict_proba(Z), remind.predict_proba(R))
    np.testing.assert_allclose(remind.predict_proba(Z),
                               remind.net.predict_proba(np.ascontiguousarray(R)), atol=1e-7)


def test_remind_class_balanced_eviction():
    Z, y = mixture(200, 8, seed=9)
    learner = make_learner("remind", buffer=21, n_replay=4, base_epochs=0)
    learner.fit_base(Z[y < 2][:40], y[y < 2][:40])
    new = Z[y == 3][:30]
    for z in new:
        learner.learn_one(z, 3)
    counts = np.bincount(learner.labels.numpy(), minlength=3)
    # the victim comes from the largest class before the new item enters: [6, 7, 8]
    assert counts.tolist() == [6, 7, 8]


def test_remind_needs_fit_base():
    learner = make_learner("remind")
    with pytest.raises(RuntimeError, match="fit_base"):
        learner.learn_one(np.zeros(4, dtype=np.float32), 0)
    assert learner.classes_ == [] and learner.n_seen_ == 0
