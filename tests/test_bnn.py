"""The mean-field Gaussian MLP of ``ciosl.learners.bnn`` against references computed here:
the KL against its formula (float64) and a Monte Carlo estimate, the local reparameterization
against explicit weight sampling, the hand-written backward against autograd, growth, state."""

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ciosl.learners.bnn import BayesMLP, kl_diag_gauss, softplus_inv

torch.set_num_threads(1)  # per-sample sizes: one thread is faster and avoids oversubscription


def make_net(dim=5, n_out=3, hidden=(4, 6), seed=0, init_sigma=0.1, prior_sigma=1.0,
             perturb=True):
    """A small net whose posterior differs from its prior in means and scales."""
    gen = torch.Generator().manual_seed(seed)
    net = BayesMLP(dim, n_out, hidden, init_sigma=init_sigma, prior_sigma=prior_sigma,
                   generator=gen)
    if perturb:
        net.theta[net.P:] += 0.5 * torch.randn(net.P, generator=gen)  # varied scales
        net.set_prior(0.3 * torch.randn(net.P, generator=gen),
                      0.2 + torch.rand(net.P, generator=gen))
    return net


def test_softplus_inverse():
    for s in (1e-4, 1e-3, 0.02, 0.5, 3.0):
        assert F.softplus(torch.tensor(softplus_inv(s), dtype=torch.float64)).item() == \
            pytest.approx(s, rel=1e-12)


def test_kl_equals_formula():
    net = make_net()
    mq = net.mu.double().numpy()
    sq = np.log1p(np.exp(net.rho.double().numpy()))
    mp, sp = net.prior_mu.double().numpy(), net.prior_sigma.double().numpy()
    expected = np.sum(np.log(sp / sq) + (sq ** 2 + (mq - mp) ** 2) / (2 * sp ** 2) - 0.5)
    assert net.kl().item() == pytest.approx(expected, rel=1e-5)


def test_kl_equals_monte_carlo_estimate():
    """KL(q || p) = E_q[log q(theta) - log p(theta)]; 200k draws, tolerance 5 standard errors."""
    net = make_net(dim=3, n_out=2, hidden=(3,))
    gen = torch.Generator().manual_seed(1)
    mq, sq = net.mu.double(), F.softplus(net.rho.double())
    mp, sp = net.prior_mu.double(), net.prior_sigma.double()
    q, p = torch.distributions.Normal(mq, sq), torch.distributions.Normal(mp, sp)
    n = 200_000
    theta = mq + sq * torch.randn(n, len(mq), generator=gen, dtype=torch.float64)
    log_ratio = (q.log_prob(theta) - p.log_prob(theta)).sum(1)  # (n,)
    est, se = log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)
    assert abs(net.kl().item() - est) < 5 * se
    assert se < 0.05 * abs(est)  # the check has teeth


def test_kl_of_q_to_itself_is_zero_with_zero_gradient():
    """The trap: right after prior := posterior, the KL and its gradient are exactly 0."""
    net = make_net()
    net.refresh_prior()
    assert net.kl().item() == 0.0
    _, cache = net.forward_local(torch.randn(2, 5), [torch.randn(2, w) for w in (4, 6, 3)])
    grad = torch.zeros_like(net.theta)
    net.finish_grad(cache, grad, kl_scale=123.0)
    assert torch.count_nonzero(grad) == 0
    mu, rho = net.mu.clone().requires_grad_(), net.rho.clone().requires_grad_()
    kl_diag_gauss(mu, F.softplus(rho), net.prior_mu, net.prior_sigma).backward()
    assert mu.grad.abs().max() == 0 and rho.grad.abs().max() < 1e-6


def test_finish_grad_matches_autograd():
    """[dL/dmu | 2 dL/dvar] + c * KL  ->  [dL/dmu | dL/drho] with the KL gradient, vs autograd."""
    net = make_net()
    gen = torch.Generator().manual_seed(3)
    g_mu, g_var = torch.randn(net.P, generator=gen), torch.randn(net.P, generator=gen)
    c = 0.7
    mu, rho = net.mu.clone().requires_grad_(), net.rho.clone().requires_grad_()
    s = F.softplus(rho)
    obj = (g_mu * mu).sum() + (g_var * s * s).sum() + c * kl_diag_gauss(
        mu, s, net.prior_mu, net.prior_sigma)
    obj.backward()
    _, cache = net.forward_local(torch.randn(2, 5), [torch.randn(2, w) for w in (4, 6, 3)])
    grad = torch.cat([g_mu, 2 * g_var])  # backward's convention: 2 dL/dvar = (dL/dsigma) / sigma
    net.finish_grad(cache, grad, kl_scale=c)
    torch.testing.assert_close(grad[:net.P], mu.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad[net.P:], rho.grad, rtol=1e-5, atol=1e-6)


