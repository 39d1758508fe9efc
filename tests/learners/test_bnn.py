"""The mean-field Gaussian MLP of ``ciosl.learners.bnn`` against references computed here:
the KL against its formula (float64) and a Monte Carlo estimate, its mean-gradient against
autograd, the local reparameterization against explicit weight sampling, the hand-written
backward and the Fisher estimate against autograd, the precision's fixed-point form, growth,
state."""

import io
import math

import numpy as np
import pytest
import torch

from ciosl.learners.bnn import BayesMLP, kl_diag_gauss

torch.set_num_threads(1)  # per-sample sizes: one thread is faster and avoids oversubscription

HID = (4, 6)


def make_net(dim=5, n_out=3, hidden=HID, seed=0, prior_scale=1.0, perturb=True):
    """A small net whose posterior differs from its prior in means and scales."""
    gen = torch.Generator().manual_seed(seed)
    net = BayesMLP(dim, n_out, hidden, prior_scale=prior_scale, generator=gen)
    if perturb:
        net.fisher += torch.rand(net.P, generator=gen)  # varied scales
        net.fisher_steps, net.evidence = 1_000_000, 30.0
        net.set_prior(0.3 * torch.randn(net.P, generator=gen),
                      1.0 / (0.2 + torch.rand(net.P, generator=gen)) ** 2)
    return net


def noise(rows, gen=None, widths=(4, 6, 3)):
    return [torch.randn(rows, w, generator=gen) for w in widths]


def test_prior_is_the_fan_in_scale_and_precision_is_prior_plus_evidence_times_fisher():
    net = make_net(prior_scale=2.0, perturb=False)
    for t, fan_in in zip(net.views(net.prec0), (5, 5, 4, 4, 6, 6), strict=True):
        assert (t == fan_in / 4.0).all()
    torch.testing.assert_close(net.sigma(), net.prec0.rsqrt())  # no data: sigma = prior
    net.fisher += 0.5
    net.fisher_steps, net.evidence = 1, 10.0  # one EMA step of rate d holds d * estimate
    torch.testing.assert_close(net.precision(), net.prec0 + 10.0 * 0.5 / net.fisher_decay)


@pytest.mark.parametrize("prior_scale", [1.0, 0.3])
def test_precision_into_a_buffer_is_the_formula_bit_for_bit(prior_scale):
    """The step's precision (into its scratch buffer) is exactly pi_0 + E Fbar, and the same
    as without a buffer, after growth too."""
    net = make_net(prior_scale=prior_scale)
    gen = torch.Generator().manual_seed(3)
    for _ in range(2):
        out = torch.full((net.P,), float("nan"))
        assert net.precision(out=out) is out
        expected = torch.add(net.prec0, net.fisher, alpha=net._fisher_weight())
        assert torch.equal(out, expected) and torch.equal(net.precision(), expected)
        net.grow(2, gen)
        net.fisher += torch.rand(net.P, generator=gen)


def test_kl_equals_formula():
    net = make_net()
    mq, sq = net.mu.double().numpy(), net.precision().double().rsqrt().numpy()
    mp, sp = net.prior_mu.double().numpy(), net.prior_prec.double().rsqrt().numpy()
    expected = np.sum(np.log(sp / sq) + (sq ** 2 + (mq - mp) ** 2) / (2 * sp ** 2) - 0.5)
    assert net.kl().item() == pytest.approx(expected, rel=1e-5)


def test_kl_equals_monte_carlo_estimate():
    """KL(q || p) = E_q[log q(theta) - log p(theta)]; 200k draws, tolerance 5 standard errors."""
    net = make_net(dim=3, n_out=2, hidden=(3,))
    gen = torch.Generator().manual_seed(1)
    mq, sq = net.mu.double(), net.sigma().double()
    mp, sp = net.prior_mu.double(), net.prior_sigma.double()
    q, p = torch.distributions.Normal(mq, sq), torch.distributions.Normal(mp, sp)
    n = 200_000
    theta = mq + sq * torch.randn(n, len(mq), generator=gen, dtype=torch.float64)
    log_ratio = (q.log_prob(theta) - p.log_prob(theta)).sum(1)  # (n,)
    est, se = log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)
    assert abs(net.kl().item() - est) < 5 * se
    assert se < 0.05 * abs(est)  # the check has teeth


