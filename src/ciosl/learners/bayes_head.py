"""What every learner with the Bayesian head shares (CIOSL, VCL, VCL+coreset, Coreset-only).

The head is ``bnn.BayesMLP`` (hidden [256, 256], ReLU, mean-field Gaussian). One update per
sample has two parts:

1. **Means: one SGD step** (lr, momentum, weight decay; torch's fused kernel; the gradient
   clipped to ``max_grad_norm``) on the paper's per-sample objective (Eq. 3 + Eq. 6):

       L = mean_{labelled rows} CE(f(z_i), y_i)    f ~ q: one local-reparameterization draw
         + lambda2 * mean_{distilled rows} sum_{c < c_j} (h_jc - f(z_j)_c)^2            (Eq. 6)
         + lambda1 * (T / N) * KL(q || prior)                                          (Eq. 3)

   N = samples seen, T = ``temperature``. The KL's gradient on a mean is ``pi_p (mu - m_p)``.
2. **Scales: the natural-gradient precision update** ``pi = pi_0 + (N / T) * Fbar``
   (``bnn.py``); plain SGD on a softplus scale cannot move them (docs/design.md, "Two traps").

The prior is refreshed to the posterior per ``prior_refresh`` (docs/design.md, "Two traps"). Base
training uses the initial prior; after it the prior is the base posterior.

State (docs/design.md): a step replaces the head's vectors and the momentum (torch's fused SGD
kernel runs on copies); rollback puts the references back (``undo.keep``).

Why this combination (measured): docs/findings/bayesian-head.md.
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import Learner
from ciosl.learners.bnn import BayesMLP
from ciosl.learners.head import HIDDEN, SGD, check_finite, clip_grad_norm_
from ciosl.learners.undo import keep, keep_attrs, restore

REFRESHES = ("every", "class", "base", "step")
FISHER_DECAY = 0.01  # EMA rate of the Fisher estimate (~100 steps) of VCL and the coreset methods
# gradient-norm clip of the Bayesian heads' step: the MLP heads' 1 slowed a new class's learning
# on short streams (conformance: 0.5 vs 0.95 accuracy on a class seen 10 times) while 1, 3 and
# 10 tie on the development streams (digits class-iid Omega_all 0.966 / 0.967 / 0.965)
BAYES_MAX_GRAD_NORM = 3.0
_FUSED = hasattr(torch, "_fused_sgd_")
_MINUS_ONE = torch.tensor(-1.0)

# the settings every Bayesian head shares, with their help
BAYES_HELP = {
    "lambda1": "weight of the KL(q || prior) term of the tempered ELBO (T / N per sample)",
    "temperature": "T: posterior temperature; precision = prior + (N / T) * Fisher, KL x T / N",
    "fisher_decay": "rate of the running Fisher's EMA (its memory is ~1 / rate updates; 0: "
                    "the mean of every update, nothing forgotten); the precision is prior + "
                    "(N / T) * that Fisher",
    "prior_scale": "s: initial prior N(0, s^2 / fan_in) per layer",
    "mc_samples": "k: weight draws for the uncertainty score and for prediction=mc",
    "prior_refresh": "when the prior becomes the posterior: every R samples, at a new "
                     "class, only after base init, or every step (no KL effect)",
    "refresh_every": "R for prior_refresh=every",
    "prediction": "mean weights or MC average of softmaxes",
    "lr": "SGD learning rate (means)",
    "max_grad_norm": "stability: the means' gradient is clipped to this L2 norm before the "
                     "SGD step (inf: plain SGD)",
    "momentum": "SGD momentum",
    "weight_decay": "L2 weight decay added to the means' gradient",
    "base_epochs": "epochs of offline training in fit_base",
    "base_batch_size": "mini-batch size in fit_base",
}


@functools.lru_cache(maxsize=256)
def _arange(n: int) -> torch.Tensor:
    return torch.arange(n)


def scores(logits: torch.Tensor, P: torch.Tensor, Y: torch.Tensor, n: int, k: int,
           epistemic: bool = False):
    """Scores of the m = len(Y) first rows from the logits (R, C) and softmaxes P (R, C) of
    ``forward_local``: training draw at rows :m, further draws at rows n + j m + i.
    Returns the first draw's cross-entropy (m,), the uncertainty (m,) and the mean logits
    (m, C). The uncertainty is the entropy of the mean softmax over the k draws (Eq. 7), or
    with ``epistemic`` that entropy minus the draws' mean entropy: the mutual information
    between the label and the weights (BALD), the part of the uncertainty the posterior's
    spread causes (0 where every draw agrees, however flat their softmax)."""
    m = len(Y)
    loss = torch.nn.functional.cross_entropy(logits[:m], Y, reduction="none")
    p, h = P[:m], logits[:m]
    if k > 1:
        p = P[n:].view(k - 1, m, -1).sum(0).add_(p).div_(k)  # (m, C)
        h = logits[n:].view(k - 1, m, -1).sum(0).add_(h).div_(k)  # (m, C)
    unc = torch.special.entr(p).sum(1)  # (m,)
    if epistemic:
        each = torch.special.entr(P[n:]).sum(1).view(k - 1, m).sum(0) if k > 1 else 0.0
        unc = unc.sub_(torch.special.entr(P[:m]).sum(1).add_(each).div_(k)).clamp_(min=0.0)
    return loss, unc, h


class FlatSGD(SGD):
    """``head.SGD`` (d = g + wd p; buf = m buf + d; p -= lr buf) for the one flat parameter
    tensor of a ``BayesMLP``, with torch's fused CPU SGD kernel where it exists (``head.SGD``'s
    arithmetic otherwise). The kernel works in place, so it runs on copies of the means and the
    momentum, which then replace them (the state rule: the old tensors are left as they were)."""

    def __init__(self, net: BayesMLP, *, lr: float, momentum: float, weight_decay: float):
        super().__init__([net.mu], lr=lr, momentum=momentum, weight_decay=weight_decay)

    def grow(self, net: BayesMLP, n_new: int) -> None:
        """Zero momentum for ``n_new`` new output units (call before ``net.grow``)."""
        buf = self.buffers[0]
        if buf is not None:
            buf = buf if buf.shape == net.mu.shape else self._fit(buf, net.mu.shape)
            self.buffers = [net.grown(buf, 0.0, 0.0, n_new)]

    @torch.no_grad()
    def step_net(self, net: BayesMLP, grad: torch.Tensor) -> None:
        """One step of ``net``'s means on ``grad`` (P,)."""
        p = net.mu.clone()
        buf = self.buffers[0]
        buf = torch.zeros_like(p) if buf is None else self._fit(buf, p.shape) \
            if buf.shape != p.shape else buf.clone()  # the first step: m * 0 + d == d
        if _FUSED and self.momentum:
            torch._fused_sgd_([p], [grad], [buf], weight_decay=self.weight_decay,
                              momentum=self.momentum, lr=self.lr, dampening=0.0,
                              nesterov=False, maximize=False, is_first_step=False)
        else:  # the fused kernel takes no momentum buffer at momentum 0: head.SGD's step
            d = grad.add(p, alpha=self.weight_decay) if self.weight_decay else grad
            buf.mul_(self.momentum).add_(d)
            p.sub_(buf, alpha=self.lr)
        self.buffers = [buf]
        net.set_mu(p)


