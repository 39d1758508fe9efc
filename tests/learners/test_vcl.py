"""VCL: CIOSL without replay and distillation, bit for bit; the prior after a refresh."""

from __future__ import annotations

import pytest
import torch

from ciosl.conformance import blobs
from ciosl.learners import make_learner
from ciosl.learners.vcl import VCL
from helpers import class_by_class


def test_vcl_is_ciosl_without_replay_and_distillation():
    """Same seed, same stream (no base init, whose scoring draws CIOSL alone makes): VCL's
    posterior equals CIOSL's with lambda2 = 0, N1' = N2' = 0 (and VCL's Fisher memory and KL
    weight, and VCL's precision rule, without CIOSL's floor at the prior), bit for bit."""
    Z, y = class_by_class([0, 1, 2], 15, seed=1)
    vcl = VCL(mc_samples=1, refresh_every=7)
    ciosl = make_learner("ciosl", lambda1=vcl.lambda1, lambda2=0.0, n_replay=0, n_distill=0,
                         mc_samples=1, refresh_every=7, fisher_decay=vcl.fisher_decay,
                         precision_floor=vcl.precision_floor)
    for z, c in zip(Z, y, strict=True):
        vcl.learn_one(z, int(c))
        ciosl.learn_one(z, int(c))
    assert torch.equal(vcl.net.mu, ciosl.net.mu)
    assert torch.equal(vcl.net.fisher, ciosl.net.fisher)
    assert torch.equal(vcl.net.prior_mu, ciosl.net.prior_mu)
    assert not hasattr(vcl, "memory") and "memory" not in vcl.state_dict()["state"]


def prefix(net, flat):
    """The hidden layers' part of a flat (P,) BNN tensor: its prefix (the output layer is last
    and is the only one that grows)."""
    return flat[:sum(m.numel() for m in net.mu_l[:-2])]


@pytest.mark.parametrize("refresh,expected", [("every", [8, 15, 22, 29]), ("class", [11, 21])])
def test_vcl_prior_after_a_refresh_is_the_previous_posterior(refresh, expected):
    learner = VCL(prior_refresh=refresh, refresh_every=7).fit_base(*blobs([0, 1], 20, seed=1))
    net = learner.net
    assert torch.equal(net.prior_mu, net.mu) and torch.equal(net.prior_sigma, net.sigma())
    Z, y = class_by_class([0, 2, 3], 10, seed=2)  # class 2 at step 11, class 3 at step 21
    refreshed = []
    for step, (z, c) in enumerate(zip(Z, y, strict=True), start=1):
        net = learner.net
        mu, sigma = prefix(net, net.mu).clone(), prefix(net, net.sigma()).clone()
        prior = prefix(net, net.prior_mu).clone()
        learner.learn_one(z, int(c))
        net = learner.net
        if not torch.equal(prefix(net, net.prior_mu), prior):
            refreshed.append(step)
            assert torch.equal(prefix(net, net.prior_mu), mu)  # bit for bit
            assert torch.equal(prefix(net, net.prior_sigma), sigma)
        assert not torch.equal(prefix(net, net.mu), mu)  # the posterior moves at every step
    assert refreshed == expected
