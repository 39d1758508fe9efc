"""The open-set protocol: AUROC / AUOSC (evaluation/metrics.py), every learner's
``novelty_score``, and the runner's per-event open-set record."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.metrics import roc_auc_score

from ciosl.data.orderings import make_ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation.metrics import auosc, auroc
from ciosl.evaluation.protocol import run_stream
from ciosl.learners import make_learner
from ciosl.learners.base import NOVELTY_DEFAULT

# ---------------------------------------------------------------- metrics


def _scores(kind: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "continuous":
        return rng.normal(0, 1, 300), rng.normal(0.8, 1, 170)
    if kind == "ties":  # one decimal: many ties inside and across the two sets
        return np.round(rng.normal(0, 1, 300), 1), np.round(rng.normal(0.8, 1, 170), 1)
    if kind == "constant":
        return np.zeros(50), np.zeros(20)
    if kind == "separated":
        return rng.uniform(0, 1, 40), rng.uniform(2, 3, 30)
    raise AssertionError(kind)


KINDS = ["continuous", "ties", "constant", "separated"]


@pytest.mark.parametrize("kind", KINDS)
def test_auroc_is_sklearns_roc_auc_with_novel_as_positive(kind):
    known, novel = _scores(kind)
    y = np.r_[np.zeros(len(known)), np.ones(len(novel))]
    if kind == "constant":
        assert auroc(known, novel) == 0.5
    else:
        assert auroc(known, novel) == pytest.approx(roc_auc_score(y, np.r_[known, novel]),
                                                    abs=1e-12)
    assert auroc(novel, known) == pytest.approx(1 - auroc(known, novel), abs=1e-12)


def _auosc_pairs(known, novel, correct):
    """The definition, pair by pair: known rows classified right, ranked below a novel row."""
    total = 0.0
    for k, c in zip(known, correct, strict=True):
        if c:
            total += (novel > k).sum() + 0.5 * (novel == k).sum()
    return total / (len(known) * len(novel))


def _auosc_curve(known, novel, correct, steps=20001):
    """The curve as Stream-51's evaluation draws it (accept a sample while its confidence,
    -novelty, is above a threshold; the rate of correct accepted known samples against the
    rate of accepted novel ones), on a grid fine enough to pass through every score."""
    conf_k, conf_n = -np.asarray(known), -np.asarray(novel)
    lo, hi = min(conf_k.min(), conf_n.min()), max(conf_k.max(), conf_n.max())
    ts = np.linspace(lo - 1e-9, hi, steps)
    fpr = np.array([(conf_n > t).mean() for t in ts])
    ccr = np.array([(correct & (conf_k > t)).mean() for t in ts])
    return np.trapezoid(ccr[::-1], fpr[::-1])


@pytest.mark.parametrize("kind", ["continuous", "ties", "separated"])
def test_auosc_is_the_area_under_the_open_set_classification_curve(kind):
    known, novel = _scores(kind)
    correct = np.random.default_rng(1).random(len(known)) < 0.7
    value = auosc(known, novel, correct)
    assert value == pytest.approx(_auosc_pairs(known, novel, correct), abs=1e-12)
    assert value == pytest.approx(_auosc_curve(known, novel, correct), abs=2e-3)
    assert value <= correct.mean() + 1e-12  # never above the accuracy on the known rows
    assert auosc(known, novel, np.ones(len(known), bool)) == pytest.approx(auroc(known, novel))
    assert auosc(known, novel, np.zeros(len(known), bool)) == 0.0


@pytest.mark.parametrize(("known", "novel"), [([], [0.1]), ([0.1], []), ([], [])])
def test_open_set_scores_are_none_without_known_or_novel_samples(known, novel):
    assert auroc(known, novel) is None
    assert auosc(known, novel, [True] * len(known)) is None


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_open_set_scores_refuse_non_finite_scores(bad):
    with pytest.raises(ValueError, match="finite"):
        auroc([0.1, bad], [0.2])
    with pytest.raises(ValueError, match="correctness"):
        auosc([0.1, 0.2], [0.3], [True])


# ---------------------------------------------------------------- novelty_score


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.data / 16).astype(np.float32), d.target.astype(np.int64)


def _trained(method: str, X, y, **settings):
    """A learner that has learned digits 0-5 only (6-9 are novel to it)."""
    learner = make_learner(method, **settings)
    idx = np.flatnonzero(y < 6)[:600]
    learner.fit_base(X[idx[:200]], y[idx[:200]])
    for i in idx[200:]:
        learner.learn_one(X[i], y[i])
    return learner


def test_ncm_novelty_is_the_euclidean_distance_to_the_nearest_mean(digits):
    X, y = digits
    learner = _trained("ncm", X, y)
    seen = np.flatnonzero(y < 6)[:600]
    means = np.stack([X[seen][y[seen] == c].astype(np.float64).mean(0) for c in range(6)])
    Zt = X[1200:]
    expected = np.sqrt(((Zt[:, None, :] - means[None]) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(learner.novelty_score(Zt), expected, rtol=1e-9, atol=1e-9)
    assert type(learner).novelty != NOVELTY_DEFAULT


def test_slda_novelty_is_the_mahalanobis_distance_to_the_nearest_mean(digits):
    X, y = digits
    learner = _trained("slda", X, y)
    mu = learner.mu.numpy()
    W, _ = learner._weights()
    # the precision its predictions use (the shrunk covariance's inverse, kept): its scores
    # are W = M Lambda, which test_anytime checks against a batch LDA
    Lam = learner._answer.precision(torch.eye(X.shape[1], dtype=torch.float64)).numpy()
    np.testing.assert_allclose(mu @ Lam, W.numpy(), rtol=1e-8, atol=1e-10)
    Zt = X[1200:].astype(np.float64)
    diff = Zt[:, None, :] - mu[None]
    d2 = np.einsum("nkd,de,nke->nk", diff, Lam, diff)
    np.testing.assert_allclose(learner.novelty_score(X[1200:]), np.sqrt(d2.min(1)),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["tinyer", "finetune", "exstream"])
def test_the_default_novelty_is_one_minus_the_max_probability(digits, method):
    X, y = digits
    learner = _trained(method, X, y)
    assert type(learner).novelty == NOVELTY_DEFAULT
    np.testing.assert_allclose(learner.novelty_score(X[1200:]),
                               1 - learner.predict_proba(X[1200:]).max(1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("uncertainty", ["entropy", "epistemic"])
def test_ciosl_novelty_is_its_predictive_uncertainty(digits, uncertainty):
    """Entropy of the mean softmax over posterior draws: between 0 and log C, not the max
    probability's complement, and (epistemic) at most the total entropy."""
    X, y = digits
    learner = _trained("ciosl", X, y, uncertainty=uncertainty)
    s = learner.novelty_score(X[1200:])
    assert (s >= 0).all() and (s <= np.log(6) + 1e-9).all()
    msp = 1 - learner.predict_proba(X[1200:]).max(1)
    assert not np.allclose(s, msp)
    if uncertainty == "epistemic":
        total = _trained("ciosl", X, y).novelty_score(X[1200:])
        assert (s <= total + 1e-9).all()


