"""REMIND's characteristic rule, tested directly."""

from __future__ import annotations

import io

import faiss
import numpy as np
import pytest
import torch

from ciosl.learners import make_learner
from helpers import mixture

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
