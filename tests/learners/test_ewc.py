"""EWC and MAS (MAS is EWC with another importance: ``class MAS(EWC)``): the importance, the step
against the stated objective, the anchor's refreshes, the penalty's strength and its curvature cap,
tested directly against a reference written here (hand-built forward passes and autograd, running
means by hand)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ciosl.conformance import blobs
from ciosl.learners import make_learner
from ciosl.learners.ewc import EWC
from helpers import class_by_class, hidden


def indices(learner, labels) -> torch.Tensor:
    """The learner's internal class indices (order of first appearance) of ``labels``."""
    return torch.tensor([learner._class_index[int(c)] for c in labels])


def mlp(params, X):
    """The head's forward pass, written independently: ReLU hidden layers, linear output."""
    h = X
    for i in range(0, len(params) - 2, 2):
        h = torch.relu(h @ params[i].T + params[i + 1])
    return h @ params[-2].T + params[-1]



def reference_importance(method, params, X, Y):
    """Per-sample importances (n, each tensor): EWC the squared gradient of log p(y | x),
    MAS the absolute gradient of ||f(x)||^2, by torch.func over a hand-built forward."""
    def ewc(ps, x, y):
        return F.cross_entropy(mlp(ps, x[None]), y[None])

    def mas(ps, x, y):
        return mlp(ps, x[None]).pow(2).sum()

    fn = ewc if method == "ewc" else mas
    g = torch.func.vmap(torch.func.grad(fn), in_dims=(None, 0, 0))(
        [p.detach() for p in params], X, Y)
    return [t * t if method == "ewc" else t.abs() for t in g]


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_importance_is_the_running_mean_of_the_per_sample_estimator(method):
    Zb, yb = blobs([0, 1], 15, seed=1)
    learner = make_learner(method, base_epochs=3).fit_base(Zb, yb)
    X, Y = torch.from_numpy(Zb), indices(learner, yb)
    ref = [t.mean(0) for t in reference_importance(method, learner.net.params, X, Y)]
    for o, r in zip(learner.omega, ref, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-9)
    # fit_base sets the penalty's importance to it and anchors at the trained head
    assert all(torch.equal(f, o) for f, o in zip(learner.omega_frozen, learner.omega,
                                                 strict=True))
    assert all(torch.equal(a, p) for a, p in zip(learner.anchor, learner.net.params,
                                                 strict=True))
    # one stream sample: Omega <- Omega + (imp(theta before the step) - Omega) / (n + 1)
    z, c = blobs([1], 1, seed=2)
    before = [p.detach().clone() for p in learner.net.params]
    omega = [o.clone() for o in learner.omega]
    learner.learn_one(z[0], int(c[0]))
    imp = reference_importance(method, before, torch.from_numpy(z), indices(learner, c))
    for o_new, o, i in zip(learner.omega, omega, imp, strict=True):
        torch.testing.assert_close(o_new, o + (i[0] - o) / (len(Zb) + 1), rtol=1e-4, atol=1e-9)
    assert learner.n_omega == len(Zb) + 1
    assert max(float(o.max()) for o in learner.omega) > 0


@pytest.mark.parametrize("method,lam,binding", [  # (ewc's default lam 500 binds here already)
    ("ewc", 200.0, False), ("mas", 1.0, False), ("ewc", 1e7, True), ("mas", 1e3, True)])
