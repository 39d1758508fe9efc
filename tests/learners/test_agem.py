"""A-GEM's characteristic rule: the projection of the gradient."""

from __future__ import annotations

import torch

from ciosl.learners import agem, make_learner
from ciosl.learners.agem import project
from helpers import class_blobs


def test_agem_projection_rule():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        g, g_ref = torch.randn(300, generator=gen), torch.randn(300, generator=gen)
        g_t = project(g, g_ref)
        if torch.dot(g, g_ref) >= 0:
            assert g_t is g  # no conflict: unchanged
        else:
            assert torch.dot(g_t, g_ref) >= -1e-4 * g_ref.norm() * g.norm()
            assert torch.dot(g_t, g_ref).abs() < 1e-4 * g_ref.norm() * g.norm()
            # only the component along g_ref was removed
            resid = g - g_t
            assert torch.allclose(resid, (resid @ g_ref / (g_ref @ g_ref)) * g_ref, atol=1e-5)


def test_agem_step_applies_the_projected_gradient(monkeypatch):
    Z, y = class_blobs(40, seed=2, shuffle=False)  # class after class: gradients conflict
    learner = make_learner("agem", buffer=30, base_epochs=2, momentum=0.0, weight_decay=0.0)
    learner.fit_base(Z[:80], y[:80])
    calls = []
    real = agem.project

    def spy(g, g_ref):
        out = real(g, g_ref)
        calls.append((g, g_ref, out))
        return out

    monkeypatch.setattr(agem, "project", spy)
    for i in range(80, 160):
        before = torch.cat([p.detach().reshape(-1) for p in learner.net.params])
        learner.learn_one(Z[i], y[i])
        after = torch.cat([p.detach().reshape(-1) for p in learner.net.params])
        g, g_ref, g_t = calls[-1]
        assert torch.dot(g_t, g_ref) >= -1e-5 * g.norm() * g_ref.norm()
        if torch.dot(g, g_ref) >= 0:
            assert torch.equal(g_t, g)
        if before.shape != after.shape:  # a new class's output unit grew in this call
            continue
        torch.testing.assert_close(after - before, -learner.lr * g_t, rtol=1e-4, atol=1e-7)
    assert learner.n_projected > 0  # conflicts happened and were projected
    assert learner.n_projected == sum(int(torch.dot(g, r) < 0) for g, r, _ in calls)