def test_novelty_score_before_learning_and_on_bad_input_is_refused(digits):
    X, _ = digits
    with pytest.raises(RuntimeError, match="before any sample"):
        make_learner("ncm").novelty_score(X[:2])
    learner = _trained("ncm", *digits)
    with pytest.raises(ValueError, match="novelty_score: feature width"):
        learner.novelty_score(X[:2, :10])


# ---------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def fs(digits):
    X, y = digits
    return FeatureSet("digits-open", "none", X[:1400], y[:1400], X[1400:], y[1400:],
                      tuple(str(i) for i in range(10)), key="digits-open-test")


@pytest.mark.parametrize("method", ["ncm", "slda", "tinyer", "ciosl"])
def test_run_stream_records_auroc_and_auosc_of_the_unseen_classes_at_each_event(fs, method):
    o = make_ordering("class_iid", fs.train_y, seed=0, base_fraction=0.1, classes_per_step=2)
    plain = run_stream(make_learner(method, seed=0), fs, o)
    run = run_stream(make_learner(method, seed=0), fs, o, open_set=True)
    assert run["accuracy"] == plain["accuracy"]  # scoring novelty changes nothing learned
    rec = run["open_set"]
    expect_novel = [int((~np.isin(fs.test_y, o.event_classes[t])).sum())
                    for t in range(len(o.events))]
    assert rec["n_novel"] == expect_novel and expect_novel[0] == len(fs.test_y) - run["n_test"][0]
    assert rec["auroc"][-1] is None and rec["auosc"][-1] is None  # every class learned
    for t in range(len(o.events) - 1):
        assert 0.5 < rec["auroc"][t] <= 1.0  # better than chance on digits
        assert 0.0 <= rec["auosc"][t] <= run["accuracy"][t] + 1e-12
    assert rec["score"] == make_learner(method).novelty
    assert ("baseline" in rec) == (rec["score"] != NOVELTY_DEFAULT)
    json.dumps(run)  # the result file can hold it


