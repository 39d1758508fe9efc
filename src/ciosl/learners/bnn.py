"""Mean-field Gaussian MLP with a growable output layer: CIOSL's head F(.), with posterior
scales inferred from the data's curvature.

Every weight and bias has a mean mu and a precision pi = 1 / sigma^2. The means are flat
parameters ``mu`` (P,) trained by the learner's optimizer (SGD in the paper); per-tensor views
``mu_l`` follow the layout [W1, b1, W2, b2, ...].

The precisions are not gradient parameters. They follow the natural-gradient (Bayesian learning
rule / VOGN-style) estimate of a mean-field Gaussian posterior, whose fixed point is

    pi = pi_0 + E * Fbar

- ``pi_0`` (P,): the precision of the initial prior N(0, s^2 / fan_in) of each layer
  (``prior_scale`` s; s = 1 is the variance-preserving scale of He/LeCun init);
- ``Fbar`` (P,): a running (exponential, bias-corrected) average of the diagonal Fisher of the
  per-sample likelihood, estimated at every step from the step's labelled rows with one label
  per row drawn from the model's own predictive (so it is the true Fisher / GGN diagonal of the
  softmax likelihood, not the empirical Fisher, and does not vanish on well-fit samples);
- ``E = evidence``: how many samples the posterior accounts for, divided by the temperature
  (the learner sets it: samples seen / temperature).

So the scale of each weight is learned from the data: a weight fed by an input that is always
(near) zero gets no curvature and stays at its prior; a weight on an informative input gets
precision that grows with the data. ``Fbar`` uses per-row squared gradients: for a linear layer
the per-row gradient of W is outer(g_r, h_r), so sum_r g_r^2 outer h_r^2 is one extra matmul.

Passes:

- ``forward_local``: the local reparameterization trick (Kingma, Salimans & Welling 2015). With
  independent Gaussian weights the pre-activation of a row x is exactly Gaussian, mean
  ``x mu^T + b_mu`` and variance ``x^2 (sigma^2)^T + sigma_b^2``; one draw per row and unit.
  Optional further rows re-use the layer-1 moments of the first input rows with fresh noise
  (more independent draws of those rows' outputs at no layer-1 cost: CIOSL's uncertainty).
- ``backward``: hand-written gradient of the means, into a flat (P,) buffer.
- ``accumulate_fisher``: the Fisher estimate of a step's rows into ``Fbar``.
- ``add_kl_grad``: the closed-form gradient of KL(q || prior) with respect to the means,
  ``pi_p (mu - m_p)``: each weight anchored by its own learned precision.
- ``forward_sampled``: k weight samples shared by all rows, ``(k, n, C)`` (MC predictive).
- ``forward_mean``: the mean weights.

KL: closed form between diagonal Gaussians, ``sum log(s_p/s_q) + (s_q^2 + (m_q - m_p)^2) /
(2 s_p^2) - 1/2``, against a prior that is a pair of flat tensors (means, precisions) refreshed
from the posterior on demand (``refresh_prior``).

Init: means as ``torch.nn.Linear`` (uniform +-1/sqrt(fan_in)), ``Fbar`` = 0 (the posterior
scales start at the prior's), prior N(0, s^2 / fan_in). Growth: a new output unit's mean is
initialised as a fresh layer's would be, its curvature is 0 (so its scale is the prior's) and
its prior is the initial prior. Nothing already learned moves.

Storage: every flat vector (mu, Fbar, the prior's means and precisions, pi_0) is a ``flat.Flat``:
the live (P,) vector is the start of a buffer with room for more output units, and a new unit
is written in place in O(fan_in + n_out) (the layout, and so every result, stays the same as a
freshly concatenated vector's). The step's temporaries (sigma^2, the KL's difference, the
gradient) are rows of one work buffer of the same capacity, each written whole before it is
read. Undo (``bayes_head``): ``flats()`` are snapshotted before a call and guarded, so that the
call's first write of each goes to its spare buffer (``write``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ciosl.learners.flat import Flat
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

    def _flat(self, data: torch.Tensor, pair: bool = True) -> Flat:
        """A ``Flat`` of a (P,) tensor in this network's layout (copied)."""
        fan_in = self.shapes[-2][1]
        return Flat(data, data.numel() - self.n_out * (fan_in + 1), fan_in, pair=pair)

    def flats(self) -> list[Flat]:
        """Every flat vector (mu, Fbar, pi_0, the prior's means and precisions)."""
        return list(self._flats.values())

    def write(self, name: str) -> torch.Tensor:
        """The live vector ``name`` ("mu", "fisher"), about to be written in place: moved to
        its spare buffer first (a copy) if it is guarded (``flat``)."""
        fl = self._flats[name]
        if fl.guarded:
            fl.target(copy=True)
            self._sync(name)
        return fl.live

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
        self._flats = {"mu": self._flat(mu), "fisher": self._flat(fisher),
                       "prec0": self._flat(self._prec0(), pair=False)}  # the prior: set_prior
        self.fisher_steps = int(fisher_steps)
        self.evidence = float(evidence)  # samples / temperature the posterior accounts for
        self._work = torch.empty(0, 0)
        self.set_prior(prior_mu, prior_prec)

    def _sync(self, name: str | None = None) -> None:
        """The live views of the flat vectors and the work buffer's rows; ``name`` ("mu",
        "fisher"): only that vector moved (to its spare buffer, the same size)."""
        fl = self._flats
        if name != "fisher":
            self.mu = fl["mu"].live  # (P,) the means, the optimizer's parameter
            self.mu_l = self.views(self.mu)
        if name != "mu":
            self.fisher = fl["fisher"].live  # (P,) EMA of the per-sample Fisher (not bias-
            self._fisher_views = self.views(self.fisher)  # corrected)
        if name is not None:
            return
        self.prior_mu, self.prior_prec = fl["prior_mu"].live, fl["prior_prec"].live  # (P,)
        self.prec0 = fl["prec0"].live  # (P,)
        P, cap = self.P, fl["mu"].bufs[fl["mu"].cur].numel()
        if self._work.shape[1] < cap:  # (3, capacity): sigma^2, a temporary, the gradient;
            self._work = torch.empty(3, -(-cap // 16) * 16)  # rows 64-byte aligned, as fresh
            # tensors are (a matrix product's result may depend on its operands' alignment)
        self._scratch = self._work[:2, :P]  # (2, P), each row written whole before it is read
        self._var_views = self.views(self._scratch[0])
        self.grad = self._work[2, :P]  # (P,) the step's gradient (``backward`` writes it all)
        self._grad_views: tuple = (None,)

    def set_prior(self, prior_mu: torch.Tensor, prior_prec: torch.Tensor) -> None:
        """The prior's means and precisions (P,) (copied)."""
        self._flats["prior_mu"] = self._flat(prior_mu)
        self._flats["prior_prec"] = self._flat(prior_prec)
        self._prior_prec_max = float(prior_prec.max()) if prior_prec.numel() else 0.0
        self._sync()

    @property
    def prior_sigma(self) -> torch.Tensor:
        return self.prior_prec.rsqrt()

    def refresh_prior(self) -> None:
        """prior := current posterior (means and precisions copied): into the spare buffers
        inside a call that may be undone (guarded, ``flat``), else into new vectors (a
        snapshot that later steps never touch, as a fresh tensor would be)."""
        new = []
        for name in ("prior_mu", "prior_prec"):
            fl = self._flats[name]
            if not fl.guarded:
                fl = self._flats[name] = fl.fresh()
            new.append(fl.target(copy=False)[1])
        new[0].copy_(self.mu)
        p = self.precision(out=new[1])  # (the floor reads the old prior: not synced yet)
        self._prior_prec_max = float(p.max()) if p.numel() else 0.0
        self._sync()

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
        self.write("fisher")
        # rate 0: the running mean of every update (rate 1 / t), the EMA's limit as the rate
        # goes to 0 (its bias-corrected value tends to that mean): nothing is forgotten
        rate = self.fisher_decay or 1.0 / (self.fisher_steps + 1)
        f, keep = self._fisher_views, 1.0 - rate
        g = G / math.sqrt(m)  # squares average over the rows
        for i in reversed(range(self.n_layers)):
            h, h2 = cache.layers[i][0][:m], cache.layers[i][1][:m]
            g2 = g * g
            # Fbar := keep Fbar + rate est, the EMA inside the product (no (P,) temporary)
            f[2 * i].addmm_(g2.t(), h2, beta=keep, alpha=rate)
            f[2 * i + 1].mul_(keep).add_(g2.sum(0), alpha=rate)
            if i:
                g = torch.ops.aten.threshold_backward(g.mm(self.mu_l[2 * i]), h, 0.0)
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
    def grow(self, n_new: int, generator: torch.Generator,
             carry: tuple[torch.Tensor | None, ...] = ()) -> list[torch.Tensor | None]:
        """Add ``n_new`` output units, in place (``flat``). ``carry``: other (P,) tensors in
        mu's layout to return grown with zeros (new tensors)."""
        fan_in = self.shapes[-2][1]
        Wn, bn = MLP._layer(fan_in, n_new, generator)  # Linear-style means of the new units
        prec = torch.tensor(fan_in / self.prior_scale ** 2).item()  # the initial prior's, f32
        out = [None if c is None else self._flat(c).grow(0.0, 0.0, n_new).clone() for c in carry]
        fl = self._flats
        fl["mu"].grow(Wn, bn, n_new)
        fl["fisher"].grow(0.0, 0.0, n_new)
        fl["prior_mu"].grow(0.0, 0.0, n_new)
        fl["prior_prec"].grow(prec, prec, n_new)
        fl["prec0"].grow(prec, prec, n_new)
        n_out = self.n_out + n_new
        self.shapes[-2:] = [(n_out, fan_in), (n_out,)]
        self._prior_prec_max = max(self._prior_prec_max, prec)
        self._sync()
        return out

    def state(self) -> dict[str, torch.Tensor]:
        return {"mu": self.mu.detach().clone(), "fisher": self.fisher.clone(),
                "fisher_steps": torch.tensor(self.fisher_steps),
                "evidence": torch.tensor(self.evidence, dtype=torch.float64),
                "prior_mu": self.prior_mu.clone(), "prior_prec": self.prior_prec.clone()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        if state["mu"].shape != self.mu.shape:
            raise ValueError(f"BNN state of {state['mu'].numel()} parameters given to a "
                             f"network of {self.P}")
        self._set(state["mu"], state["fisher"], int(state["fisher_steps"]),
                  float(state["evidence"]), state["prior_mu"], state["prior_prec"])
