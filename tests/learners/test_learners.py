"""Method-specific correctness of finetune, ncm and slda against references computed here."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import softmax
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from ciosl.learners import make_learner


def gaussian_data(n_per_class=100, dim=8, n_classes=3, spread=2.0, seed=0, test=False):
    """Balanced classes with one shared, non-diagonal covariance: Z (n, d) float32, y (n,).
    ``test=True`` draws other samples from the same distribution."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(dim, dim)) / np.sqrt(dim)  # shared covariance A A^T
    centers = rng.normal(0.0, spread, (n_classes, dim))
    rng = np.random.default_rng([seed, test])
    y = rng.permutation(np.repeat(np.arange(n_classes), n_per_class))
    Z = centers[y] + rng.normal(size=(len(y), dim)) @ A.T
    return Z.astype(np.float32), y


def stream(learner, Z, y):
    for z, label in zip(Z, y, strict=True):
        learner.learn_one(z, label)
    return learner


def class_means(learner, Z, y):
    """numpy class means (K, d) in the learner's class order, and the pooled covariance."""
    Z = Z.astype(np.float64)
    mu = np.stack([Z[y == c].mean(0) for c in learner.classes_])
    D = Z - mu[[learner.classes_.index(c) for c in y]]
    return mu, D.T @ D / len(Z)