class BayesHead(Learner):
    """The mean-field head, its optimizer, the prior-refresh schedule, the step (module
    docstring), base training and prediction.

    Not registered. A subclass provides, as settings or class attributes: ``lambda1``,
    ``temperature``, ``fisher_decay``, ``prior_scale``, ``mc_samples``, ``prior_refresh`` (one
    of ``REFRESHES``, or ``"never"``: the prior stays the initial prior forever), ``refresh_every``,
    ``prediction``, ``lr``, ``max_grad_norm``, ``momentum``, ``weight_decay``, ``base_epochs``,
    ``base_batch_size``; and ``lambda2`` if it gives ``_step`` distillation rows."""

    # train on one draw of the posterior (a CIOSL setting, the ablation of that sampling)
    train_noise: ClassVar[bool] = True
    # posterior draws per training row, their gradients averaged (a CIOSL setting)
    train_draws: ClassVar[int] = 1
    # what the uncertainty score measures: "entropy" (Eq. 7) or "epistemic" (a CIOSL setting)
    uncertainty: ClassVar[str] = "entropy"
    # the data the stream's KL term is divided by: "seen" (N), "window" or "step" (a CIOSL setting)
    kl_data: ClassVar[str] = "seen"
    # "prior": the posterior precision never falls below the prior's (a CIOSL setting)
    precision_floor: ClassVar[str] = "none"
    # the paper trains with plain SGD and an untempered KL (reports label other values)
    paper_values: ClassVar[dict[str, Any]] = {"max_grad_norm": math.inf, "temperature": 1.0}
    published_parts: ClassVar[tuple[str, ...] | None] = ("net",)  # predictions read it
    # the Fisher EMA rate was a constant, 0.01, before it was a setting
    added_settings: ClassVar[dict[str, Any]] = {"fisher_decay": 0.01}

    def _conditions(self) -> list[tuple[str, bool, str]]:
        """(setting, valid, requirement) triples checked by ``_check_settings``; the number
        settings' ranges (lambda1, temperature, prior_scale, mc_samples, lr, momentum,
        weight_decay, ...) are ``Learner.ranges``, checked after these."""
        return [
            ("fisher_decay", self.fisher_decay == 0 or 1e-6 <= self.fisher_decay <= 1,
             "0 (the mean of every update: nothing forgotten) or in [1e-6, 1]"),
            ("refresh_every", self.refresh_every >= 1, ">= 1"),
            ("max_grad_norm", self.max_grad_norm > 0, "> 0"),
            ("base_epochs", self.base_epochs >= 0, ">= 0"),
            ("base_batch_size", self.base_batch_size >= 1, ">= 1")]

    def _check_settings(self) -> None:
        super()._check_settings()
        bad = [f"{k} must be {cond}" for k, ok, cond in self._conditions() if not ok]
        if bad:
            raise ValueError(f"{self.name}: " + "; ".join(bad))

    # ------------------------------------------------------------------ state
    def _new_net(self, dim: int, n_out: int, generator: torch.Generator) -> BayesMLP:
        return BayesMLP(dim, n_out, HIDDEN, prior_scale=self.prior_scale,
                        fisher_decay=self.fisher_decay,
                        precision_floor=self.precision_floor == "prior", generator=generator)

    def _new_opt(self, net: BayesMLP) -> FlatSGD:
        return FlatSGD(net, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def _init_state(self, dim: int) -> None:
        self.net = self._new_net(dim, 0, self.torch_rng)
        self.opt = self._new_opt(self.net)
        self._grad = self.net.grad  # (P,) reused every step
        self._since_refresh = 0  # stream samples since the last prior refresh
        self._streaming = False  # fit_base done or stream started: class refreshes apply

    def _add_class(self) -> None:
        if self.prior_refresh == "class" and self._streaming:
            self.net.refresh_prior()  # the posterior that knows the old classes
        self.opt.grow(self.net, 1)
        self.net.grow(1, self.torch_rng)
        self._grad = self.net.grad

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """The head, its optimizer and the schedule by reference: a step replaces their
        tensors."""
        return {"net": keep(self.net), "opt": keep(self.opt),
                "head": keep_attrs(self, ("_grad", "_since_refresh", "_streaming"))}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        for part in ("net", "opt", "head"):
            restore(record[part])

    def _state(self) -> dict[str, Any]:
        return {"net": self.net.state(), "momentum": self.opt.state(),
                "since_refresh": self._since_refresh, "streaming": self._streaming}

    def _load_state(self, state: dict[str, Any]) -> None:
        self.net.load(state["net"])
        self.opt.load(state["momentum"])
        self._grad = self.net.grad
        self._since_refresh = int(state["since_refresh"])
        self._streaming = bool(state["streaming"])

    # ------------------------------------------------------------------ the step
    def _draw_noise(self, rows: int) -> list[torch.Tensor]:
        """Standard normal noise per layer, (rows, out_l) each, from ``torch_rng``."""
        widths = [s[0] for s in self.net.shapes[1::2]]
        eps = torch.randn(rows, sum(widths), generator=self.torch_rng)  # one draw, split
        return list(eps.split(widths, dim=1))

    def _training_noise(self, rows: int, n: int) -> list[torch.Tensor]:
        """``_draw_noise(rows)``, its first ``n`` rows (the training rows) zeroed when
        ``train_noise`` is off (the ablation: they see the posterior means; the same draws are
        consumed either way)."""
        noise = self._draw_noise(rows)
        if not self.train_noise:
            for e in noise:
                e[:n].zero_()
        return noise

    def _kl_scale(self, n_samples: int, n_rows: int = 1) -> float:
        """Weight of KL(q || prior) against the mean cross-entropy of a step's ``n_rows``
        labelled rows: lambda1 * T / D. D = ``n_samples`` (N, the samples the posterior
        accounts for: the per-sample ELBO of everything seen) by default; once the stream has
        started, ``kl_data`` chooses: ``"window"``: D = ``refresh_every`` (the per-sample ELBO
        of the window the refreshed prior has not seen, as VCL's per-task objective);
        ``"step"``: D = ``n_rows`` (Eq. 3 as written: the step's summed log-likelihoods minus
        lambda1 KL, tempered)."""
        if self._streaming and self.kl_data != "seen":
            data = self.refresh_every if self.kl_data == "window" else n_rows
            return self.lambda1 * self.temperature / data
        return self.lambda1 * self.temperature / n_samples

    @torch.no_grad()
    def _step(self, X: torch.Tensor, Y: torch.Tensor, H: torch.Tensor | None = None,
              mask: torch.Tensor | None = None, *, n_scored: int = 0, n_data: int,
              kl_scale: float | None = None, score_labels: torch.Tensor | None = None):
        """One update on rows X (n, d): the first len(Y) rows have labels Y (CE), the rest are
        distilled towards stored logits H (n_d, C) where ``mask``; the posterior accounts for
        ``n_data`` samples (the KL's weight is ``_kl_scale(n_data)`` unless ``kl_scale`` is
        given). Returns the scores of the first ``n_scored`` rows (``scores``; their labels are
        ``score_labels``, by default ``Y[:n_scored]``), or None. Non-finite logits raise FloatingPointError before anything moves."""
        net = self.net
        n, n_ce = X.shape[0], Y.shape[0]
        k = self.mc_samples if n_scored else 1
        R = n + n_scored * (k - 1)  # with k - 1 further draws of the scored rows
        net.evidence = n_data / self.temperature
        noise = self._training_noise(R, n)
        logits, cache = net.forward_local(X, noise, (n_scored, k - 1))
        self._check_finite(logits[:n_ce], X)
        P = logits.softmax(1)  # (R, C)
        if n_scored:
            out = scores(logits, P, Y[:n_scored] if score_labels is None else score_labels, n, k,
                         self.uncertainty == "epistemic")
        else:
            out = None
        # Fisher rows: softmax - onehot(label drawn from the softmax), before P is reused
        drawn = torch.multinomial(P[:n_ce], 1, generator=self.torch_rng)[:, 0]  # (n_ce,)
        G = P[:n_ce].clone()
        G.index_put_((_arange(n_ce), drawn), _MINUS_ONE, accumulate=True)
        net.backward(cache, self._dlogits(P[:n], logits, Y, H, mask), self._grad)
        if self.train_draws > 1:  # the ELBO's expectation over train_draws posterior draws
            extra = torch.empty_like(self._grad)
            for _ in range(self.train_draws - 1):
                logits, cache_j = net.forward_local(X, self._training_noise(n, n))
                self._check_finite(logits[:n_ce], X)
                net.backward(cache_j, self._dlogits(logits.softmax(1), logits, Y, H, mask), extra)
                self._grad.add_(extra)
            self._grad.div_(self.train_draws)
        net.accumulate_fisher(cache, G)  # the first draw's rows
        kl = self._kl_scale(n_data, n_ce) if kl_scale is None else kl_scale
        net.add_kl_grad(self._grad, kl, max_curvature=1.0 / self.lr)  # stable: lr * curvature <= 1
        clip_grad_norm_([self._grad], self.max_grad_norm)
        self.opt.step_net(net, self._grad)
        return out

    def _dlogits(self, g: torch.Tensor, logits: torch.Tensor, Y: torch.Tensor,
                 H: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        """dL/dlogits (n, C), written into the softmaxes g (n, C) of the n training rows: the
        labelled rows' mean cross-entropy, then the distilled rows' squared distance to H."""
        n, n_ce = g.shape[0], Y.shape[0]
        g.index_put_((_arange(n_ce), Y), _MINUS_ONE, accumulate=True)  # softmax - onehot
        g[:n_ce].div_(n_ce)
        if n > n_ce:  # distillation rows: squared distance over the recorded logits, row mean
            d = torch.sub(logits[n_ce:n], H, out=g[n_ce:]).mul_(mask)
            d.mul_(2.0 * self.lambda2 / (n - n_ce))
        return g

    def _check_finite(self, values: torch.Tensor, X: torch.Tensor) -> None:
        check_finite(values, X, name=self.name, n_seen=self.n_seen_, lr=self.lr,
                     momentum=self.momentum, max_grad_norm=self.max_grad_norm)

    def _refresh_if_due(self, n_new: int = 1) -> None:
        """At the start of a stream step on ``n_new`` new samples: mark the stream as started,
        make the prior the posterior if ``prior_refresh`` says so now, and count the samples
        (``refresh_every`` counts samples, whatever the mini-batch size)."""
        self._streaming = True
        if (self.prior_refresh == "step"
                or (self.prior_refresh == "every" and self._since_refresh >= self.refresh_every)):
            self.net.refresh_prior()
            self._since_refresh = 0
        self._since_refresh += n_new

    def _train(self, X: torch.Tensor, Y: torch.Tensor, *, epochs: int, batch_size: int,
               n_data: int, kl_scale: float | None = None) -> None:
        """``epochs`` epochs of shuffled mini-batches of (X (n, d), Y (n,)), one step each."""
        for _ in range(epochs):
            perm = torch.randperm(len(X), generator=self.torch_rng)
            for s in range(0, len(X), batch_size):
                idx = perm[s:s + batch_size]
                self._step(X[idx], Y[idx], n_data=n_data, kl_scale=kl_scale)

    def _base_done(self) -> None:
        """End of fit_base: the prior becomes the base posterior (unless ``"never"``) and the
        stream starts."""
        if self.prior_refresh != "never":
            self.net.refresh_prior()
        self._since_refresh = 0
        self._streaming = True

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def _predict_net(self, net: BayesMLP, Z: np.ndarray) -> np.ndarray:
        """(n, C) probabilities of ``net``: mean weights, or the MC average (``prediction``)."""
        X = torch.from_numpy(Z)
        if self.prediction == "mean":
            out = [net.forward_mean(X[i:i + 4096]).softmax(1) for i in range(0, len(X), 4096)]
        else:
            gen = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + self.n_seen_)
            W = net.sample_weights(self.mc_samples, gen)
            out = [net.forward_sampled(X[i:i + 1024], W).softmax(-1).mean(0)
                   for i in range(0, len(X), 1024)]
        return torch.cat(out).numpy()

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        return self._predict_net(self.net, Z)

    novelty = ("predictive uncertainty: entropy of the mean softmax over k = mc_samples posterior "
               "draws (Eq. 7; with uncertainty=epistemic, that entropy minus the draws' mean "
               "entropy)")

    @torch.no_grad()
    def _novelty_score(self, Z: np.ndarray) -> np.ndarray:
        """The uncertainty score of the replay (``scores``) for unlabelled rows: k weight draws
        from the posterior (a generator of their own, seeded by the seed and the samples seen,
        as ``prediction=mc`` draws: the learner's generators are untouched)."""
        X = torch.from_numpy(Z)
        gen = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + self.n_seen_ + 7)
        W = self.net.sample_weights(max(2, self.mc_samples), gen)
        out = []
        for i in range(0, len(X), 1024):
            P = self.net.forward_sampled(X[i:i + 1024], W).softmax(-1)  # (k, m, C)
            unc = torch.special.entr(P.mean(0)).sum(1)
            if self.uncertainty == "epistemic":
                unc = unc.sub_(torch.special.entr(P).sum(2).mean(0)).clamp_(min=0.0)
            out.append(unc)
        return torch.cat(out).double().numpy()
