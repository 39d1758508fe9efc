"""Mean-field Gaussian MLP with a growable output layer: CIOSL's head F(.), with posterior
scales inferred from the data's curvature.

Every weight and bias has a mean mu and a precision pi = 1 / sigma^2. The means are flat
parameters ``mu`` (P,) trained by the learner's optimizer; per-tensor views ``mu_l`` follow the
layout [W1, b1, W2, b2, ...], the output layer last. The precisions are not gradient
parameters: they follow the natural-gradient (Bayesian learning rule / VOGN) fixed point

    pi = pi_0 + E * Fbar

with ``pi_0`` the initial prior's precision, ``Fbar`` a running average of the diagonal Fisher
of the per-sample likelihood (labels drawn from the model's own predictive) and ``E`` the
evidence (samples seen / temperature). So each weight's scale is learned from the data.

Passes: ``forward_local`` (local reparameterization), ``backward`` (hand-written gradient of
the means), ``accumulate_fisher``, ``add_kl_grad`` (pi_p (mu - m_p)), ``forward_sampled`` (k
weight samples), ``forward_mean``. KL: closed form between diagonal Gaussians, against a prior
refreshed from the posterior on demand (``refresh_prior``).

State (docs/design.md): every flat vector (mu, Fbar, the prior's means and precisions, pi_0)
is a (P,) tensor that a step replaces, never writes in place; a refresh of the prior is a
reference to the means. A new output unit makes new vectors (one concatenation each, O(P)).
The step's temporaries (sigma^2, the KL's difference, the gradient) are rows of one work buffer,
each written whole before it is read: scratch, not state.

Design rationale: docs/findings/bayesian-head.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ciosl.learners.head import HIDDEN, MLP


def kl_diag_gauss(mq: torch.Tensor, sq: torch.Tensor, mp: torch.Tensor,
                  sp: torch.Tensor) -> torch.Tensor:
    """sum_i KL(N(mq_i, sq_i^2) || N(mp_i, sp_i^2)), differentiable."""
    return (torch.log(sp / sq) + (sq * sq + (mq - mp) ** 2) / (2 * sp * sp) - 0.5).sum()


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


@dataclass
class LocalCache:
    """What ``backward`` and ``accumulate_fisher`` need from ``forward_local`` (first n rows)."""
    v: list[torch.Tensor]  # per-tensor views of sigma^2
    layers: list[tuple[torch.Tensor, ...]] = field(default_factory=list)  # (H, H^2, S, E)


class BayesMLP:
    """Gaussian mean-field MLP dim -> hidden... -> n_out (ReLU), flat parameters."""

    def __init__(self, dim: int, n_out: int, hidden: tuple[int, ...] = HIDDEN, *,
                 prior_scale: float = 1.0, fisher_decay: float = 0.01,
                 precision_floor: bool = False, generator: torch.Generator):
        self.prior_scale, self.fisher_decay = float(prior_scale), float(fisher_decay)
        self.precision_floor = bool(precision_floor)
        sizes = [dim, *hidden, n_out]
        self.shapes: list[tuple[int, ...]] = []
        means: list[torch.Tensor] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            self.shapes += [(fan_out, fan_in), (fan_out,)]
            means += MLP._layer(fan_in, fan_out, generator)
        mu = torch.cat([m.reshape(-1) for m in means])  # (P,)
        self._set(mu, torch.zeros_like(mu), 0, 0.0, torch.zeros_like(mu), self._prec0())

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

    def _prec0(self) -> torch.Tensor:
        """(P,) precision of the initial prior: fan_in / s^2 for every weight and bias of a
        layer (the variance s^2 / fan_in keeps a pre-activation's prior variance ~ s^2)."""
        parts = []
        for i in range(self.n_layers):
            (fan_out, fan_in), n_b = self.shapes[2 * i], _numel(self.shapes[2 * i + 1])
            parts.append(torch.full((fan_out * fan_in + n_b,), fan_in / self.prior_scale ** 2))
        return torch.cat(parts)

    def _set(self, mu: torch.Tensor, fisher: torch.Tensor, fisher_steps: int, evidence: float,
             prior_mu: torch.Tensor, prior_prec: torch.Tensor) -> None:
        """The state from (P,) tensors (copied)."""
        self.mu, self.fisher = mu.detach().clone(), fisher.detach().clone()
        self.prec0 = self._prec0()  # (P,)
        self.fisher_steps = int(fisher_steps)
        self.evidence = float(evidence)  # samples / temperature the posterior accounts for
        self._work = torch.empty(0, 0)
        self.set_prior(prior_mu.detach().clone(), prior_prec.detach().clone())

    def _sync(self) -> None:
        """The per-tensor views of the flat vectors, and the work buffer's rows (grown by
        capacity doubling with the output layer)."""
        self.mu_l = self.views(self.mu)  # the means, the optimizer's parameter
        self._fisher_views = self.views(self.fisher)  # EMA of the per-sample Fisher
        P = self.P
        if self._work.shape[1] < P:  # (3, capacity): sigma^2, a temporary, the gradient;
            self._work = torch.empty(3, -(-2 * P // 16) * 16)  # rows 64-byte aligned, as fresh
            # tensors are (a matrix product's result may depend on its operands' alignment)
        self._scratch = self._work[:2, :P]  # (2, P), each row written whole before it is read
        self._var_views = self.views(self._scratch[0])
        self.grad = self._work[2, :P]  # (P,) the step's gradient (``backward`` writes it all)
        self._grad_views: tuple = (None,)

    def set_mu(self, mu: torch.Tensor) -> None:
        """New means (P,) (a step's result; the old tensor is left as it was)."""
        self.mu, self.mu_l = mu, self.views(mu)

    def set_prior(self, prior_mu: torch.Tensor, prior_prec: torch.Tensor) -> None:
        """The prior's means and precisions (P,) (kept by reference: never written)."""
        self.prior_mu, self.prior_prec = prior_mu, prior_prec
        self._prior_prec_max = float(prior_prec.max()) if prior_prec.numel() else 0.0
        self._sync()

    @property
    def prior_sigma(self) -> torch.Tensor:
        return self.prior_prec.rsqrt()

    def refresh_prior(self) -> None:
        """prior := current posterior: the means by reference (a step replaces them, never
        writes them), the precisions computed (the floor reads the old prior)."""
        self.set_prior(self.mu, self.precision())

    # ------------------------------------------------------------------ the posterior scales
    def _fisher_weight(self) -> float:
        """evidence / (1 - (1 - decay)^steps): the bias-corrected EMA, times the evidence."""
        if not self.fisher_steps:
            return 0.0
        if self.fisher_decay == 0 or self.fisher_decay >= 1:  # the mean of every update, or
            return self.evidence  # the last one: no bias (log1p(-1) raises)
        return self.evidence / -math.expm1(self.fisher_steps * math.log1p(-self.fisher_decay))

    def precision(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """(P,) posterior precision pi_0 + evidence * Fbar; with ``precision_floor``, at least
        the prior's (the posterior's last snapshot): in sequential Bayes the data only add
        curvature, so no weight's precision falls below what the prior already knew, however
        small the curvature of the samples in the EMA's window has become."""
        out = torch.add(self.prec0, self.fisher, alpha=self._fisher_weight(), out=out)
        return torch.maximum(out, self.prior_prec, out=out) if self.precision_floor else out

    def sigma(self) -> torch.Tensor:
        """(P,) posterior scales 1 / sqrt(precision)."""
        return self.precision().rsqrt_()

    def accumulate_fisher(self, cache: LocalCache, G: torch.Tensor) -> None:
        """Fold a Fisher estimate into ``Fbar``: G (m, C) = softmax - onehot(label drawn from
        the softmax) for the first m rows of the cache. Per row r and layer, the gradient of W
        is outer(g_r, h_r), so the mean over rows of its square is (g^2)^T h^2 / m; g goes down
        the mean network's path (through the ReLUs of this draw)."""
        m = G.shape[0]
        if not m:
            return
        # rate 0: the running mean of every update (rate 1 / t), the EMA's limit as the rate
        # goes to 0 (its bias-corrected value tends to that mean): nothing is forgotten
        rate = self.fisher_decay or 1.0 / (self.fisher_steps + 1)
        f, keep = self._fisher_views, 1.0 - rate
        fisher = torch.empty_like(self.fisher)  # the new Fbar (the old one is not written)
        new = self.views(fisher)
        g = G / math.sqrt(m)  # squares average over the rows
        for i in reversed(range(self.n_layers)):
            h, h2 = cache.layers[i][0][:m], cache.layers[i][1][:m]
            g2 = g * g
            # Fbar := keep Fbar + rate est, the EMA inside the product
            torch.addmm(f[2 * i], g2.t(), h2, beta=keep, alpha=rate, out=new[2 * i])
            torch.mul(f[2 * i + 1], keep, out=new[2 * i + 1]).add_(g2.sum(0), alpha=rate)
            if i:
                g = torch.ops.aten.threshold_backward(g.mm(self.mu_l[2 * i]), h, 0.0)
        self.fisher, self._fisher_views = fisher, new
        self.fisher_steps += 1

    # ------------------------------------------------------------------ KL
    def kl(self) -> torch.Tensor:
        """KL(q || prior), a scalar."""
        return kl_diag_gauss(self.mu, self.sigma(), self.prior_mu, self.prior_sigma)

    def add_kl_grad(self, grad: torch.Tensor, kl_scale: float,
                    max_curvature: float = math.inf) -> None:
        """grad += kl_scale * dKL(q || prior)/dmu = kl_scale * pi_p (mu - m_p). Exactly 0 when
        the prior means are the current means (the trap of a prior refreshed every step).
        ``max_curvature``: the anchor's curvature on a mean, kl_scale * pi_p, is capped there
        (pi_p clamped to max_curvature / kl_scale), so that an SGD step of size lr <= 1 /
        max_curvature cannot overshoot the anchor however much data the prior holds; the
        gradient is the plain formula whenever no weight reaches the cap."""
        if kl_scale:
            d = torch.sub(self.mu, self.prior_mu, out=self._scratch[1])
            if kl_scale * self._prior_prec_max > max_curvature:  # the stiffest anchors capped
                d.mul_(self.prior_prec.clamp(max=max_curvature / kl_scale))
                grad.add_(d, alpha=kl_scale)
            else:
                grad.addcmul_(d, self.prior_prec, value=kl_scale)

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
        self.precision(out=self._scratch[0]).reciprocal_()  # (P,) sigma^2
        v = self._var_views
        cache = LocalCache(v)
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
        """Write dL/dmu into grad (P,), given g = dL/dlogits (n, C) of the rows of
        ``forward_local``'s cache (the local draw A = M + S E depends on h through M and S)."""
        if self._grad_views[0] is not grad:  # views of the last buffer seen, reused
            self._grad_views = (grad, self.views(grad))
        _, gm = self._grad_views
        for i in reversed(range(self.n_layers)):
            h, h2, S, E = cache.layers[i]
            torch.mm(g.t(), h, out=gm[2 * i])
            torch.sum(g, 0, out=gm[2 * i + 1])
            if i:  # dL/dh = g W_mu + h (g E / S) W_var, through the ReLU
                gV = torch.mul(g, E).div_(S)  # (n, out)
                g = torch.addcmul(g.mm(self.mu_l[2 * i]), gV.mm(cache.v[2 * i]), h)
                g = torch.ops.aten.threshold_backward(g, h, 0.0)  # 0 where h <= 0

    # ------------------------------------------------------------------ growth and state
    def grown(self, flat: torch.Tensor, W: torch.Tensor | float, b: torch.Tensor | float,
              n_new: int) -> torch.Tensor:
        """A (P,) vector in this network's layout (output layer last: [..., Wo, bo]) with
        ``n_new`` output units appended: rows ``W`` (n_new, fan_in) and biases ``b`` (n_new,),
        or a constant for each (a new tensor)."""
        (n, fan_in), end = self.shapes[-2], flat.numel()
        cut = end - n  # where bo starts
        rows = W.reshape(-1) if isinstance(W, torch.Tensor) else flat.new_full((n_new * fan_in,), W)
        bias = b if isinstance(b, torch.Tensor) else flat.new_full((n_new,), b)
        return torch.cat([flat[:cut], rows, flat[cut:], bias])

    def grow(self, n_new: int, generator: torch.Generator,
             carry: tuple[torch.Tensor | None, ...] = ()) -> list[torch.Tensor | None]:
        """Add ``n_new`` output units (new vectors). ``carry``: other (P,) tensors in mu's
        layout to return grown with zeros."""
        fan_in = self.shapes[-2][1]
        Wn, bn = MLP._layer(fan_in, n_new, generator)  # Linear-style means of the new units
        prec = torch.tensor(fan_in / self.prior_scale ** 2).item()  # the initial prior's, f32
        out = [None if c is None else self.grown(c, 0.0, 0.0, n_new) for c in carry]
        self.mu = self.grown(self.mu, Wn, bn, n_new)
        self.fisher = self.grown(self.fisher, 0.0, 0.0, n_new)
        prior_mu = self.grown(self.prior_mu, 0.0, 0.0, n_new)
        prior_prec = self.grown(self.prior_prec, prec, prec, n_new)
        self.prec0 = self.grown(self.prec0, prec, prec, n_new)
        n_out = self.n_out + n_new
        self.shapes = [*self.shapes[:-2], (n_out, fan_in), (n_out,)]
        max_prec = max(self._prior_prec_max, prec)
        self.set_prior(prior_mu, prior_prec)
        self._prior_prec_max = max_prec
        return out

    def state(self) -> dict[str, torch.Tensor]:
        return {"mu": self.mu.clone(), "fisher": self.fisher.clone(),
                "fisher_steps": torch.tensor(self.fisher_steps),
                "evidence": torch.tensor(self.evidence, dtype=torch.float64),
                "prior_mu": self.prior_mu.clone(), "prior_prec": self.prior_prec.clone()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        if state["mu"].shape != self.mu.shape:
            raise ValueError(f"BNN state of {state['mu'].numel()} parameters given to a "
                             f"network of {self.P}")
        self._set(state["mu"], state["fisher"], int(state["fisher_steps"]),
                  float(state["evidence"]), state["prior_mu"], state["prior_prec"])