# ---------------------------------------------------------------------------- SLDA
def test_slda_streaming_equals_batch():
    Z, y = gaussian_data()
    streamed = stream(make_learner("slda"), Z, y)
    batch = make_learner("slda").fit_base(Z, y)
    halves = make_learner("slda").fit_base(Z[:120], y[:120]).fit_base(Z[120:], y[120:])
    mixed = stream(make_learner("slda").fit_base(Z[:120], y[:120]), Z[120:], y[120:])
    mu, cov = class_means(streamed, Z, y)
    for learner in (streamed, batch, halves, mixed):
        assert learner.classes_ == streamed.classes_
        np.testing.assert_allclose(learner.mu.numpy(), mu, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(learner.covariance.numpy(), cov, rtol=1e-6, atol=1e-9)
        assert learner.counts.tolist() == [int((y == c).sum()) for c in learner.classes_]


def test_slda_matches_numpy_and_sklearn_lda():
    eps = 1e-4
    Z, y = gaussian_data(n_per_class=150, spread=0.2, seed=1)  # overlapping classes
    Zt, yt = gaussian_data(n_per_class=150, spread=0.2, seed=1, test=True)
    learner = stream(make_learner("slda", shrinkage=eps, shrinkage_estimator="fixed"), Z, y)
    mu, cov = class_means(learner, Z, y)
    Lam = np.linalg.inv((1 - eps) * cov + eps * np.eye(len(cov)))
    scores = Zt @ (mu @ Lam).T - 0.5 * np.einsum("kd,de,ke->k", mu, Lam, mu)
    P = learner.predict_proba(Zt)
    np.testing.assert_allclose(P, softmax(scores, axis=1), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(learner.predict(Zt),
                                  np.asarray(learner.classes_)[scores.argmax(1)])
    # sklearn averages the per-class covariances with the (uniform) priors, which equals the
    # count-weighted pooled covariance only for balanced classes (as here), and shrinks
    # towards trace(cov)/d * I instead of I; with eps = 1e-4 the rules barely differ.
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=eps, priors=np.full(3, 1 / 3))
    agreement = np.mean(sk.fit(Z, y).predict(Zt) == learner.predict(Zt))
    assert agreement >= 0.99
    assert 0.6 < learner.score(Zt, yt) < 0.95  # overlap: the comparison is not trivial


def test_slda_separable_blobs_class_incremental():
    Z, y = gaussian_data(n_per_class=60, dim=16, n_classes=5, spread=4.0, seed=3)
    order = np.argsort(y, kind="stable")  # class after class
    base = y[order] < 2
    learner = make_learner("slda").fit_base(Z[order][base], y[order][base])
    stream(learner, Z[order][~base], y[order][~base])
    Zt, yt = gaussian_data(n_per_class=60, dim=16, n_classes=5, spread=4.0, seed=3, test=True)
    assert learner.score(Zt, yt) >= 0.99


def test_slda_frozen_covariance_and_kept_factorization():
    Z, y = gaussian_data()
    frozen = make_learner("slda", streaming_update=False).fit_base(Z[:60], y[:60])
    cov = frozen.covariance.clone()
    frozen.predict(Z[:5])
    answer = frozen._answer
    frozen.predict(Z[:5])
    assert frozen._answer is answer  # kept: no update since the last prediction
    stream(frozen, Z[60:], y[60:])
    assert torch.equal(frozen.covariance, cov)
    frozen.predict(Z[:5])
    # the covariance did not change: the same factorization, no correction, new means
    assert frozen._answer.kept.solve0 is answer.kept.solve0 and len(frozen._answer.kept.V) == 0
    np.testing.assert_allclose(frozen.mu.numpy(), class_means(frozen, Z, y)[0], rtol=1e-6)
    live = make_learner("slda").fit_base(Z[:60], y[:60])
    live.predict(Z[:5])
    answer = live._answer
    live.learn_one(Z[60], y[60])
    live.predict(Z[:5])  # caught up on the one row: the anchor kept, one correction row
    assert live._answer.kept.solve0 is answer.kept.solve0 and len(live._answer.kept.V) == 1


def test_ncm_means_and_predictions_match_numpy():
    Z, y = gaussian_data(n_per_class=50, n_classes=4, spread=1.0, seed=4)
    learner = stream(make_learner("ncm", temperature=3.0).fit_base(Z[:40], y[:40]), Z[40:],
                     y[40:])
    mu, _ = class_means(learner, Z, y)
    np.testing.assert_allclose(learner.mu.numpy(), mu, rtol=1e-12, atol=1e-12)
    assert learner.counts.tolist() == [int((y == c).sum()) for c in learner.classes_]
    d2 = ((Z[:, None, :].astype(np.float64) - mu[None]) ** 2).sum(-1)  # (n, K)
    np.testing.assert_array_equal(learner.predict(Z), np.asarray(learner.classes_)[d2.argmin(1)])
    np.testing.assert_allclose(learner.predict_proba(Z), softmax(-d2 / 3.0, axis=1),
                               rtol=1e-9, atol=1e-12)


def test_ncm_probabilities_stable_for_huge_distances():
    Z, y = gaussian_data(n_per_class=10, seed=5)
    learner = make_learner("ncm", temperature=1e-3).fit_base(Z * 1e4, y)
    P = learner.predict_proba(Z * 1e4)
    assert np.isfinite(P).all()
    np.testing.assert_allclose(P.sum(1), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        make_learner("ncm", temperature=0.0)


# ---------------------------------------------------------------------------- Fine-tune
def forward(params, X):
    W0, b0, W1, b1, W2, b2 = params
    return F.linear(F.relu(F.linear(F.relu(F.linear(X, W0, b0)), W1, b1)), W2, b2)


@pytest.mark.parametrize("max_grad_norm", [float("inf"), 0.5])  # the paper's plain SGD; clipped
def test_finetune_first_steps_are_sgd(max_grad_norm):
    lr, wd, m = 0.05, 1e-3, 0.9
    Z, y = gaussian_data(n_per_class=5, seed=6)
    learner = make_learner("finetune", lr=lr, weight_decay=wd, momentum=m, base_epochs=0,
                           max_grad_norm=max_grad_norm)
    learner.fit_base(Z, y)  # builds the head for 3 classes; no training step
    p0 = [p.detach().clone().requires_grad_(True) for p in learner.net.params]
    x, k = torch.from_numpy(Z[:1]), learner.classes_.index(y[0])
    g = torch.autograd.grad(F.cross_entropy(forward(p0, x), torch.tensor([k])), p0)
    norm = float(torch.cat([gg.flatten() for gg in g]).norm())
    scale = min(1.0, max_grad_norm / norm)
    assert scale < 1 or max_grad_norm == float("inf")  # the clipped case does clip
    learner.learn_one(Z[0], y[0])
    for p, pp, gg in zip(learner.net.params, p0, g, strict=True):  # first step: no momentum
        torch.testing.assert_close(p, pp - lr * (scale * gg + wd * pp), rtol=0, atol=1e-7)
    # the second step uses the momentum buffer exactly as torch.optim.SGD does (after
    # torch.nn.utils.clip_grad_norm_)
    ref = [p.detach().clone().requires_grad_(True) for p in p0]
    opt = torch.optim.SGD(ref, lr=lr, momentum=m, weight_decay=wd)
    for i in range(2):
        opt.zero_grad()
        target = torch.tensor([learner.classes_.index(y[i])])
        F.cross_entropy(forward(ref, torch.from_numpy(Z[i:i + 1])), target).backward()
        torch.nn.utils.clip_grad_norm_(ref, max_grad_norm)
        opt.step()
    learner.learn_one(Z[1], y[1])
    for p, r in zip(learner.net.params, ref, strict=True):
        torch.testing.assert_close(p, r, rtol=0, atol=1e-6)


def test_finetune_growth_keeps_old_outputs():
    Z, y = gaussian_data(n_per_class=10, seed=7)
    learner = stream(make_learner("finetune", base_epochs=2).fit_base(Z[:20], y[:20]), Z[20:],
                     y[20:])
    X = torch.from_numpy(Z)
    before = [p.detach().clone() for p in learner.net.params]
    with torch.no_grad():
        logits = learner.net(X)  # (n, 3)
    P = learner.predict_proba(Z)
    learner._encode_new([99])  # a new class (99) arrives; its first step has not happened yet
    after = learner.net.params
    for p, q in zip(before[:-2], after[:-2], strict=True):
        assert torch.equal(p, q)
    assert torch.equal(after[-2][:3], before[-2]) and torch.equal(after[-1][:3], before[-1])
    assert after[-2].shape == (4, 256) and after[-2][3].abs().max() <= 1 / 16  # Linear init
    with torch.no_grad():  # same weights; a wider matmul may round differently (BLAS blocking)
        torch.testing.assert_close(learner.net(X)[:, :3], logits, rtol=0, atol=1e-6)
    P_new = learner.predict_proba(Z)
    np.testing.assert_allclose(P_new[:, :3] / P_new[:, :3].sum(1, keepdims=True), P, rtol=1e-5)
    learner.learn_one(Z[0], 99)  # the next step moves the old outputs, as fine-tuning does
    with torch.no_grad():
        assert (learner.net(X)[:, :3] - logits).abs().max() > 1e-4
    assert learner.opt.buffers[-2].shape == (4, 256)


@pytest.mark.parametrize("method", ["finetune", "tinyer", "agem"])
def test_divergence_is_reported_not_hidden(method):
    """A head whose training blows up raises a clear error instead of answering with NaN."""
    from ciosl.learners import make_learner

    rng = np.random.default_rng(0)
    Z = rng.normal(0, 30, (64, 50)).astype(np.float32)
    y = np.arange(64) % 4
    learner = make_learner(method, lr=5.0, base_epochs=1, max_grad_norm=float("inf"))
    with pytest.raises(FloatingPointError, match="diverged.*lower lr") as info:
        learner.fit_base(Z[:16], y[:16])
        for z, c in zip(Z, y, strict=True):
            learner.learn_one(z, int(c))
    # the hint names the stability bound for the largest ||x||^2 of the failing step
    m = re.search(r"lr < 4 \(1 \+ momentum\) / \|\|x\|\|\^2 = ([0-9.e+-]+) .*"
                  r"\|\|x\|\|\^2 = (\d+)", str(info.value))
    assert m, str(info.value)
    assert float(m.group(1)) == pytest.approx(4 * 1.9 / int(m.group(2)), rel=0.06)
    assert int(m.group(2)) > 50 * 30 ** 2 / 2  # rows of N(0, 30^2) in 50-d
