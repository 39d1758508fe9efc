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

Storage (issue 34: a new class costs no fresh tensor of the model's size): the running
importance ``omega``, the frozen one ``omega_frozen``, the anchor ``anchor`` and the curvature
``_curv`` are, per parameter tensor, the live rows of a ``pingpong.PingPong`` (two buffers whose
rows grow by capacity doubling). A new class appends its output row in place; a refresh writes
theta, Omega_run and min(lam Omega, cap) into the existing buffers (``copy_``, ``torch.mul(...,
out=)`` then ``clamp_``: the same bits as ``torch.clamp(lam * Omega, max=cap)``). Rollback: a
call that may be undone first ``guard``s the buffers it may write -- the first write then goes
into the other buffer, which becomes current, so the rows as they were stay untouched -- and
its undo record keeps the ``PingPong`` objects' references (``undo.keep``), no value copied.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ciosl.learners.base import register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM
from ciosl.learners.pingpong import PingPong
from ciosl.learners.undo import keep, keep_attrs, restore


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
        """Fresh storage holding these values (``_init_state``, ``_load_state``)."""
        self._rows = {name: [PingPong(t) for t in ts] for name, ts in (
            ("omega", omega), ("omega_frozen", frozen), ("anchor", anchor),
            ("_curv", [self._curvature(f) for f in frozen]))}

    def _guard(self, *names: str) -> list[tuple]:
        """Undo records of the storage ``names`` (references), then guard it: the first write
        of each tensor goes into its other buffer (``pingpong``), leaving the recorded rows."""
        pps = [pp for name in names for pp in self._rows[name]]
        record = [keep(pp) for pp in pps]
        for pp in pps:
            pp.guard()
        return record

    # ------------------------------------------------------------------ importance
    def _importance(self, logits: torch.Tensor, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """One sample's importance per parameter, from its logits (1, C) (graph kept) and the
        gradient of its CE = -log p(y | z): the empirical Fisher g^2."""
        return [g * g for g in grads]

    def _observe(self, X: torch.Tensor, Y: torch.Tensor) -> list[torch.Tensor]:
        """The CE gradient of one sample X (1, d), Y (1,); adds its importance to the running
        mean."""
        logits = self.net(X)  # (1, C)
        loss = F.cross_entropy(logits, Y)
        self._check_finite(loss, X)
        grads = torch.autograd.grad(loss, self.net.params, retain_graph=True)  # MAS re-uses it
        importance = self._importance(logits, list(grads))
        self.n_omega += 1
        with torch.no_grad():  # o += (imp - o) / n, out of place when guarded
            for pp, imp in zip(self._rows["omega"], importance, strict=True):
                o, new = pp.target()
                torch.add(o, imp.sub_(o), alpha=1.0 / self.n_omega, out=new)
                pp.commit()
        return list(grads)

    # ------------------------------------------------------------------ anchor and penalty
    @torch.no_grad()
    def _refresh(self) -> None:
        """theta* := theta and the penalty's importance := the running importance, written
        into the existing storage."""
        rows = self._rows
        for p, o, f, a, c in zip(self.net.params, *(rows[n] for n in self.SLOTS), strict=True):
            for pp, value in ((a, p), (f, o.live)):
                pp.target()[1].copy_(value)
                pp.commit()
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
        appended in place; then, streaming, a refresh."""
        super()._add_class()
        rows = self._rows
        for p, o, f, a, c in zip(self.net.params, *(rows[n] for n in self.SLOTS), strict=True):
            if o.n < len(p):
                zero = p.new_zeros((len(p) - o.n, *p.shape[1:]))
                a.grow(p[o.n:])
                for pp in (o, f):
                    pp.grow(zero)
                c.grow(self._curvature(zero))
        if self._streaming:
            self._refresh()

    # ------------------------------------------------------------------ learning
    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._fit_base(Z, yi)  # finetune's base training (the importance is still 0)
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (n, d)
        Y = torch.from_numpy(yi)  # (n,)
        for i in range(len(X)):  # per-sample importances with the trained head
            self._observe(X[i:i + 1], Y[i:i + 1])
        self._refresh()
        self._streaming = True

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._streaming = True
        if self._since_refresh >= self.refresh_every:
            self._refresh()
        self._since_refresh += 1
        grads = self._observe(torch.from_numpy(z)[None], torch.tensor([yi]))  # (1, d), (1,)
        with torch.no_grad():  # d/dtheta lam/2 Omega (theta - theta*)^2, c = lam Omega capped
            for p, g, c, a in zip(self.net.params, grads, self._curv, self.anchor, strict=True):
                p.grad = torch.addcmul(g, c, p - a)
        self.opt.step(self.net.params)

    # ------------------------------------------------------------------ state
    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        """Every storage tensor guarded (its first write in the call goes to its other buffer)
        and kept by reference: no value copied."""
        return {**super()._undo_record(yi),
                "ewc": keep_attrs(self, ("_rows", "n_omega", "_since_refresh", "_streaming")),
                "ewc_rows": self._guard(*self.SLOTS)}

    def _step_record(self) -> tuple:
        """A known-class step counts the sample, and may re-anchor, before its finite check:
        the counters, and, when a refresh is due, the guarded anchor storage by reference."""
        due = self._since_refresh >= self.refresh_every
        return (keep_attrs(self, ("_since_refresh", "_streaming")),
                self._guard("omega_frozen", "anchor", "_curv") if due else [])

    def _step_undo(self, record: tuple) -> None:
        attrs, rows = record
        for pp in rows:
            restore(pp)
        restore(attrs)

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        restore(record["ewc"])
        for pp in record["ewc_rows"]:
            restore(pp)

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