def test_kl_mean_gradient_matches_autograd_and_is_zero_after_refresh():
    net = make_net()
    mu = net.mu.clone().requires_grad_()
    kl_diag_gauss(mu, net.sigma(), net.prior_mu, net.prior_sigma).backward()
    grad = torch.zeros(net.P)
    net.add_kl_grad(grad, kl_scale=0.7)
    torch.testing.assert_close(grad, 0.7 * mu.grad, rtol=1e-5, atol=1e-6)
    net.refresh_prior()  # the trap: prior := posterior gives exactly 0
    assert net.kl().abs().item() < 1e-3
    grad.zero_()
    net.add_kl_grad(grad, kl_scale=123.0)
    assert torch.count_nonzero(grad) == 0
    torch.testing.assert_close(net.prior_sigma, net.sigma())


def reference_local_forward(net, mu, X, eps, detach_std=False):
    """Independent autograd version: per layer, mean and variance of the pre-activation."""
    h = X
    L = net.n_layers
    mus, sigmas = net.views(mu), net.views(net.sigma())
    for i in range(L):
        W, b, sW, sb = mus[2 * i], mus[2 * i + 1], sigmas[2 * i], sigmas[2 * i + 1]
        std = ((h ** 2) @ (sW ** 2).T + sb ** 2).sqrt()
        a = h @ W.T + b + (std.detach() if detach_std else std) * eps[i]
        h = torch.relu(a) if i < L - 1 else a
    return h


def test_backward_matches_autograd():
    net = make_net()
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(7, 5, generator=gen)
    eps = noise(7, gen)
    G = torch.randn(7, 3, generator=gen)  # dL/dlogits
    logits, cache = net.forward_local(X, eps)
    mu = net.mu.clone().requires_grad_()
    ref = reference_local_forward(net, mu, X, eps)
    torch.testing.assert_close(logits, ref.detach(), rtol=1e-5, atol=1e-6)
    (G * ref).sum().backward()
    grad = torch.zeros(net.P)
    net.backward(cache, G, grad)
    torch.testing.assert_close(grad, mu.grad, rtol=1e-4, atol=1e-6)


def reference_fisher(net, X, eps, G):
    """mean_r (d(G_r . f_r)/dmu)^2 under the net's current scales, per row by autograd."""
    out = torch.zeros(net.P)
    for r in range(len(X)):
        mu = net.mu.clone().requires_grad_()
        (G[r] * reference_local_forward(net, mu, X, eps, detach_std=True)[r]).sum().backward()
        out += mu.grad ** 2 / len(X)
    return out


def test_fisher_estimate_is_the_mean_of_per_row_squared_gradients():
    """accumulate_fisher folds mean_r (d(G_r . f_r)/dmu)^2 into the EMA, f through the mean
    path of this draw (the draw's std held fixed), per row by autograd here."""
    net = make_net(perturb=False)
    gen = torch.Generator().manual_seed(6)
    X, eps, G = torch.randn(4, 5, generator=gen), noise(4, gen), torch.randn(4, 3, generator=gen)
    _, cache = net.forward_local(X, eps)
    expected = reference_fisher(net, X, eps, G)
    net.accumulate_fisher(cache, G)
    assert net.fisher_steps == 1
    torch.testing.assert_close(net.fisher, net.fisher_decay * expected, rtol=1e-4, atol=1e-9)
    net.evidence = 8.0
    torch.testing.assert_close(net.precision(), net.prec0 + 8.0 * expected, rtol=1e-4, atol=1e-6)
    # a second step is an exponential moving average: keep the old estimate, add the new one
    before, G2 = net.fisher.clone(), 3.0 * G.flip(0)
    _, cache = net.forward_local(X, eps)  # the draw's std under the new scales
    new = reference_fisher(net, X, eps, G2)
    net.accumulate_fisher(cache, G2)
    d = net.fisher_decay
    torch.testing.assert_close(net.fisher, (1 - d) * before + d * new, rtol=1e-4, atol=1e-9)
    assert net.fisher_steps == 2


