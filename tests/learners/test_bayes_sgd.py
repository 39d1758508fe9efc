"""The Bayesian head's momentum step (``bayes_head.FlatSGD.step_net``) and the MLP heads'
(``head.SGD.step``) write new tensors with the bits of the in-place steps before the state
rule: torch's fused CPU SGD kernel on the whole vector (an out-of-place rewrite must match its
vector loop and its scalar loop, which the compiler rounds differently) and
``buf.mul(m).add_(d)`` (docs/findings/state-rule.md). The inputs are left as they were."""

import pytest
import torch

from ciosl.learners.bayes_head import FlatSGD
from ciosl.learners.bnn import BayesMLP
from ciosl.learners.head import SGD

torch.set_num_threads(1)


def _fused(p, g, buf, *, lr, momentum, weight_decay):
    """The step before the state rule, on copies: torch's fused kernel (a zero momentum on the
    first step: m * 0 + d), or at momentum 0, which it takes no buffer for, head.SGD's."""
    p, buf = p.clone(), torch.zeros_like(p) if buf is None else buf.clone()
    if not momentum:
        d = g.add(p, alpha=weight_decay) if weight_decay else g
        buf.mul_(momentum).add_(d)
        return p.sub_(buf, alpha=lr), buf
    torch._fused_sgd_([p], [g], [buf], weight_decay=weight_decay, momentum=momentum, lr=lr,
                      dampening=0.0, nesterov=False, maximize=False, is_first_step=False)
    return p, buf


@pytest.mark.parametrize("dim", [5, 37, 1280])  # P's tail past the vector width differs
@pytest.mark.parametrize("weight_decay", [0.0, 1e-5, 0.3])
@pytest.mark.parametrize("momentum", [0.9, 0.5, 0.0])
def test_flat_step_has_the_fused_kernels_bits(dim, weight_decay, momentum):
    gen = torch.Generator().manual_seed(dim)
    net = BayesMLP(dim, 3, (16, 8), generator=gen)
    opt = FlatSGD(net, lr=0.01, momentum=momentum, weight_decay=weight_decay)
    g0 = torch.randn(net.P, generator=gen)
    g0[::7] = -0.0  # exact zeros and negative zeros: the first step's m * 0 + d gives +0
    for step in range(4):
        grad = g0 * (step + 1) if step else g0.clone()
        mu, buf = net.mu, opt.buffers[0]
        mu_before = mu.clone()
        buf_before = None if buf is None else buf.clone()
        want_mu, want_buf = _fused(mu, grad, buf, lr=0.01, momentum=momentum,
                                   weight_decay=weight_decay)
        opt.step_net(net, grad)
        assert torch.equal(net.mu, want_mu) and torch.equal(opt.buffers[0], want_buf)
        assert torch.equal(want_buf.signbit(), opt.buffers[0].signbit())
        assert net.mu is not mu and opt.buffers[0] is not buf  # replaced
        assert torch.equal(mu, mu_before)  # the old tensors are not written
        assert buf is None or torch.equal(buf, buf_before)


@pytest.mark.parametrize("weight_decay", [0.0, 1e-4])
def test_mlp_step_has_the_in_place_steps_bits(weight_decay):
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(33, 17, generator=gen), torch.randn(33, generator=gen)]
    opt = SGD(params, lr=0.05, momentum=0.9, weight_decay=weight_decay)
    bufs = [None, None]
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        want = []
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            d = g.add(p, alpha=weight_decay) if weight_decay else g
            b = torch.zeros_like(p) if bufs[i] is None else bufs[i]
            bufs[i] = b.mul(0.9).add_(d)
            want.append(p.sub(bufs[i], alpha=0.05))
        params = opt.step(params, [g.clone() for g in grads])
        for got, w, b, ob in zip(params, want, bufs, opt.buffers, strict=True):
            assert torch.equal(got, w) and torch.equal(ob, b)