def test_step_is_the_gradient_of_the_stated_objective(method, lam, binding):
    """theta_new = SGD-momentum step on CE + lam / 2 * sum Omega (theta - theta*)^2, with
    lam * Omega capped at max_penalty_step / lr where the cap binds (the gradient clipped to
    max_grad_norm, as every step of the MLP heads)."""
    learner = make_learner(method, lam=lam, refresh_every=10, base_epochs=3)
    learner.fit_base(*blobs([0, 1], 15, seed=1))
    Z, y = class_by_class([2, 0], 12, seed=3)
    for z, c in zip(Z[:14], y[:14], strict=True):  # refreshes at 1 (class 2), 11 (R = 10)
        learner.learn_one(z, int(c))
    assert learner._since_refresh == 4
    before = copy.deepcopy(learner)
    x, c = Z[14], int(y[14])
    learner.learn_one(x, c)

    params = [p.detach().clone().requires_grad_() for p in before.net.params]
    cap = before.max_penalty_step / before.lr
    omega = [torch.clamp(lam * o, max=cap) / lam for o in before.omega_frozen]
    assert any(bool((lam * o > cap).any()) for o in before.omega_frozen) == binding
    ce = F.cross_entropy(mlp(params, torch.from_numpy(x)[None]), indices(before, [c]))
    penalty = sum((w * (p - a) ** 2).sum() for w, p, a in zip(omega, params, before.anchor,
                                                              strict=True))
    grads = torch.autograd.grad(ce + lam / 2 * penalty, params, retain_graph=True)
    grads_ce = torch.autograd.grad(ce, params)
    norm = float(torch.cat([g.flatten() for g in grads]).norm())
    clip = min(1.0, before.max_grad_norm / norm)
    for p_new, p, g, buf in zip(learner.net.params, params, grads, before.opt.buffers,
                                strict=True):
        d = clip * g + before.weight_decay * p.detach()
        expected = p.detach() - before.lr * (before.momentum * buf + d)
        torch.testing.assert_close(p_new.detach(), expected, rtol=1e-5, atol=1e-7)
    # the penalty is a real part of this step, not a rounding error
    diff = max(float((g - g_ce).abs().max()) for g, g_ce in zip(grads, grads_ce, strict=True))
    assert diff > 1e-4


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_parameters_without_gradient_have_zero_importance(method):
    """A feature that is always 0 gives its first-layer weights no gradient: importance 0.
    A new class's output row starts with importance 0."""
    Zb, yb = blobs([0, 1], 15, seed=1)
    Zb[:, 3] = 0.0
    learner = make_learner(method, base_epochs=2).fit_base(Zb, yb)
    Z, y = blobs([0, 1], 10, seed=2)
    Z[:, 3] = 0.0
    for z, c in zip(Z, y, strict=True):
        learner.learn_one(z, int(c))
    W1, W1_frozen = learner.omega[0], learner.omega_frozen[0]  # (256, DIM)
    assert torch.count_nonzero(W1[:, 3]) == 0 and torch.count_nonzero(W1_frozen[:, 3]) == 0
    assert W1[:, [0, 1, 2, 4]].max() > 0 and W1_frozen[:, [0, 1, 2, 4]].max() > 0
    z2 = blobs([2], 1, seed=4)[0][0]
    z2[3] = 0.0
    learner.learn_one(z2, 2)  # class 2 arrives: anchor refreshed with its row at importance 0
    assert learner.omega_frozen[-2].shape == (3, 256)
    assert torch.count_nonzero(learner.omega_frozen[-2][2]) == 0
    assert learner.omega_frozen[-1][2] == 0
    assert learner.omega[-1][2] > 0  # its first step gave the running estimate some
    assert torch.count_nonzero(learner.omega[0][:, 3]) == 0


