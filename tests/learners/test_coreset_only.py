"""Coreset-only: its prior is always the initial prior."""

from __future__ import annotations

import torch

from ciosl.conformance import blobs
from ciosl.learners.coreset_only import CoresetOnly
from helpers import class_by_class


def test_coreset_only_prior_is_always_the_initial_prior():
    learner = CoresetOnly(buffer=15, finetune_epochs=2, prior_scale=0.7)
    learner.fit_base(*blobs([0, 1], 20, seed=1))
    Z, y = class_by_class([0, 2, 3], 10, seed=2)
    for z, c in zip(Z, y, strict=True):
        learner.learn_one(z, int(c))
        assert torch.count_nonzero(learner.net.prior_mu) == 0
        assert torch.equal(learner.net.prior_prec, learner.net.prec0)
    head = learner.finetuned_head()  # the fine-tuning's prior too
    assert torch.count_nonzero(head.prior_mu) == 0
    assert torch.equal(head.prior_prec, head.prec0)
    W1 = head.views(head.prior_sigma)[0]  # N(0, 0.7^2 / fan_in)
    torch.testing.assert_close(W1, torch.full_like(W1, 0.7 / W1.shape[1] ** 0.5))
    assert "prior_refresh" not in learner.get_params()
    assert not torch.equal(learner.net.mu, torch.zeros_like(learner.net.mu))
