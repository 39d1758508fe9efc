"""VCL+coreset (and Coreset-only, its subclass, for the coreset): the finetuned copy, its
KL weight, inference that leaves the posterior alone, the coreset's capacity and sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ciosl.conformance import blobs
from ciosl.learners.ciosl import BayesHead
from ciosl.learners.coreset_only import CoresetOnly
from ciosl.learners.vcl import VCL
from ciosl.learners.vcl_coreset import VCLCoreset
from helpers import class_by_class


def test_vcl_coreset_finetunes_a_copy_with_the_posterior_as_prior():
    learner = VCLCoreset(buffer=15, finetune_epochs=2).fit_base(*blobs([0, 1], 20, seed=1))
    Z, y = blobs([0, 1, 2], 5, seed=2)
    for z, c in zip(Z, y, strict=True):
        learner.learn_one(z, int(c))
    head = learner.finetuned_head()
    assert head is not learner.net
    assert torch.equal(head.prior_mu, learner.net.mu)  # the prior of the fine-tuning is q~_t
    assert torch.equal(head.prior_sigma, learner.net.sigma())
    assert not torch.equal(head.mu, learner.net.mu)  # and it moved away from it


def _state_equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_state_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("prediction", ["mean", "mc"])
def test_vcl_coreset_inference_leaves_the_posterior_alone_but_changes_predictions(prediction):
    Zb, yb = blobs([0, 1], 20, seed=1)
    Z, y = class_by_class([2, 3], 15, seed=2)
    Zt, _ = blobs([0, 1, 2, 3], 10, seed=9)
    settings = {"prediction": prediction, "refresh_every": 10}
    with_coreset = VCLCoreset(buffer=20, **settings).fit_base(Zb, yb)
    plain = VCL(**settings).fit_base(Zb, yb)
    untuned = VCLCoreset(buffer=20, finetune_epochs=0, **settings).fit_base(Zb, yb)
    for z, c in zip(Z, y, strict=True):
        for learner in (with_coreset, plain, untuned):
            learner.learn_one(z, int(c))
        if c == 3:  # predicting in between changes nothing of what the learner does next
            before = with_coreset.state_dict()
            with_coreset.predict_proba(Zt)
            assert _state_equal(with_coreset.state_dict(), before)
    # the streamed posterior is VCL's, bit for bit (the coreset only uses the numpy generator)
    assert torch.equal(with_coreset.net.mu, plain.net.mu)
    P, P_vcl = with_coreset.predict_proba(Zt), plain.predict_proba(Zt)
    assert np.abs(P - P_vcl).max() > 1e-2
    np.testing.assert_array_equal(untuned.predict_proba(Zt), P_vcl)  # 0 epochs: VCL itself


def test_finetuned_copy_is_cached_until_the_next_update(monkeypatch):
    learner = VCLCoreset(buffer=10, finetune_epochs=1).fit_base(*blobs([0, 1], 10, seed=1))
    calls = []
    finetune = learner._finetune
    monkeypatch.setattr(learner, "_finetune", lambda: calls.append(1) or finetune())
    Zt, _ = blobs([0, 1], 5, seed=9)
    P = learner.predict_proba(Zt)
    np.testing.assert_array_equal(learner.predict_proba(Zt), P)
    assert len(calls) == 1
    learner.learn_one(Zt[0], 0)
    learner.predict(Zt)
    assert len(calls) == 2
    restored = VCLCoreset(buffer=10, finetune_epochs=1).load_state_dict(learner.state_dict())
    np.testing.assert_array_equal(restored.predict_proba(Zt), learner.predict_proba(Zt))


def test_finetuning_kl_weight_is_the_coreset_elbo_with_a_curvature_cap(monkeypatch):
    """The fine-tuning's KL weight is lambda1 * T / |C| (the coreset's per-item tempered ELBO),
    capped so that its curvature on a mean, kl_scale * max prior precision, is <= 1 / lr."""
    seen = []
    train = BayesHead._train

    def spy(self, X, Y, **kw):
        seen.append((len(Y), kw.get("kl_scale"), float(self.net.prior_prec.max())))
        return train(self, X, Y, **kw)

    monkeypatch.setattr(BayesHead, "_train", spy)
    big = VCLCoreset(buffer=200).fit_base(*blobs([0, 1], 100, seed=1))
    big.predict(blobs([0], 1, seed=2)[0])
    n, kl, prec = seen[-1]
    assert n == 200 and kl == pytest.approx(big.temperature / 200)  # lambda1 T / |C|
    assert kl * prec < 1.0 / big.lr  # not capped
    tiny = VCLCoreset(buffer=200, temperature=1.0, lambda1=3.0)
    Z, y = blobs([0, 1], 2, seed=3)
    for z, c in zip(Z[:3], y[:3], strict=True):  # no base init: 3 items in the coreset
        tiny.learn_one(z, int(c))
    P = tiny.predict_proba(Z)
    n, kl, prec = seen[-1]
    assert n == 3 and kl == pytest.approx(1.0 / (tiny.lr * prec)) and kl < 3.0 / 3  # capped
    assert np.isfinite(P).all()


@pytest.mark.parametrize("cls,replacement", [
    (VCLCoreset, "reservoir"), (VCLCoreset, "class_balanced_random"),
    (CoresetOnly, "reservoir")])
def test_coreset_never_exceeds_capacity(cls, replacement):
    learner = cls(buffer=13, replacement=replacement, finetune_epochs=1)
    learner.fit_base(*blobs([0, 1], 10, seed=1))
    assert learner.memory_size() == 13
    Z, y = class_by_class([2, 3, 4], 15, seed=2)
    for z, c in zip(Z, y, strict=True):
        learner.learn_one(z, int(c))
        assert learner.memory_size() <= 13
    counts = learner.memory.class_counts()
    assert learner.memory_size() == sum(counts.values()) == 13
    if replacement == "class_balanced_random":
        # evictions from the largest class (ties: the oldest) keep every class >= 13 // 5
        assert min(counts.values()) >= 2 and len(counts) == 5


def test_reservoir_coreset_is_a_uniform_sample_of_the_stream():
    """Every stream position is held with probability capacity / n: over seeds, the early and
    the late half of the stream are held equally often."""
    Z, y = blobs([0, 1], 30, seed=1)  # 60 distinct rows
    early = late = 0
    for seed in range(30):
        learner = VCLCoreset(buffer=10, finetune_epochs=0, seed=seed)
        for z, c in zip(Z, y, strict=True):
            learner.learn_one(z, int(c))
        held = learner.memory.z[:10].numpy()  # (10, d): which stream rows they are
        pos = [int(np.flatnonzero((Z == row).all(axis=1))[0]) for row in held]
        early += sum(p < 30 for p in pos)
        late += sum(p >= 30 for p in pos)
    assert early + late == 300 and abs(early - late) < 50
