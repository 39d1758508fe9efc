"""rp_lda (random ReLU projection + streaming LDA) against batch estimates computed here."""

import numpy as np
import pytest
import torch
from scipy.special import softmax
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from ciosl.learners import make_learner, rplda
from ciosl.learners.base import Learner


def blobs(n_per_class, dim=20, n_classes=5, spread=0.6, offset=0.0, seed=0, test=False):
    """Overlapping Gaussian classes, balanced and shuffled: Z (n, d) float32, y (n,)."""
    centers = np.random.default_rng(seed).normal(0.0, spread, (n_classes, dim)) + offset
    rng = np.random.default_rng([seed, test])
    y = rng.permutation(np.repeat(np.arange(n_classes), n_per_class))
    return (centers[y] + rng.normal(size=(len(y), dim))).astype(np.float32), y


def stream(learner, Z, y):
    for z, label in zip(Z, y, strict=True):
        learner.learn_one(z, label)
    return learner


def batch_stats(learner, Z, y):
    """numpy class means (K, D) of h in the learner's class order and pooled covariance (D, D)."""
    H = learner.transform(Z)
    mu = np.stack([H[y == c].mean(0) for c in learner.classes_])
    X = H - mu[[learner.classes_.index(c) for c in y]]
    return mu, X.T @ X / len(H)


def rel(a, b):
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    return np.abs(a - b).max() / np.abs(b).max()


# all 150 samples waiting, p < D (the Woodbury solve); 2 blocks committed + 88 waiting. With
# p < D a small eps makes the null space of Sigma decide with near-certain probabilities.
@pytest.mark.parametrize("n_per_class, D, eps", [(30, 256, 0.3), (120, 64, 1e-3)])
def test_streaming_equals_batch_lda(n_per_class, D, eps):
    Z, y = blobs(n_per_class, seed=1)
    Zt, _ = blobs(100, seed=1, test=True)
    learner = stream(make_learner("rp_lda", proj_dim=D, shrinkage=eps, shrinkage_estimator="fixed"), Z, y)
    assert learner.n_committed == len(y) // 256 * 256
    mu, cov = batch_stats(learner, Z, y)
    assert rel(learner.means, mu) < 1e-10 and rel(learner.covariance, cov) < 1e-10
    Lam = np.linalg.inv((1 - eps) * cov + eps * np.eye(D))
    Ht = learner.transform(Zt)
    scores = Ht @ (mu @ Lam).T - 0.5 * np.einsum("kd,de,ke->k", mu, Lam, mu)
    P = learner.predict_proba(Zt)
    np.testing.assert_allclose(P, softmax(scores, axis=1), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(learner.predict(Zt), np.asarray(learner.classes_)[scores.argmax(1)])
    assert 0.05 < np.mean(P.max(1) < 0.99)  # overlapping classes: the check is not trivial
    if n_per_class * 5 > D:  # sklearn (its shrinkage target trace(cov)/D I, not I) on h
        sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=eps, priors=np.full(5, 0.2))
        sk.fit(learner.transform(Z), y)
        assert np.mean(sk.predict(Ht) == learner.predict(Zt)) >= 0.97


def test_centred_statistics_exact_far_from_the_origin():
    """h with a common offset ~500x the within-class spread: M2 - sum n mu mu^T would lose ~5
    of its 16 digits to cancellation (6e-11 here without the shift c); with c, 2e-15."""
    Z, y = blobs(120, offset=2.0, seed=2)  # h ~ 50 +- 1 along the offset direction
    Z = (Z - Z.mean(0)) + 500.0 * np.ones(20, np.float32) / np.sqrt(20)
    learner = stream(make_learner("rp_lda", proj_dim=128), Z, y)
    mu, cov = batch_stats(learner, Z, y)
    assert rel(learner.covariance, cov) < 1e-12 and rel(learner.means, mu) < 1e-12


