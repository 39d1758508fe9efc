"""A-GEM: averaged gradient episodic memory (Chaudhry et al. 2019, "Efficient Lifelong Learning
with A-GEM"), in its streaming form.

The shared MLP head (hidden [256, 256], ReLU) and a reservoir replay memory of ``buffer``
items, as ``tinyer``. Per incoming sample (z, y), with all parameter gradients flattened into
one vector:

    g     = grad CE(f(z), y)                                  (the new sample alone)
    g_ref = grad mean_{i in R} CE(f(z_i), y_i)                (R: N1' uniform memory items)
    g~    = g - (g . g_ref / g_ref . g_ref) g_ref   if g . g_ref < 0,   else g

then ONE SGD step (lr 0.01, momentum 0.9, weight decay 1e-5) with g~, and the sample is
offered to the memory (reservoir).

Design choices:

- One forward pass over the joint batch [z; R] and two backward passes over it (g, g_ref);
  the gradients are flattened with one ``torch.cat`` and ``g~`` is split back into views of the
  parameter shapes, so the projection is two dot products and one axpy over P numbers.
- As in A-GEM, only the loss gradient is projected: weight decay and momentum are applied by
  the optimizer on top of g~ (``head.SGD``), exactly as torch.optim.SGD would after A-GEM's
  projection of the gradient into g~. With an empty memory (or ``n_replay`` = 0) the step is plain fine-tuning.
- The episodic memory is a reservoir (the streaming setting has no task boundaries to fill
  per-task episodic memories at), shared with ``tinyer``; ``fit_base`` is tinyer's.
- ``n_projected`` counts the steps whose gradient was projected (a diagnostic, saved).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ciosl.learners.base import register
from ciosl.learners.tinyer import TinyER


def project(g: torch.Tensor, g_ref: torch.Tensor) -> torch.Tensor:
    """A-GEM's projection of the flat gradient g (P,) against g_ref (P,): g itself when
    g . g_ref >= 0, else g minus its component along g_ref (then g~ . g_ref = 0)."""
    dot = torch.dot(g, g_ref)
    if dot >= 0:
        return g
    return g - (dot / torch.dot(g_ref, g_ref)) * g_ref  # g_ref != 0 since dot < 0


@register
class AGEM(TinyER):
    name = "agem"
    description = ("averaged GEM: the new sample's gradient projected when it conflicts with "
                   "the gradient of N1' memory items")
    help = {
        **TinyER.help,
        "n_replay": "N1': memory items for the reference gradient per step",
    }

    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)
        self.n_projected = 0

    def gradients(self, X: torch.Tensor, Y: torch.Tensor,
                  n_new: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat gradients (P,) of the mean CE of the first ``n_new`` rows (g) and of the mean
        CE of the other rows (g_ref, zeros when there are none); parameters' .grad untouched."""
        params = self.net.params
        logits = self.net(X)  # (n_new + r, C)
        loss = F.cross_entropy(logits[:n_new], Y[:n_new])
        self._check_finite(loss, X)
        g = torch.autograd.grad(loss, params, retain_graph=len(Y) > n_new)
        if len(Y) > n_new:
            g_ref = torch.autograd.grad(F.cross_entropy(logits[n_new:], Y[n_new:]), params)
        else:
            g_ref = [torch.zeros_like(p) for p in params]
        flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
        return flat(g), flat(g_ref)

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._learn_batch(z[None], np.array([yi]))

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """The mini-batch's gradient projected against the memory's (streaming: a batch of
        one); the new samples are then offered to the memory in order."""
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (b, d)
        g, g_ref = self.gradients(*self._with_replay(X, torch.from_numpy(yi)),
                                  n_new=len(yi))  # (P,), (P,)
        g_tilde = project(g, g_ref)
        self.n_projected += g_tilde is not g
        params = self.net.params
        grads = [gp.view_as(p) for p, gp in zip(params, g_tilde.split([p.numel() for p in params]),
                                                strict=True)]
        self.net.params = self.opt.step(params, grads)
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        return {**super()._undo_record(yi), "n_projected": self.n_projected}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        self.n_projected = record["n_projected"]

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "n_projected": self.n_projected}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.n_projected = int(state["n_projected"])
