"""EWC: elastic weight consolidation (Kirkpatrick et al. 2017) on a stream without task
boundaries.

The shared MLP head of ``finetune``. Per incoming sample (z, y), ONE SGD step on

    L = CE(f(z), y) + lam / 2 * sum_i c_i (theta_i - theta*_i)^2,   c = min(lam Omega, cap) / lam

with Omega the importance and theta* the anchor, both frozen at the last refresh.

- Importance (``_importance``): the diagonal empirical Fisher g^2 of the step's own CE, kept as
  the plain running mean over every sample seen (base init included): one anchor and one
  importance, as in online EWC (Schwarz et al. 2018).
- Refresh: theta* := theta and Omega := Omega_run together, at the end of ``fit_base``, when a
  new label arrives in the stream (before its first step), and every ``refresh_every`` stream
  samples.
- A new class adds one output row with importance 0; nothing learned moves.
- Stability cap (``max_penalty_step``): the curvature lr lam Omega_i of a parameter is capped
  at ``max_penalty_step``, so a step never overshoots its anchor (measured divergence without
  it: docs/findings/ewc-mas-penalty-cap.md).

State (docs/design.md): the importance, the anchor and the curvature are lists of tensors that
a step replaces, never writes. A refresh is references: the anchor is the parameters' current
tensors and the frozen importance the running one's. Rollback puts the references back.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ciosl.learners.base import register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM
from ciosl.learners.undo import keep_attrs, restore


@register
class EWC(FineTune):
    name = "ewc"
    description = ("MLP head + quadratic pull to an anchor, weighted by a running empirical "
                   "Fisher; anchor refreshed at new classes and every R samples")
    help = {
        "lam": "lambda: weight of the importance-weighted quadratic penalty (lam / 2)",
        "refresh_every": "R: refresh the anchor and the penalty's importance every R stream "
                         "samples (and at every new class)",
        "max_penalty_step": "cap of lr * lam * Omega_i per parameter (stability; inf: none)",
        **FineTune.help,
    }
    conformance_settings: ClassVar[list[dict]] = [{"refresh_every": 4}, {"lam": 1e6}]

    def __init__(self, *, lam: float = 500.0, refresh_every: int = 500,
                 max_penalty_step: float = 1.0, lr: float = 0.01, momentum: float = 0.9,
                 weight_decay: float = 1e-5, max_grad_norm: float = MAX_GRAD_NORM,
                 base_epochs: int = 20, base_batch_size: int = 16, seed: int = 0):
        self.lam = lam
        self.refresh_every = refresh_every
        self.max_penalty_step = max_penalty_step
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm,
                         base_epochs=base_epochs, base_batch_size=base_batch_size, seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.refresh_every < 1:  # lam and max_penalty_step: their ranges (Learner.ranges)
            raise ValueError(f"{self.name}: need refresh_every >= 1, got {self.refresh_every}")

    STORES: ClassVar[tuple[str, ...]] = ("omega", "omega_frozen", "anchor", "_curv", "n_omega",
                                         "_since_refresh", "_streaming")

    def _cap(self) -> float:
        return self.max_penalty_step / self.lr  # inf: no cap

    def _curvature(self, o: torch.Tensor) -> torch.Tensor:
        """min(lam * o, cap), a new tensor."""
        return (o * self.lam).clamp_(max=self._cap())

    # ------------------------------------------------------------------ importance
    def _importance(self, logits: torch.Tensor, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """One sample's importance per parameter, from its logits (1, C) (graph kept) and the
        gradient of its CE = -log p(y | z): the empirical Fisher g^2."""
        return [g * g for g in grads]

    def _gradients(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[list, list]:
        """The CE gradient of one sample X (1, d), Y (1,) and its importance (nothing changes
        if its loss is not finite)."""
        logits = self.net(X)  # (1, C)
        loss = F.cross_entropy(logits, Y)
        self._check_finite(loss, X)
        grads = torch.autograd.grad(loss, self.net.params, retain_graph=True)  # MAS re-uses it
        return list(grads), self._importance(logits, list(grads))

    @torch.no_grad()
    def _accumulate(self, importance: list[torch.Tensor]) -> None:
        """Add one sample's importance to the running mean: o + (imp - o) / n (new tensors)."""
        self.n_omega += 1
        self.omega = [torch.add(o, imp.sub_(o), alpha=1.0 / self.n_omega)
                      for o, imp in zip(self.omega, importance, strict=True)]

    # ------------------------------------------------------------------ anchor and penalty
    @torch.no_grad()
    def _refresh(self) -> None:
        """theta* := theta and the penalty's importance := the running importance (references:
        neither is ever written in place), and the curvature computed from it."""
        self.anchor = [p.detach() for p in self.net.params]
        self.omega_frozen = list(self.omega)
        self._curv = [self._curvature(o) for o in self.omega]
        self._since_refresh = 0

    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)
        self.omega = [torch.zeros_like(p, requires_grad=False) for p in self.net.params]
        self.n_omega = 0  # samples in the running mean
        self._streaming = False  # fit_base done or stream started: new classes refresh
        self._refresh()

    def _add_class(self) -> None:
        """The new output row: importance 0 (running and frozen) and curvature 0; then,
        streaming, a refresh. (Before the stream, the running importance is still 0 and the
        parameters are at their initial values: the frozen importance and the output layer's
        anchor are the grown tensors as they are.)"""
        super()._add_class()
        params = self.net.params
        grown = lambda ts: [*ts[:-2], *(torch.cat([t, t.new_zeros((len(p) - len(t), *t.shape[1:]))])  # noqa: E731
                                       for t, p in zip(ts[-2:], params[-2:], strict=True))]
        self.omega, self._curv = grown(self.omega), grown(self._curv)
        if self._streaming:
            self._refresh()
        else:
            self.omega_frozen = list(self.omega)
            self.anchor = [*self.anchor[:-2], *(p.detach() for p in params[-2:])]

    # ------------------------------------------------------------------ learning
    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._fit_base(Z, yi)  # finetune's base training (the importance is still 0)
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (n, d)
        Y = torch.from_numpy(yi)  # (n,)
        for i in range(len(X)):  # per-sample importances with the trained head
            self._accumulate(self._gradients(X[i:i + 1], Y[i:i + 1])[1])
        self._refresh()
        self._streaming = True

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        grads, importance = self._gradients(torch.from_numpy(z)[None], torch.tensor([yi]))
        self._streaming = True  # the loss is finite: from here on the step changes the state
        if self._since_refresh >= self.refresh_every:
            self._refresh()  # before the running importance takes this sample
        self._since_refresh += 1
        self._accumulate(importance)
        with torch.no_grad():  # d/dtheta lam/2 Omega (theta - theta*)^2, c = lam Omega capped
            if self._since_refresh > 1:  # just after a refresh theta = theta*: the penalty's
                grads = [torch.addcmul(g, c, p - a)  # gradient is c * 0 = 0 (not computed)
                         for p, g, c, a in zip(self.net.params, grads, self._curv, self.anchor,
                                               strict=True)]
        self.net.params = self.opt.step(self.net.params, grads)

    # ------------------------------------------------------------------ state
    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        return {**super()._undo_record(yi), "ewc": keep_attrs(self, self.STORES)}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        restore(record["ewc"])

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "omega": [o.clone() for o in self.omega],
                "n_omega": self.n_omega, "omega_frozen": [o.clone() for o in self.omega_frozen],
                "anchor": [a.clone() for a in self.anchor], "since_refresh": self._since_refresh,
                "streaming": self._streaming}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.omega = [t.detach().clone() for t in state["omega"]]
        self.omega_frozen = [t.detach().clone() for t in state["omega_frozen"]]
        self.anchor = [t.detach().clone() for t in state["anchor"]]
        self._curv = [self._curvature(o) for o in self.omega_frozen]
        self.n_omega = int(state["n_omega"])
        self._since_refresh = int(state["since_refresh"])
        self._streaming = bool(state["streaming"])