def test_exact_at_the_default_width_on_standardised_features():
    Z, y = blobs(70, dim=64, spread=1.0, seed=3)  # 350 samples: one block + 94 waiting
    Z = (Z - Z.mean(0)) / Z.std(0)
    learner = stream(make_learner("rp_lda"), Z, y)
    assert learner.proj_dim == 4096 and learner.n_committed == 256
    mu, cov = batch_stats(learner, Z, y)
    assert rel(learner.means, mu) < 1e-12 and rel(learner.covariance, cov) < 1e-12


@pytest.mark.parametrize("n_per_class, D, eps", [(120, 64, 1e-4), (20, 256, 0.3)])  # Woodbury
def test_block_buffering_equals_rank_one_updates(n_per_class, D, eps):
    Z, y = blobs(n_per_class, seed=4)
    Zt, _ = blobs(50, seed=4, test=True)
    blocked = stream(make_learner("rp_lda", proj_dim=D, shrinkage=eps, shrinkage_estimator="fixed"), Z, y)
    single = make_learner("rp_lda", proj_dim=D, shrinkage=eps, shrinkage_estimator="fixed")
    single.block = 1  # every sample committed at once: a rank-1 update, the D x D solve
    stream(single, Z, y)
    assert single.n_pending == 0 and single.n_committed == len(y)
    assert rel(blocked.covariance, single.covariance.numpy()) < 1e-12
    P = blocked.predict_proba(Zt)
    np.testing.assert_allclose(P, single.predict_proba(Zt), rtol=0, atol=1e-10)
    assert np.mean(P.max(1) < 0.99) > 0.05


def test_fit_base_then_stream_equals_stream():
    Z, y = blobs(100, seed=5)
    streamed = stream(make_learner("rp_lda", proj_dim=64), Z, y)
    based = stream(make_learner("rp_lda", proj_dim=64).fit_base(Z[:300], y[:300]), Z[300:],
                   y[300:])
    halves = make_learner("rp_lda", proj_dim=64).fit_base(Z[:150], y[:150]).fit_base(Z[150:],
                                                                                    y[150:])
    many = make_learner("rp_lda", proj_dim=64)
    many.learn_many(Z[:137], y[:137])
    many.learn_many(Z[137:], y[137:])
    for learner in (based, halves, many):
        assert learner.classes_ == streamed.classes_ and learner.n_seen_ == len(y)
        assert torch.equal(learner.counts, streamed.counts)
        assert rel(learner.means, streamed.means.numpy()) < 1e-12
        assert rel(learner.covariance, streamed.covariance.numpy()) < 1e-12
        np.testing.assert_allclose(learner.predict_proba(Z), streamed.predict_proba(Z),
                                   rtol=0, atol=1e-10)


def test_projection_is_drawn_from_the_seed():
    Z, y = blobs(10, seed=6)
    a, b, c = (make_learner("rp_lda", proj_dim=256, seed=s).fit_base(Z, y) for s in (3, 3, 4))
    np.testing.assert_array_equal(a.transform(Z), b.transform(Z))
    np.testing.assert_array_equal(a.predict_proba(Z), b.predict_proba(Z))
    assert not np.allclose(a.transform(Z), c.transform(Z), rtol=0.1)
    assert abs(a.proj.std().item() * np.sqrt(20) - 1) < 0.05  # entries N(0, 1/d)


