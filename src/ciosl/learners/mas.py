"""MAS: memory aware synapses (Aljundi et al. 2018, "Memory Aware Synapses: Learning what
(not) to forget") on a stream without task boundaries.

Everything is ``ewc`` (shared MLP head, one SGD step per sample on CE + lam / 2 * sum_i Omega_i
(theta_i - theta*_i)^2, running importance, anchor and penalty importance refreshed at the end
of ``fit_base``, at every new label and every ``refresh_every`` stream samples, new output rows
with importance 0, the same per-parameter curvature cap) except the importance:

- Omega_i = running mean over samples of |d ||f(z)||_2^2 / d theta_i|, the absolute gradient of
  the squared L2 norm of the head's output f(z) (the logits, before the softmax, over every
  class seen so far): how sensitive the learned function is to theta_i, label-free. It needs a
  second backward pass per sample through the same forward pass.
- The penalty keeps the brief's lam / 2 (MAS's paper writes lam without the 1/2, so its lam = 1
  is lam = 2 here); the default lam = 1 is the paper's section 5.3 value.
"""

from __future__ import annotations

import torch

from ciosl.learners.base import register
from ciosl.learners.ewc import EWC
from ciosl.learners.head import MAX_GRAD_NORM


@register
class MAS(EWC):
    name = "mas"
    description = ("MLP head + quadratic pull to an anchor, weighted by the running output-norm "
                   "sensitivity |d ||f||^2 / d theta|")

    def __init__(self, *, lam: float = 1.0, refresh_every: int = 500,
                 max_penalty_step: float = 1.0, lr: float = 0.01, momentum: float = 0.9,
                 weight_decay: float = 1e-5, max_grad_norm: float = MAX_GRAD_NORM,
                 base_epochs: int = 20, base_batch_size: int = 16, seed: int = 0):
        super().__init__(lam=lam, refresh_every=refresh_every, max_penalty_step=max_penalty_step,
                         lr=lr, momentum=momentum, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm,
                         base_epochs=base_epochs, base_batch_size=base_batch_size, seed=seed)

    def _importance(self, logits: torch.Tensor, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """|gradient of ||f(z)||_2^2|, through the step's own forward pass."""
        out = torch.autograd.grad(logits.pow(2).sum(), self.net.params)
        return [g.abs() for g in out]