def test_fisher_decay_zero_is_the_mean_of_every_update_and_forgets_nothing():
    """fisher_decay = 0: Fbar is the plain mean of the step estimates (rate 1 / t), the limit
    of the bias-corrected EMA as its rate goes to 0, so evidence * Fbar is the sum of the
    per-sample curvature seen: an estimate that shrinks later (a model grown confident) adds
    less, but never takes back what earlier steps taught."""
    gen = torch.Generator().manual_seed(3)
    net = BayesMLP(5, 3, HID, fisher_decay=0.0, generator=gen)
    X = torch.randn(4, 5, generator=gen)
    estimates = []
    for scale in (3.0, 1.0, 0.01, 0.0):  # the curvature the steps see falls to nothing
        eps, G = noise(4, gen), scale * torch.randn(4, 3, generator=gen)
        _, cache = net.forward_local(X, eps)
        estimates.append(reference_fisher(net, X, eps, G))
        before = net.precision().clone() if len(estimates) > 1 else None
        net.evidence = float(len(estimates))  # one sample per step, temperature 1
        net.accumulate_fisher(cache, G)
        mean = torch.stack(estimates).mean(0)
        torch.testing.assert_close(net.fisher, mean, rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(net.precision(), net.prec0 + net.evidence * mean,
                                   rtol=1e-4, atol=1e-6)
        if before is not None:  # the precision is the prior plus a sum: it never falls
            assert (net.precision() >= before * (1 - 1e-5)).all()
    assert net.fisher_steps == 4


def test_scales_stay_at_the_prior_for_a_constant_input_and_shrink_for_a_varying_one():
    net = make_net(perturb=False)
    gen = torch.Generator().manual_seed(8)
    for _ in range(50):
        X = torch.randn(6, 5, generator=gen)
        X[:, 2] = 0.0  # input 2 never varies (standardised constant)
        _, cache = net.forward_local(X, noise(6, gen))
        P = torch.softmax(torch.randn(6, 3, generator=gen), 1)
        G = P - torch.eye(3)[torch.multinomial(P, 1, generator=gen)[:, 0]]
        net.accumulate_fisher(cache, G)
    net.evidence = 10_000.0
    s, s0 = net.views(net.sigma())[0], net.views(net.prec0.rsqrt())[0]  # W1 (4, 5)
    assert torch.equal(s[:, 2], s0[:, 2])
    alive = s[:, [0, 1, 3, 4]]
    assert (alive <= s0[:, [0, 1, 3, 4]]).all() and alive.median() < 0.5 * s0[0, 0]


def test_further_draws_reuse_layer1_moments():
    """draws = (m, j): rows n + i m + r are further draws of input row r < m."""
    net = make_net()
    X = torch.randn(3, 5)
    rows = [0, 1, 2, 0, 1, 0, 1, 0, 1]  # n = 3, then j = 3 draws of rows 0, 1
    eps = noise(9)
    out, _ = net.forward_local(X, eps, (2, 3))
    for i, r in enumerate(rows):
        alone, _ = net.forward_local(X[r:r + 1], [e[i:i + 1] for e in eps])
        torch.testing.assert_close(out[i:i + 1], alone, rtol=1e-5, atol=1e-6)


def _se_var(a: torch.Tensor) -> torch.Tensor:
    """Standard error of the sample variance along dim 0 (from the 4th central moment)."""
    c = a - a.mean(0)
    return ((c ** 4).mean(0) - (c ** 2).mean(0) ** 2).clamp_min(0).sqrt() / math.sqrt(len(a))


def test_local_reparameterization_matches_weight_sampling():
    """Layer 1: the local pre-activation moments equal those of explicit weight samples; the
    whole net: each row's logits have the same mean and variance under both (MC, 5 SE)."""
    net = make_net(perturb=False, prior_scale=0.7)
    gen = torch.Generator().manual_seed(7)
    X = torch.randn(2, 5, generator=gen)
    n = 40_000
    W = net.sample_weights(n, gen)  # [(n, out, in), (n, out), ...]
    pre = torch.einsum("ki,noi->nko", X, W[0]) + W[1][:, None, :]  # (n, 2, 4)
    mu_l, s_l = net.views(net.mu), net.views(net.sigma())
    mean = X @ mu_l[0].T + mu_l[1]
    var = (X ** 2) @ (s_l[0] ** 2).T + s_l[1] ** 2
    assert ((pre.mean(0) - mean).abs() < 5 * (var / n).sqrt()).all()
    assert ((pre.var(0) - var).abs() < 5 * _se_var(pre)).all()

    shared = net.forward_sampled(X, W)  # (n, 2, C)
    local = net.forward_local(X, noise(2 * n, gen), (2, n - 1))[0].view(n, 2, -1)  # (n, 2, C)
    se_mean = ((shared.var(0) + local.var(0)) / n).sqrt()
    assert ((shared.mean(0) - local.mean(0)).abs() < 5 * se_mean).all()
    se_var = (_se_var(shared) ** 2 + _se_var(local) ** 2).sqrt()
    assert ((shared.var(0) - local.var(0)).abs() < 5 * se_var).all()


def test_forward_mean_and_sampled_shapes():
    net = make_net(perturb=False, prior_scale=1e-6)
    X = torch.randn(4, 5)
    out = net.forward_sampled(X, net.sample_weights(3, torch.Generator().manual_seed(0)))
    assert out.shape == (3, 4, 3)
    torch.testing.assert_close(out, net.forward_mean(X).expand(3, 4, 3), rtol=1e-4, atol=1e-4)


def test_grow_keeps_old_rows_and_starts_new_units_from_the_initial_prior():
    net = make_net(prior_scale=0.5)
    gen = torch.Generator().manual_seed(9)
    tensors = ("mu", "fisher", "prior_mu", "prior_prec")
    old = {k: [t.clone() for t in net.views(getattr(net, k))] for k in tensors}
    buf = torch.randn(net.P, generator=gen)
    old_buf = [t.clone() for t in net.views(buf)]
    (buf,) = net.grow(2, gen, carry=(buf,))
    assert net.n_out == 5 and buf.shape == net.mu.shape
    for k in tensors:  # hidden layers whole, output rows 0..2
        for o, t in zip(old[k], net.views(getattr(net, k)), strict=True):
            assert torch.equal(t[:o.shape[0]], o), k
    for o, t in zip(old_buf, net.views(buf), strict=True):
        assert torch.equal(t[:o.shape[0]], o)
        assert torch.count_nonzero(t[o.shape[0]:]) == 0  # new units: zero momentum
    fan_in = 6
    for k in ("fisher", "prior_mu"):
        assert all(torch.count_nonzero(t[3:]) == 0 for t in net.views(getattr(net, k))[-2:])
    for t in net.views(net.prior_prec)[-2:] + net.views(net.sigma())[-2:]:
        assert torch.allclose(t[3:], torch.full_like(t[3:], t[3:].flatten()[0]))
    assert (net.views(net.prior_prec)[-2][3:] == fan_in / 0.25).all()
    torch.testing.assert_close(net.views(net.sigma())[-2][3:],
                               torch.full((2, fan_in), 0.5 / math.sqrt(fan_in)))  # the prior's
    bound = 1 / math.sqrt(fan_in)  # Linear-style means
    new_W = net.views(net.mu)[-2][3:]
    assert new_W.abs().max() <= bound and new_W.std() > 0.1 * bound
    assert net.kl().item() > 0  # and the network still works
    assert net.forward_mean(torch.randn(2, 5)).shape == (2, 5)


def test_grow_from_zero_outputs():
    net = BayesMLP(4, 0, (3,), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        net.grow(1, torch.Generator().manual_seed(1))
    assert net.n_out == 3 and net.forward_mean(torch.randn(2, 4)).shape == (2, 3)


def test_state_round_trip():
    net = make_net()
    buf = io.BytesIO()
    torch.save(net.state(), buf)
    buf.seek(0)
    other = make_net(seed=1, perturb=False)
    other.load(torch.load(buf, weights_only=True))
    X = torch.randn(3, 5)
    assert torch.equal(other.forward_mean(X), net.forward_mean(X))
    assert torch.equal(other.sigma(), net.sigma())
    assert other.kl().item() == net.kl().item()
    net.mu += 1.0  # a snapshot, not a view
    net.fisher += 1.0
    assert not torch.equal(other.mu, net.mu) and not torch.equal(other.fisher, net.fisher)
    with pytest.raises(ValueError, match="parameters"):
        make_net(n_out=4).load(other.state())
