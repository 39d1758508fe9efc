"""EWC: elastic weight consolidation (Kirkpatrick et al. 2017, "Overcoming catastrophic
forgetting in neural networks") on a stream without task boundaries.

The shared MLP head of ``finetune`` (hidden [256, 256], ReLU, SGD lr 0.01, momentum 0.9,
weight decay 1e-5, same base training). Per incoming sample (z, y), ONE SGD step on

    L = CE(f(z), y) + lam / 2 * sum_i Omega_i (theta_i - theta*_i)^2

with Omega the importance and theta* the anchor, both frozen at the last refresh.

Design choices:

- Importance (``_importance``): the diagonal empirical Fisher, i.e. the squared per-sample
  gradient of the log-likelihood log p(y | z) at the true label -- exactly the gradient of the
  step's CE, so it costs no extra backward pass. A running estimate is kept as the plain
  running mean over every sample seen (base init included): Omega_run += (g^2 - Omega_run) / n,
  the empirical Fisher of all the data seen so far, every sample weighted equally (EWC averages
  over one task's data; the stream is one growing task). One anchor and one importance, as in
  online EWC (Schwarz et al. 2018), not one penalty per task.
- Refresh (no task boundaries in a stream): the anchor theta* := theta and the penalty's
  importance Omega := Omega_run are set together (i) at the end of ``fit_base`` (after the
  importance of every base sample is accumulated, one sample at a time, with the trained head),
  (ii) when a new label arrives in the stream, just before its first step (the head that knows
  the old classes is anchored), and (iii) when ``refresh_every`` (R) stream samples were
  learned since the last refresh, so the penalty acts on the iid and instance orderings too.
  Between refreshes the running estimate is updated but the penalty does not move (with a
  refresh at every step, theta = theta* at the step and the penalty would do nothing).
- Output-layer growth: a new class adds one output row whose running and frozen importance are
  0 (its anchor value is its initial value, never used while its importance is 0); nothing
  learned moves.
- Stability cap (``max_penalty_step``): the penalty's curvature on theta_i is lam * Omega_i, and
  one SGD step multiplies the distance to the anchor by (1 - lr lam Omega_i); heavy-ball SGD
  with momentum m is stable only while lr lam Omega_i < 2 (1 + m) = 3.8. Measured (seed 0):
  on digits class_iid max lr lam Omega_i stays ~0.16, but on fashion-mnist-video
  class_instance it reaches ~7 at the 4th class step and ~2000 at the 5th (MAS, lam = 1: ~13):
  the penalty overshoots the anchor with a growing oscillation and, uncapped, training diverges
  (non-finite loss at sample ~4760 for EWC, ~4150 for MAS). So the per-parameter curvature is
  clamped: c_i = min(lam Omega_i, max_penalty_step / lr), i.e. one plain step removes at most
  the fraction ``max_penalty_step`` (default 1: all) of a parameter's distance to its anchor
  -- such a parameter is held at its anchor, which is what a very large importance asks for.
  Parameters below the cap get exactly the EWC gradient. ``max_penalty_step=inf`` disables
  the cap (it must stay below 2 (1 + momentum) to be stable).

Storage (issue 34: a new class costs no copy and no fresh tensor of the model's size): the
running importance ``omega`` and the curvature ``_curv`` are, per parameter tensor, the live rows
of a ``pingpong.PingPong`` (a pool of buffers whose rows grow by capacity doubling). A refresh
copies nothing of them: the frozen importance takes the running importance's rows as they are
(``PingPong.lend``: a reference; the running mean's next update writes into another buffer of
its pool, with the same arithmetic), and so does the anchor of the output layer, which takes the
layer's rows (the head's own ``PingPong``; its next SGD step writes into another buffer). The
hidden layers' anchor (a constant size, whatever the classes) is copied into a ``PingPong`` of
its own. Only the curvature min(lam Omega, cap) is computed (``torch.mul(..., out=)`` then
``clamp_``: the same bits as ``torch.clamp(lam * Omega, max=cap)``). A new class appends its
rows in place. Rollback: a call that may be undone first ``guard``s the buffers (they are locked:
no write of the call goes into them) and its undo record keeps the stores' references
(``snapshot``), no value copied. A known-class step re-anchors after its finite check, so a
non-finite loss raises before anything changed.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ciosl.learners.base import register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM
from ciosl.learners.pingpong import Borrowed, PingPong
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

    # ------------------------------------------------------------------ storage
    SLOTS: ClassVar[tuple[str, ...]] = ("omega", "omega_frozen", "anchor", "_curv")
    omega = property(lambda self: [pp.live for pp in self._rows["omega"]])  # running mean
    omega_frozen = property(lambda self: [pp.live for pp in self._rows["omega_frozen"]])
    anchor = property(lambda self: [pp.live for pp in self._rows["anchor"]])
    _curv = property(lambda self: [pp.live for pp in self._rows["_curv"]])

    def _cap(self) -> float:
        return self.max_penalty_step / self.lr  # inf: no cap

    def _curvature(self, o: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """min(lam * o, cap), into ``out`` if given (the same bits)."""
        out = torch.mul(o, self.lam, out=out) if out is not None else self.lam * o
        return out.clamp_(max=self._cap())

    def _adopt(self, omega: list, frozen: list, anchor: list) -> None:
        """Fresh storage holding these values (``_init_state``, ``_load_state``): the frozen
        importance and the output layer's anchor as values of their own until the next refresh
        lends them the running importance's and the layer's rows."""
        n_hidden = len(anchor) - 2
        self._rows = {
            "omega": [PingPong(t) for t in omega],
            "omega_frozen": [Borrowed(t.detach().clone()) for t in frozen],
            "anchor": [PingPong(t) if i < n_hidden else Borrowed(t.detach().clone())
                       for i, t in enumerate(anchor)],
            "_curv": [PingPong(self._curvature(f)) for f in frozen]}

    def _guard(self) -> list[tuple]:
        """Undo records of the storage (references), then guard it: no write of the call goes
        into the buffers the recorded rows are in (``pingpong``)."""
        record = []
        for name in self.SLOTS:
            for store in self._rows[name]:  # a PingPong or a Borrowed value
                record.append(store.snapshot())
                store.guard()
        return record

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
        """Add one sample's importance to the running mean: o += (imp - o) / n (into another
        buffer when the current one is lent or locked)."""
        self.n_omega += 1
        for pp, imp in zip(self._rows["omega"], importance, strict=True):
            o, new = pp.target()
            torch.add(o, imp.sub_(o), alpha=1.0 / self.n_omega, out=new)
            pp.commit()

    # ------------------------------------------------------------------ anchor and penalty
    def _lend(self) -> list:
        """The frozen importance takes the running importance's rows, the output layer's anchor
        the layer's rows (``PingPong.lend``: references, no copy); returns the hidden layers'
        (parameter, anchor store) pairs, whose anchor is copied."""
        rows, params = self._rows, self.net.params
        for o, f in zip(rows["omega"], rows["omega_frozen"], strict=True):
            f.live = o.lend()
        n_hidden = len(params) - 2
        for pp, a in zip(self.net.out_rows(), rows["anchor"][n_hidden:], strict=True):
            a.live = pp.lend()
        return list(zip(params[:n_hidden], rows["anchor"][:n_hidden], strict=True))

    @torch.no_grad()
    def _refresh(self) -> None:
        """theta* := theta and the penalty's importance := the running importance (lent
        references; the hidden layers' anchor copied), and the curvature computed from it."""
        for p, a in self._lend():
            a.target()[1].copy_(p)
            a.commit()
        for f, c in zip(self._rows["omega_frozen"], self._rows["_curv"], strict=True):
            self._curvature(f.live, out=c.target()[1])
            c.commit()
        self._since_refresh = 0

    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)
        zeros = [torch.zeros_like(p) for p in self.net.params]
        self._adopt(zeros, zeros, self.net.params)
        self.n_omega = 0  # samples in the running mean
        self._streaming = False  # fit_base done or stream started: new classes refresh
        self._refresh()

    def _add_class(self) -> None:
        """The new output row: importance 0 (running and frozen), anchor its initial value,
        appended in place; then, streaming, a refresh. (Before the stream, the running
        importance is still 0 and the parameters are at their initial values: the frozen
        importance and the anchor take the rows as they are, with no pass over them.)"""
        super()._add_class()
        rows = self._rows
        for p, o, c in zip(self.net.params[-2:], rows["omega"][-2:], rows["_curv"][-2:],
                           strict=True):  # the output layer's (min(lam 0, cap) = 0)
            if o.n < len(p):
                o.grow_zeros(len(p) - o.n)
                c.grow_zeros(len(p) - c.n)
        if self._streaming:
            self._refresh()
        else:
            self._lend()

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
            if self._since_refresh == 1:  # no step since the refresh: theta = theta*, so the
                for p, g in zip(self.net.params, grads, strict=True):  # penalty's gradient
                    p.grad = g  # is c * 0 = 0 (not computed: two passes over theta)
            else:
                for p, g, c, a in zip(self.net.params, grads, self._curv, self.anchor,
                                      strict=True):
                    p.grad = torch.addcmul(g, c, p - a)
        self.opt.step(self.net.params)

    # ------------------------------------------------------------------ state
    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """Every store snapshotted by reference and guarded (no write of the call goes into the
        buffers the snapshot's rows are in): no value copied."""
        return {**super()._undo_record(yi),
                "ewc": keep_attrs(self, ("_rows", "n_omega", "_since_refresh", "_streaming")),
                "ewc_rows": self._guard()}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        restore(record["ewc"])
        for snap in record["ewc_rows"]:
            snap[0].restore(snap)

    def _undo_done(self, record: dict[str, Any]) -> None:
        super()._undo_done(record)
        for snap in record["ewc_rows"]:
            snap[0].unlock()

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "omega": [o.clone() for o in self.omega],
                "n_omega": self.n_omega, "omega_frozen": [o.clone() for o in self.omega_frozen],
                "anchor": [a.clone() for a in self.anchor], "since_refresh": self._since_refresh,
                "streaming": self._streaming}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self._adopt(state["omega"], state["omega_frozen"], state["anchor"])  # copied
        self.n_omega = int(state["n_omega"])
        self._since_refresh = int(state["since_refresh"])
        self._streaming = bool(state["streaming"])
