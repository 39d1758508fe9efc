"""shrinkage_estimator="oas" of slda and rp_lda against scikit-learn on the same data.

The estimator is the same as scikit-learn's ``OAS(assume_centered=True)`` on the deviations
z_i - mu_{y_i} from the class means; with its coefficient, scikit-learn's
``LinearDiscriminantAnalysis(solver="lsqr", shrinkage=c)`` (which shrinks each class's
covariance by c towards tr/d I and weights them by the class frequencies: the pooled covariance
shrunk by c) gives the same probabilities on balanced classes (equal log-priors)."""

import numpy as np
import pytest
from sklearn.covariance import OAS
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from ciosl.learners import make_learner
from ciosl.learners.shrinkage import oas_shrinkage


def blobs(n_per_class, dim=30, n_classes=4, seed=0):
    """Balanced, shuffled classes with unequal feature scales: Z (n, d) float32, y (n,)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, (n_classes, dim))
    scale = rng.uniform(0.2, 2.0, dim)
    y = rng.permutation(np.repeat(np.arange(n_classes), n_per_class))
    return (centers[y] + rng.normal(size=(len(y), dim)) * scale).astype(np.float32), y


def features(learner, Z):
    return learner.transform(Z) if hasattr(learner, "transform") else Z.astype(np.float64)


def check_against_sklearn(learner, Z, y, Zt):
    H, Ht = features(learner, Z), features(learner, Zt)
    mu = np.stack([H[y == c].mean(0) for c in learner.classes_])
    X = H - mu[[learner.classes_.index(c) for c in y]]  # deviations from the class means
    c = OAS(assume_centered=True).fit(X).shrinkage_
    assert 0.01 < c < 0.99  # a real choice, not a clipped one
    assert learner.shrinkage_ == pytest.approx(c, rel=1e-9)
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=learner.shrinkage_).fit(H, y)
    order = [list(sk.classes_).index(k) for k in learner.classes_]
    P = learner.predict_proba(Zt)
    np.testing.assert_allclose(P, sk.predict_proba(Ht)[:, order], rtol=1e-7, atol=1e-10)
    assert np.mean(P.max(1) < 0.99) > 0.05  # overlapping classes: the comparison is not trivial


# slda; rp_lda with every sample waiting, p >= D (full solve) and p < D (Woodbury), and with
# 2 committed blocks + waiting rows
@pytest.mark.parametrize("method, settings, n_per_class", [
    ("slda", {}, 40), ("rp_lda", {"proj_dim": 64}, 40), ("rp_lda", {"proj_dim": 512}, 40),
    ("rp_lda", {"proj_dim": 96}, 150)])
def test_oas_streaming_equals_sklearn(method, settings, n_per_class):
    Z, y = blobs(n_per_class)
    Zt, _ = blobs(50, seed=1)
    learner = make_learner(method, shrinkage_estimator="oas", **settings)
    for z, label in zip(Z, y, strict=True):
        learner.learn_one(z, label)
    check_against_sklearn(learner, Z, y, Zt)


def test_slda_oas_after_fit_base_and_stream_equals_sklearn():
    Z, y = blobs(60)
    Zt, _ = blobs(50, seed=1)
    learner = make_learner("slda", shrinkage_estimator="oas")
    learner.fit_base(Z[:100], y[:100])
    for z, label in zip(Z[100:], y[100:], strict=True):
        learner.learn_one(z, label)
    check_against_sklearn(learner, Z, y, Zt)


def test_oas_formula_matches_sklearn_on_raw_data():
    X = np.random.default_rng(3).normal(size=(25, 40)) * np.linspace(0.1, 3, 40)
    S = X.T @ X
    c = oas_shrinkage(np.trace(S), np.square(S).sum(), 25, 40)
    assert c == pytest.approx(OAS(assume_centered=True).fit(X).shrinkage_, rel=1e-12)
    assert oas_shrinkage(4.0, 16.0, 10, 1) == 0.0  # one feature: no shrinkage (as sklearn)


def test_oas_shrinks_less_as_samples_accumulate():
    Z, y = blobs(400, dim=60)
    learner = make_learner("slda", shrinkage_estimator="oas")
    seen = []
    for i, (z, label) in enumerate(zip(Z, y, strict=True)):
        learner.learn_one(z, label)
        if i + 1 in (50, 200, 1600):
            seen.append(learner.shrinkage_)
    assert seen[0] > seen[1] > seen[2]


def test_fixed_reports_its_eps_and_an_ignored_eps_is_refused():
    learner = make_learner("slda", shrinkage=0.25, shrinkage_estimator="fixed")
    learner.learn_one(np.ones(3), 0)
    assert learner.shrinkage_ == 0.25
    assert make_learner("slda").shrinkage_estimator == "oas"  # the default (issue 38's study)
    with pytest.raises(ValueError, match="shrinkage=0.25 is used only with shrinkage_estimator"):
        make_learner("slda", shrinkage=0.25)


def test_oas_without_spread_is_nearest_class_mean():
    learner = make_learner("rp_lda", proj_dim=16, shrinkage_estimator="oas")
    learner.learn_one(np.array([1.0, 0.0]), "a")
    learner.learn_one(np.array([0.0, 1.0]), "b")  # one sample per class: Sigma = 0
    assert learner.shrinkage_ == 1.0
    assert learner.predict(np.array([[0.9, 0.1], [0.2, 0.8]])).tolist() == ["a", "b"]


@pytest.mark.parametrize("method", ["slda", "rp_lda"])
def test_unknown_estimator_is_refused(method):
    with pytest.raises(ValueError, match="shrinkage_estimator='ledoit_wolf' is not valid"):
        make_learner(method, shrinkage_estimator="ledoit_wolf")


@pytest.mark.parametrize("method", ["slda", "rp_lda"])
def test_oas_is_the_default_and_the_ends_of_a_fixed_eps_are_accepted(method):
    assert make_learner(method).shrinkage_estimator == "oas"
    for eps in (0.0, 1.0):
        assert make_learner(method, shrinkage=eps, shrinkage_estimator="fixed").shrinkage == eps
    with pytest.raises(ValueError, match="used only with shrinkage_estimator=fixed"):
        make_learner(method, shrinkage=0.0)