def rings(n, seed):
    """Three concentric noisy rings in 2-d (radii 1, 2, 3): no linear rule separates them."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    angle = rng.uniform(0, 2 * np.pi, n)
    r = (y + 1) + rng.normal(0, 0.15, n)
    return np.stack([r * np.cos(angle), r * np.sin(angle)], 1).astype(np.float32), y


def test_random_features_beat_linear_lda_on_rings():
    Z, y = rings(900, seed=7)
    Zt, yt = rings(600, seed=8)
    slda = stream(make_learner("slda"), Z, y).score(Zt, yt)
    rp = stream(make_learner("rp_lda", proj_dim=512), Z, y).score(Zt, yt)
    assert slda < 0.6 and rp > 0.9, (slda, rp)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, 65537, 10**9, "64", None, np.float64(64)])
def test_bad_proj_dim_is_refused(bad):
    with pytest.raises(ValueError, match="proj_dim"):
        make_learner("rp_lda", proj_dim=bad)


def test_good_proj_dim_bounds_are_accepted():
    for D in (1, 65536):
        assert make_learner("rp_lda", proj_dim=D).proj_dim == D
    # a NumPy integer is taken as the Python int it is (issue 29: settings are made plain)
    assert type(make_learner("rp_lda", proj_dim=np.int64(64)).proj_dim) is int
    Z, y = blobs(5, seed=9)
    assert make_learner("rp_lda", proj_dim=1).fit_base(Z, y).predict_proba(Z).shape == (25, 5)


def test_state_round_trip_with_committed_and_waiting_samples(tmp_path):
    Z, y = blobs(100, seed=10)
    Zt, _ = blobs(20, seed=10, test=True)
    learner = stream(make_learner("rp_lda", proj_dim=64), Z[:300], y[:300])
    assert learner.n_committed == 256 and learner.n_pending == 44
    sd = learner.state_dict()
    loaded = Learner.load(learner.save(tmp_path / "rp.ciosl"))
    assert learner.n_pending == 44  # saving commits nothing: blocks depend on samples only
    restored = learner.clone().load_state_dict(sd)
    for twin in (loaded, restored):
        np.testing.assert_array_equal(twin.predict_proba(Zt), learner.predict_proba(Zt))
    for twin in (learner, loaded, restored):
        stream(twin, Z[300:], y[300:])
    for twin in (loaded, restored):
        assert torch.equal(twin.m2, learner.m2) and torch.equal(twin.sums, learner.sums)
        np.testing.assert_array_equal(twin.predict_proba(Zt), learner.predict_proba(Zt))
    sd["state"]["proj_probe"] = sd["state"]["proj_probe"] + 1.0  # a projection drawn otherwise
    P = restored.predict_proba(Zt)
    with pytest.raises(ValueError, match="projection"):
        restored.load_state_dict(sd)
    np.testing.assert_array_equal(restored.predict_proba(Zt), P)  # unchanged


def test_weights_cached_until_the_statistics_change(monkeypatch):
    Z, y = blobs(40, seed=11)
    learner = make_learner("rp_lda", proj_dim=64).fit_base(Z[:150], y[:150])
    P = learner.predict_proba(Z)
    answer = learner._answer
    monkeypatch.setattr(rplda, "PREDICT_CHUNK", 7)  # the chunked projection gives the same
    np.testing.assert_allclose(learner.predict_proba(Z), P, rtol=0, atol=1e-12)
    assert learner._answer is answer
    learner.learn_one(Z[150], y[150])  # a prediction preceded it: it brings the answer current
    assert learner._answer is not answer and learner._answer.at[1] == learner.n_pending
    answer = learner._answer
    learner.learn_one(Z[151], y[151])
    assert learner._answer is answer  # no prediction since: the learn leaves the kept answer
    learner.predict_proba(Z[:3])
    assert learner._answer is not answer and learner._answer.at[1] == learner.n_pending


@pytest.mark.parametrize("n_per_class, D", [(20, 256), (120, 64)])  # Sigma singular; full rank
def test_no_shrinkage_uses_the_pseudo_inverse(n_per_class, D):
    Z, y = blobs(n_per_class, seed=12)
    Zt, _ = blobs(50, seed=12, test=True)
    learner = stream(make_learner("rp_lda", proj_dim=D, shrinkage=0.0, shrinkage_estimator="fixed"), Z, y)
    mu, cov = batch_stats(learner, Z, y)
    Lam = np.linalg.pinv(cov, hermitian=True, rtol=D * np.finfo(float).eps)
    Ht = learner.transform(Zt)
    scores = Ht @ (mu @ Lam).T - 0.5 * np.einsum("kd,de,ke->k", mu, Lam, mu)
    np.testing.assert_allclose(learner.predict_proba(Zt), softmax(scores, axis=1), atol=1e-9)