def test_new_class_rows_start_with_zero_importance_before_any_step():
    learner = EWC(base_epochs=2).fit_base(*blobs([0, 1], 15, seed=1))
    old = [o.clone() for o in learner.omega]
    learner._encode_new([2])  # what learn_one does before the step: the output grows
    assert learner.omega[-2].shape == (3, 256)
    assert torch.count_nonzero(learner.omega[-2][2]) == 0 and learner.omega[-1][2] == 0
    assert torch.equal(learner.omega[-2][:2], old[-2]) and torch.equal(learner.omega[0], old[0])
    assert torch.equal(learner.anchor[-2], learner.net.params[-2].detach())  # refreshed


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_anchor_refreshes_at_new_labels_and_every_R_samples_only(method):
    learner = make_learner(method, refresh_every=5, base_epochs=2)
    learner.fit_base(*blobs([0, 1], 15, seed=1))
    Z01, y01 = blobs([0, 1], 6, seed=2)  # 12 samples of known classes
    Z2, y2 = blobs([2], 7, seed=3)  # class 2 arrives at step 13
    stream = list(zip(Z01, y01, strict=True)) + list(zip(Z2, y2, strict=True))
    refreshed = []
    for step, (z, c) in enumerate(stream, start=1):
        params = [p.detach().clone() for p in learner.net.params]
        anchor = [a.clone() for a in learner.anchor]
        omega = [o.clone() for o in learner.omega]
        frozen = [f.clone() for f in learner.omega_frozen]
        learner.learn_one(z, int(c))
        if not torch.equal(hidden(learner.anchor), hidden(anchor)):
            refreshed.append(step)
            # theta* = the parameters and the penalty's Omega = the running Omega, just before
            assert torch.equal(hidden(learner.anchor), hidden(params))
            assert torch.equal(learner.anchor[-2][:len(params[-2])], params[-2])
            assert torch.equal(hidden(learner.omega_frozen), hidden(omega))
        else:
            assert torch.equal(hidden(learner.omega_frozen), hidden(frozen))
            assert not torch.equal(hidden(learner.omega), hidden(omega))  # running one moves
    assert refreshed == [6, 11, 13, 18]


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_learn_many_with_several_refreshes_rolls_back_at_every_point(method):
    """A learn_many that re-anchors at every sample (refresh_every=1) and brings two new
    classes: whichever sample its failure comes after, the learner is as before the call (the
    anchor and the frozen importance are references to tensors no step writes), and over a long
    stream with failed calls it ends where a twin without them ends."""
    from ciosl.conformance import InjectedFailure, failing_after
    from ciosl.serial import digest

    twins = [make_learner(method, refresh_every=1, base_epochs=1) for _ in range(2)]
    Z, y = blobs([0, 1, 2, 3, 4], 8, seed=3)
    for t in twins:
        t.fit_base(Z[:6], [0, 1, 0, 1, 0, 1])
        t.learn_one(Z[6], 1)
    learner, twin = twins
    batch, labels = Z[7:13], [0, 2, 1, 3, 2, 0]  # classes 2 and 3 are new
    before = digest(learner.state_dict())
    for at in range(1, len(labels) + 1):
        with failing_after(learner, "_learn_one", at), pytest.raises(InjectedFailure):
            learner.learn_many(batch, labels)
        assert digest(learner.state_dict()) == before, at
    for t in twins:
        t.learn_many(batch, labels)
    assert digest(learner.state_dict()) == digest(twin.state_dict())
    for i in range(120):  # new classes, known ones, batches, failed calls (not the twin's)
        for t in twins:
            if i % 3 == 0:
                t.learn_many(Z[:4], [0, 10 + i, 1, 10 + i])
            else:
                t.learn_one(Z[i % len(Z)], int(y[i % len(Z)]))
        if i % 7 == 0:
            with failing_after(learner, "_learn_one", 2), pytest.raises(InjectedFailure):
                learner.learn_many(Z[:3], [0, 1000 + i, 1])
    assert digest(learner.state_dict()) == digest(twin.state_dict())


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_larger_lambda_keeps_parameters_closer_to_the_anchor(method):
    """A class-incremental stream: the anchor is set when class 2 arrives; the importance-
    weighted distance to it at the end shrinks as lam grows."""
    state = make_learner(method, base_epochs=3).fit_base(*blobs([0, 1], 20, seed=1))
    state = state.state_dict()
    Z, y = blobs([2], 40, seed=5)

    def distance(lam):
        learner = make_learner(method, lam=lam, base_epochs=3)
        learner.load_state_dict({**state, "params": learner.get_params()})
        for z, c in zip(Z, y, strict=True):
            learner.learn_one(z, int(c))
        return float(sum((w * (p.detach() - a) ** 2).sum() for w, p, a in zip(
            learner.omega_frozen, learner.net.params, learner.anchor, strict=True)))

    lams = [0.0, 1.0, 10.0, 100.0, 1000.0] if method == "mas" else [0.0, 1e3, 1e4, 1e5, 1e6]
    d = [distance(lam) for lam in lams]
    assert all(a > b for a, b in zip(d, d[1:], strict=False)), d
    assert d[-1] < 0.5 * d[0], d


def test_curvature_cap_keeps_lambda_500_stable():
    """With importance 1 everywhere, lr * lam * Omega = 0.01 * 500 = 5 > 2 (1 + 0.9): without
    the cap, heavy-ball SGD on the penalty multiplies the distance to the anchor by ~2.8 per
    step and training diverges; with the cap (curvature <= 1 / lr) it stays bounded. (Plain
    SGD, max_grad_norm=inf: gradient clipping would bound the steps too.)"""
    base = EWC(base_epochs=2).fit_base(*blobs([0, 1], 15, seed=1))
    for o in base.omega:
        o.fill_(1.0)
    base._refresh()
    state = base.state_dict()
    Z, y = blobs([0, 1], 100, seed=2)

    def run(max_penalty_step):
        learner = EWC(max_penalty_step=max_penalty_step, base_epochs=2,
                      max_grad_norm=float("inf"))
        learner.load_state_dict({**state, "params": learner.get_params()})
        for z, c in zip(Z, y, strict=True):
            learner.learn_one(z, int(c))
        return learner

    with pytest.raises(FloatingPointError, match="diverged"):
        run(float("inf"))
    learner = run(1.0)
    assert max(float(c.max()) for c in learner._curv) == pytest.approx(1.0 / learner.lr)
    drift = max(float((p.detach() - a).abs().max()) for p, a in zip(learner.net.params,
                                                                   learner.anchor, strict=True))
    assert np.isfinite(drift) and drift < 1.0