def reference_local_forward(net, mu, rho, X, eps):
    """Independent autograd version: per layer, mean and variance of the pre-activation."""
    h = X
    L = net.n_layers
    mus, sigmas = net.views(mu), net.views(F.softplus(rho))
    for i in range(L):
        W, b, sW, sb = mus[2 * i], mus[2 * i + 1], sigmas[2 * i], sigmas[2 * i + 1]
        mean = h @ W.T + b
        var = (h ** 2) @ (sW ** 2).T + sb ** 2
        a = mean + var.sqrt() * eps[i]
        h = torch.relu(a) if i < L - 1 else a
    return h


def test_backward_matches_autograd():
    net = make_net()
    gen = torch.Generator().manual_seed(5)
    X = torch.randn(7, 5, generator=gen)
    eps = [torch.randn(7, w, generator=gen) for w in (4, 6, 3)]
    G = torch.randn(7, 3, generator=gen)  # dL/dlogits
    logits, cache = net.forward_local(X, eps)
    mu, rho = net.mu.clone().requires_grad_(), net.rho.clone().requires_grad_()
    ref = reference_local_forward(net, mu, rho, X, eps)
    torch.testing.assert_close(logits, ref.detach(), rtol=1e-5, atol=1e-6)
    (G * ref).sum().backward()
    grad = torch.zeros_like(net.theta)
    net.backward(cache, G, grad)
    net.finish_grad(cache, grad, kl_scale=0.0)
    torch.testing.assert_close(grad[:net.P], mu.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad[net.P:], rho.grad, rtol=1e-4, atol=1e-6)


def test_further_draws_reuse_layer1_moments():
    """draws = (m, j): rows n + i m + r are further draws of input row r < m."""
    net = make_net()
    X = torch.randn(3, 5)
    rows = [0, 1, 2, 0, 1, 0, 1, 0, 1]  # n = 3, then j = 3 draws of rows 0, 1
    eps = [torch.randn(9, w) for w in (4, 6, 3)]
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
    net = make_net(init_sigma=0.3)
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
    eps = [torch.randn(2 * n, w, generator=gen) for w in (4, 6, 3)]
    local = net.forward_local(X, eps, (2, n - 1))[0].view(n, 2, -1)  # (n, 2, C)
    se_mean = ((shared.var(0) + local.var(0)) / n).sqrt()
    assert ((shared.mean(0) - local.mean(0)).abs() < 5 * se_mean).all()
    se_var = (_se_var(shared) ** 2 + _se_var(local) ** 2).sqrt()
    assert ((shared.var(0) - local.var(0)).abs() < 5 * se_var).all()


def test_forward_mean_and_sampled_shapes():
    net = make_net(perturb=False, init_sigma=1e-6)
    X = torch.randn(4, 5)
    out = net.forward_sampled(X, net.sample_weights(3, torch.Generator().manual_seed(0)))
    assert out.shape == (3, 4, 3)
    torch.testing.assert_close(out, net.forward_mean(X).expand(3, 4, 3), rtol=1e-4, atol=1e-4)


def test_grow_keeps_old_rows_and_starts_new_units_from_the_initial_prior():
    net = make_net(prior_sigma=0.5)
    gen = torch.Generator().manual_seed(9)
    old_mu, old_rho = [t.clone() for t in net.views(net.mu)], [
        t.clone() for t in net.views(net.rho)]
    old_pm, old_ps = [t.clone() for t in net.views(net.prior_mu)], [
        t.clone() for t in net.views(net.prior_sigma)]
    buf = torch.randn(2 * net.P, generator=gen)
    old_buf = [t.clone() for t in net.views(buf[:net.P]) + net.views(buf[net.P:])]
    (buf,) = net.grow(2, gen, carry=(buf,))
    assert net.n_out == 5 and buf.shape == net.theta.shape
    new = (net.views(net.mu), net.views(net.rho), net.views(net.prior_mu),
           net.views(net.prior_sigma))
    for olds, news in zip((old_mu, old_rho, old_pm, old_ps), new, strict=True):
        for o, t in zip(olds, news, strict=True):  # hidden layers whole, output rows 0..2
            assert torch.equal(t[:o.shape[0]], o)
    new_buf = net.views(buf[:net.P]) + net.views(buf[net.P:])
    for o, t in zip(old_buf, new_buf, strict=True):
        assert torch.equal(t[:o.shape[0]], o)
        assert torch.count_nonzero(t[o.shape[0]:]) == 0  # new units: zero momentum
    for pm, ps in zip(new[2][-2:], new[3][-2:], strict=True):  # prior N(0, 0.5^2)
        assert torch.count_nonzero(pm[3:]) == 0 and (ps[3:] == 0.5).all()
    s_new = F.softplus(new[1][-2][3:])
    torch.testing.assert_close(s_new, torch.full_like(s_new, 0.1))  # init_sigma
    bound = 1 / math.sqrt(6)  # Linear-style means, fan_in 6
    assert new[0][-2][3:].abs().max() <= bound and new[0][-2][3:].std() > 0.1 * bound
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
    assert other.kl().item() == net.kl().item()
    net.theta += 1.0  # a snapshot, not a view
    assert not torch.equal(other.theta, net.theta)
    with pytest.raises(ValueError, match="parameters"):
        make_net(n_out=4).load(other.state())
