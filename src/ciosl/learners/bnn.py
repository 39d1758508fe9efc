"""Mean-field Gaussian MLP (Bayes by backprop) with a growable output layer: CIOSL's head F(.).

Every weight and bias has a mean mu and a scale sigma = softplus(rho). All means and all rhos
live in ONE flat tensor ``theta = [mu | rho]`` (2P,) and the per-layer tensors are views of it,
so the per-step elementwise work over the ~400k parameters (softplus, KL gradient, SGD) is a
handful of kernels over one contiguous buffer. Gradients are written by a hand-written backward
into a flat buffer of the same layout (no autograd graph in the per-sample step).

Passes:

- ``forward_local``: the local reparameterization trick (Kingma, Salimans & Welling 2015). With
  independent Gaussian weights the pre-activation of a row x is exactly Gaussian, mean
  ``x mu^T + b_mu`` and variance ``x^2 (sigma^2)^T + sigma_b^2``; one draw per row and unit.
  Each row's output has exactly the distribution it has under a weight sample (rows no longer
  share a draw, which changes only the covariance between rows), at the price of two matmuls.
  Optional further rows re-use the layer-1 moments of the first input rows with fresh noise:
  more independent draws of those rows' outputs at no layer-1 cost (CIOSL's uncertainty).
- ``backward``: hand-written, into a flat gradient buffer; ``finish_grad`` adds the chain rule
  through softplus and the closed-form KL gradient.
- ``forward_sampled``: k weight samples shared by all rows, ``(k, n, C)`` (MC predictive).
- ``forward_mean``: the mean weights.

KL: closed form between diagonal Gaussians, ``sum log(s_p/s_q) + (s_q^2 + (m_q - m_p)^2) /
(2 s_p^2) - 1/2``, against a prior that is a pair of flat tensors (means, sigmas) refreshed from
the posterior on demand (``refresh_prior``). Its gradient is written in closed form
(``finish_grad``); with ``r^2 = s_q^2 / s_p^2`` computed by a division, q == prior gives an
exactly zero gradient.

Init (VCL convention): means as ``torch.nn.Linear`` (uniform +-1/sqrt(fan_in)), every scale
``init_sigma`` (small), prior N(0, prior_sigma^2). Growth: a new output unit's posterior is
initialised as a fresh layer's would be (Linear-style means, scale ``init_sigma``) and its prior is
the initial prior N(0, prior_sigma^2) -- our reading of "new units start from the prior": the
prior term of the new unit is the initial prior; its posterior starts where a freshly built
layer's posterior starts (a posterior equal to N(0, 1) would make the head useless). Nothing
already learned moves: old rows of mu, rho, prior and any carried buffer (momentum) are copied
bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ciosl.learners.head import HIDDEN, MLP

_MINUS_ONE = torch.tensor(-1.0)


def softplus_inv(sigma: float) -> float:
    """rho with softplus(rho) == sigma."""
    return sigma + math.log(-math.expm1(-sigma))


def kl_diag_gauss(mq: torch.Tensor, sq: torch.Tensor, mp: torch.Tensor,
                  sp: torch.Tensor) -> torch.Tensor:
    """sum_i KL(N(mq_i, sq_i^2) || N(mp_i, sp_i^2)), differentiable."""
    return (torch.log(sp / sq) + (sq * sq + (mq - mp) ** 2) / (2 * sp * sp) - 0.5).sum()


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@dataclass
class LocalCache:
    """What ``backward`` and ``finish_grad`` need from ``forward_local`` (first n rows).
    Scales are kept negated, as computed: -sigma = log1p(-sigmoid(rho))."""
    neg_s: torch.Tensor  # (P,) -sigma
    neg_sig: torch.Tensor  # (P,) -sigmoid(rho) = -dsigma/drho
    var: torch.Tensor  # (P,) sigma^2
    v: list[torch.Tensor]  # per-tensor views of var
    layers: list[tuple[torch.Tensor, ...]] = field(default_factory=list)  # (H, H^2, S, E)


class BayesMLP:
    """Gaussian mean-field MLP dim -> hidden... -> n_out (ReLU), flat parameters."""

    def __init__(self, dim: int, n_out: int, hidden: tuple[int, ...] = HIDDEN, *,
                 init_sigma: float = 1e-3, prior_sigma: float = 1.0,
                 generator: torch.Generator):
        self.init_sigma, self.prior_sigma0 = float(init_sigma), float(prior_sigma)
        self.rho0 = softplus_inv(self.init_sigma)
        sizes = [dim, *hidden, n_out]
        self.shapes: list[tuple[int, ...]] = []
        means: list[torch.Tensor] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            self.shapes += [(fan_out, fan_in), (fan_out,)]
            means += MLP._layer(fan_in, fan_out, generator)
        mu = torch.cat([m.reshape(-1) for m in means])  # (P,)
        self._set(torch.cat([mu, torch.full_like(mu, self.rho0)]), torch.zeros_like(mu),
                  torch.full_like(mu, self.prior_sigma0))

    # ------------------------------------------------------------------ layout
    @property
    def n_layers(self) -> int:
        return len(self.shapes) // 2

    @property
    def n_out(self) -> int:
        return self.shapes[-1][0]

    @property
    def P(self) -> int:
        return self.mu.numel()

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Per-tensor views [W1, b1, W2, b2, ...] of a flat (P,) tensor."""
        out, o = [], 0
        for s in self.shapes:
            n = _numel(s)
            out.append(flat[o:o + n].view(s))
            o += n
        return out

    def _set(self, theta: torch.Tensor, prior_mu: torch.Tensor, prior_sigma: torch.Tensor):
        P = prior_mu.numel()
        self.theta = theta  # (2P,) [mu | rho]
        self.mu, self.rho = theta[:P], theta[P:]  # (P,) views
        self.mu_l = self.views(self.mu)
        self.set_prior(prior_mu, prior_sigma)
        self._scratch = torch.empty(4, P)  # (4, P) -sigma, -sigmoid, sigma^2, tmp of a step
        self._var_views = self.views(self._scratch[2])
        self._grad_views: tuple = (None,)

    def set_prior(self, prior_mu: torch.Tensor, prior_sigma: torch.Tensor) -> None:
        self.prior_mu, self.prior_sigma = prior_mu, prior_sigma  # (P,), (P,)
        self._prior_var = prior_sigma * prior_sigma  # (P,) cached for the step

    def refresh_prior(self) -> None:
        """prior := current posterior (means and sigmas copied)."""
        self.set_prior(self.mu.detach().clone(), self.sigma())

    def sigma(self) -> torch.Tensor:
        """softplus(rho) (P,), computed as in the step (so a refreshed prior matches it)."""
        return self._neg_scales(torch.empty(2, self.P))[0].neg_()

    def _neg_scales(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(-softplus(rho), -sigmoid(rho)) written into ``out`` (2, P). While every rho <= 0
        (sigma < log 2, the normal case) -softplus(rho) = log1p(-sigmoid(rho)) to 1e-6
        relative: one transcendental pass instead of two, and the signs cost no pass."""
        neg_s, neg_sig = out
        torch.sigmoid(self.rho, out=neg_sig).neg_()
        if self.rho.max() <= 0:
            torch.log1p(neg_sig, out=neg_s)
        else:
            torch.neg(F.softplus(self.rho), out=neg_s)
        return neg_s, neg_sig

    # ------------------------------------------------------------------ KL
    def kl(self) -> torch.Tensor:
        """KL(q || prior), a scalar."""
        return kl_diag_gauss(self.mu, self.sigma(), self.prior_mu, self.prior_sigma)

    # ------------------------------------------------------------------ forward passes
    def forward_mean(self, X: torch.Tensor) -> torch.Tensor:
        """(n, d) -> (n, C) with the mean weights."""
        h = X
        for i in range(self.n_layers):
            h = F.linear(h, self.mu_l[2 * i], self.mu_l[2 * i + 1])
            if i < self.n_layers - 1:
                h = F.relu(h)
        return h

    def sample_weights(self, k: int, gen: torch.Generator) -> list[torch.Tensor]:
        """k weight samples per tensor: [(k, *shape) for each W, b]."""
        s_l = self.views(self.sigma())
        return [m + s * torch.randn((k, *m.shape), generator=gen)
                for m, s in zip(self.mu_l, s_l, strict=True)]

    def forward_sampled(self, X: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
        """(n, d) with k shared weight samples (``sample_weights``) -> (k, n, C)."""
        k = weights[0].shape[0]
        h = X.expand(k, *X.shape)  # (k, n, d)
        for i in range(self.n_layers):
            W, b = weights[2 * i], weights[2 * i + 1]  # (k, out, in), (k, out)
            h = torch.baddbmm(b[:, None, :], h, W.transpose(1, 2))  # (k, n, out)
            if i < self.n_layers - 1:
                h = h.relu_()
        return h

    def forward_local(self, X: torch.Tensor, eps: list[torch.Tensor],
                      draws: tuple[int, int] = (0, 0)) -> tuple[torch.Tensor, LocalCache]:
        """Local-reparameterization forward of X (n, d) with noise ``eps[l]`` (R, out_l),
        R = n + m j for ``draws = (m, j)``: rows n + i m + r (i < j, r < m) are j further
        independent draws of rows r < m that reuse their layer-1 moments. Returns the logits
        (R, C) and the cache for ``backward`` (rows :n), valid until the next call (it uses
        the net's scratch buffers)."""
        n, (m, j) = X.shape[0], draws
        neg_s, neg_sig = self._neg_scales(self._scratch[:2])  # (P,), (P,)
        var = torch.mul(neg_s, neg_s, out=self._scratch[2])  # (P,) sigma^2
        v = self._var_views
        cache = LocalCache(neg_s, neg_sig, var, v)
        h = X
        for i in range(self.n_layers):
            h2 = h * h
            M = torch.addmm(self.mu_l[2 * i + 1], h, self.mu_l[2 * i].t())  # (., out) mean
            S = torch.addmm(v[2 * i + 1], h2, v[2 * i].t()).sqrt_()  # (., out) std
            if i == 0 and j:
                A = M.new_empty(n + m * j, M.shape[1])  # (R, out)
                torch.addcmul(M, S, eps[0][:n], out=A[:n])
                torch.addcmul(M[:m].expand(j, m, -1), S[:m].expand(j, m, -1),
                              eps[0][n:].view(j, m, -1), out=A[n:].view(j, m, -1))
            else:
                A = torch.addcmul(M, S, eps[i])  # (R, out) one draw per row
            cache.layers.append((h[:n], h2[:n], S[:n], eps[i][:n]))
            h = A.relu_() if i < self.n_layers - 1 else A
        return h, cache

    def backward(self, cache: LocalCache, g: torch.Tensor, grad: torch.Tensor) -> None:
        """Write dL/dmu into grad[:P] and 2 dL/d(sigma^2) = (dL/dsigma) / sigma into grad[P:],
        given g = dL/dlogits (n, C) of the rows of ``forward_local``'s cache."""
        if self._grad_views[0] is not grad:  # views of the last buffer seen, reused
            self._grad_views = (grad, self.views(grad[:self.P]), self.views(grad[self.P:]))
        _, gm, gv = self._grad_views
        for i in reversed(range(self.n_layers)):
            h, h2, S, E = cache.layers[i]
            gV = torch.mul(g, E).div_(S)  # (n, out) 2 dL/dvar, as dA/dvar = E / (2 S)
            torch.mm(g.t(), h, out=gm[2 * i])
            torch.sum(g, 0, out=gm[2 * i + 1])
            torch.mm(gV.t(), h2, out=gv[2 * i])
            torch.sum(gV, 0, out=gv[2 * i + 1])
            if i:  # dL/dh = g W_mu + 2 h (dL/dvar W_var), through the ReLU
                g = torch.addcmul(g.mm(self.mu_l[2 * i]), gV.mm(cache.v[2 * i]), h)
                g = torch.ops.aten.threshold_backward(g, h, 0.0)  # 0 where h <= 0

    def finish_grad(self, cache: LocalCache, grad: torch.Tensor, kl_scale: float) -> None:
        """Turn ``backward``'s [dL/dmu | (dL/dsigma) / sigma] into [dL/dmu | dL/drho] and add
        the gradient of ``kl_scale * KL(q || prior)``:
        dKL/dmu = (mu - m_p) / s_p^2, dKL/dsigma = (r^2 - 1) / sigma with r^2 = sigma^2 / s_p^2
        (a division, so that q == prior gives exactly r^2 = 1 and a zero gradient).
        Six passes over (P,); the signs of the cached -sigma, -sigmoid cancel."""
        P = self.P
        gmu, grho = grad[:P], grad[P:]
        grho.mul_(cache.neg_s)  # -dL/dsigma
        if kl_scale:
            tmp = self._scratch[3]
            gmu.addcdiv_(torch.sub(self.mu, self.prior_mu, out=tmp), self._prior_var,
                         value=kl_scale)
            q = torch.addcdiv(_MINUS_ONE, cache.var, self._prior_var, out=tmp)  # r^2 - 1
            grho.addcdiv_(q, cache.neg_s, value=kl_scale)  # -(dL + c dKL)/dsigma
        grho.mul_(cache.neg_sig)  # * dsigma/drho

    # ------------------------------------------------------------------ growth and state
    def grow(self, n_new: int, generator: torch.Generator,
             carry: tuple[torch.Tensor | None, ...] = ()) -> list[torch.Tensor | None]:
        """Add ``n_new`` output units. ``carry``: other (2P,) tensors in theta's layout
        (momentum buffers) to grow with zeros. Returns them grown."""
        old = list(self.shapes)
        fan_in = self.shapes[-2][1]
        Wn, bn = MLP._layer(fan_in, n_new, generator)  # Linear-style means of the new units
        P, n_out = self.P, self.n_out + n_new
        self.shapes[-2:] = [(n_out, fan_in), (n_out,)]

        def grown(flat: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            n_W, n_b = _numel(old[-2]), _numel(old[-1])  # the output layer is last
            head, Wo, bo = flat.split([flat.numel() - n_W - n_b, n_W, n_b])
            return torch.cat([head, Wo, W.reshape(-1), bo, b.reshape(-1)])

        def full(v: float) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.full((n_new, fan_in), v), torch.full((n_new,), v)

        def grown2(flat: torch.Tensor, mu_new, rho_new) -> torch.Tensor:
            return torch.cat([grown(flat[:P], *mu_new), grown(flat[P:], *rho_new)])

        zeros = full(0.0)
        out = [None if c is None else grown2(c, zeros, zeros) for c in carry]
        theta = grown2(self.theta.detach(), (Wn, bn), full(self.rho0))
        self._set(theta, grown(self.prior_mu, *zeros),
                  grown(self.prior_sigma, *full(self.prior_sigma0)))
        return out

    def state(self) -> dict[str, torch.Tensor]:
        return {"theta": self.theta.detach().clone(), "prior_mu": self.prior_mu.clone(),
                "prior_sigma": self.prior_sigma.clone()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        if state["theta"].shape != self.theta.shape:
            raise ValueError(f"BNN state of {state['theta'].numel() // 2} parameters given to a "
                             f"network of {self.P}")
        self._set(state["theta"].clone(), state["prior_mu"].clone(),
                  state["prior_sigma"].clone())