def test_a_test_label_no_training_sample_has_is_novel_never_scored():
    """Stream-51's novel test images: a label absent from training is left out of every
    event's accuracy, on every ordering, and counts as novel at every event."""
    y = np.repeat(np.arange(4), 10)
    test_y = np.array([0, 1, 2, 3, 4, 4])  # label 4: no training sample
    for kind in ("iid", "class_iid"):
        o = make_ordering(kind, y, seed=0, base_fraction=0.1, classes_per_step=2)
        for t in range(len(o.events)):
            mask = o.test_mask(test_y, t)
            assert not mask[4:].any()
            assert set(test_y[mask]) == set(o.known(t)) & set(test_y)


def test_run_open_set_writes_per_event_scores_and_the_report_shows_them(tmp_path, capsys):
    from helpers import cli, run_args

    for method in ("ncm", "tinyer"):
        rc, err = cli(capsys, run_args(tmp_path, "--open-set", "--seeds", "0,1",
                                       method=method))
        assert rc == 0, err
    paths = sorted((tmp_path / "out").glob("*open_set=on*.json"))
    assert len(paths) == 2
    for p in paths:
        result = json.loads(p.read_text())
        assert result["protocol"]["open_set"] is True
        for run in result["runs"]:
            rec = run["open_set"]
            assert len(rec["auroc"]) == len(run["events"]) and rec["auroc"][-1] is None
        per_run = [np.mean([v for v in r["open_set"]["auroc"] if v is not None])
                   for r in result["runs"]]
        assert result["open_set"]["auroc"]["mean"] == pytest.approx(np.mean(per_run))
    rc, err = cli(capsys, ["report", str(tmp_path / "out")])
    assert rc == 0, err
    text = (tmp_path / "out" / "report.md").read_text()
    section = text.split("## Open set: AUROC of the method's novelty score")[1].split("##")[0]
    ncm = json.loads(next(p for p in paths if "_ncm_" in p.name).read_text())["open_set"]
    assert f"{ncm['auroc']['mean']:.4f}" in section
    assert "Euclidean distance to the nearest class mean" in section
    assert "## Open set: AUROC of 1 − max probability" in text


def test_an_interrupted_open_set_run_resumes_to_the_same_record(fs):
    """The open-set record is part of the resumable state: a run resumed from a checkpoint in
    the middle of the stream records what the uninterrupted run records."""
    o = make_ordering("class_iid", fs.train_y, seed=1, base_fraction=0.1, classes_per_step=2)
    whole = run_stream(make_learner("slda", seed=1), fs, o, open_set=True)
    saved = []
    run_stream(make_learner("slda", seed=1), fs, o, open_set=True, checkpoint_every=300,
               on_checkpoint=lambda s: saved.append(copy.deepcopy(s)))  # as written to disk
    middle = next(s for s in saved if 0 < len(s["open_set"]) < len(o.events) - 1)
    resumed = run_stream(make_learner("slda", seed=1), fs, o, open_set=True,
                         checkpoint_every=300, on_checkpoint=lambda s: None, resume=middle)
    assert resumed["open_set"] == whole["open_set"]
    assert resumed["accuracy"] == whole["accuracy"]
