"""ranpac (random ReLU features + ridge regression, lambda by GCV) against scikit-learn's Ridge
and a brute-force GCV on the same features."""

import numpy as np
import pytest
from scipy.special import softmax
from sklearn.linear_model import Ridge

from ciosl.learners import make_learner
from ciosl.learners.ranpac import GRID


def blobs(n_per_class, dim=30, n_classes=4, seed=0):
    """Overlapping, balanced, shuffled classes: Z (n, d) float32, y (n,)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 0.7, (n_classes, dim))
    y = rng.permutation(np.repeat(np.arange(n_classes), n_per_class))
    return (centers[y] + rng.normal(size=(len(y), dim))).astype(np.float32), y


def streamed(n_per_class, **settings):
    Z, y = blobs(n_per_class)
    learner = make_learner("ranpac", **settings)
    for z, label in zip(Z, y, strict=True):
        learner.learn_one(z, label)
    return learner, Z, y


def onehot(learner, y):
    return np.eye(len(learner.classes_))[[learner.classes_.index(c) for c in y]]


def brute_gcv(H, Y):
    """argmin over the grid of ||Y - A Y||^2 / (1 - tr A / n)^2, A the explicit hat matrix."""
    G = H.T @ H
    scores = {}
    for lam in GRID * np.trace(G) / len(G):
        A = H @ np.linalg.solve(G + lam * np.eye(len(G)), H.T)  # (n, n)
        scores[lam] = np.square(Y - A @ Y).sum() / (1 - np.trace(A) / len(H)) ** 2
    return min(scores, key=scores.get)


# every sample waiting (p >= D and p < D); 2 committed blocks + 88 waiting
@pytest.mark.parametrize("n_per_class, D", [(40, 64), (40, 256), (150, 96)])
def test_gcv_choice_and_solution_equal_sklearn_ridge(n_per_class, D):
    learner, Z, y = streamed(n_per_class, proj_dim=D)
    H, Y = learner.transform(Z), onehot(learner, y)
    lam = learner.ridge_
    assert lam == pytest.approx(brute_gcv(H, Y), rel=1e-9)
    scale = np.trace(H.T @ H) / D
    assert GRID[0] * scale * 1.01 < lam < GRID[-1] * scale / 1.01  # inside the grid
    Zt, _ = blobs(50, seed=1)
    Ht = learner.transform(Zt)
    out = Ht @ Ridge(alpha=lam, fit_intercept=False, solver="cholesky").fit(H, Y).coef_.T
    np.testing.assert_allclose(learner.predict_proba(Zt), softmax(out, axis=1), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.parametrize("n_per_class, D", [(150, 48), (40, 256)])  # committed; dual
def test_fixed_ridge_equals_sklearn_ridge(n_per_class, D):
    learner, Z, y = streamed(n_per_class, proj_dim=D, ridge_estimator="fixed", ridge=7.5)
    assert learner.ridge_ == 7.5
    H, Y = learner.transform(Z), onehot(learner, y)
    Zt, _ = blobs(50, seed=1)
    out = learner.transform(Zt) @ Ridge(alpha=7.5, fit_intercept=False).fit(H, Y).coef_.T
    np.testing.assert_allclose(learner.predict_proba(Zt), softmax(out, axis=1), rtol=1e-9)


def test_gcv_choice_follows_the_feature_scale():
    a, Z, _ = streamed(60, proj_dim=64)
    b = make_learner("ranpac", proj_dim=64)
    _, y = blobs(60)
    for z, label in zip(10 * Z, y, strict=True):
        b.learn_one(z, label)  # h scales by 10, G by 100
    assert b.ridge_ == pytest.approx(100 * a.ridge_, rel=1e-9)
    Zt, _ = blobs(20, seed=1)
    np.testing.assert_array_equal(a.predict(Zt), b.predict(10 * Zt))


def test_more_samples_choose_a_smaller_relative_ridge():
    picks = []
    for n in (5, 400):
        learner, Z, _ = streamed(n, proj_dim=128)
        H = learner.transform(Z)
        picks.append(learner.ridge_ / (np.trace(H.T @ H) / 128))
    assert picks[0] > picks[1]


def test_bad_ridge_is_refused():
    with pytest.raises(ValueError, match="ridge"):
        make_learner("ranpac", ridge=-1.0)
    with pytest.raises(ValueError, match="ridge_estimator='loo' is not valid"):
        make_learner("ranpac", ridge_estimator="loo")
