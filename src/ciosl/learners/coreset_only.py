"""Coreset only (Farquhar & Gal 2018, "Towards Robust Evaluations of Continual Learning"; the
"coreset only" baseline of VCL): ``vcl_coreset`` without the continual prior.

Everything is ``vcl_coreset`` (streaming step, coreset filled online, a copy of the head
fine-tuned on the coreset before inference, cached until the next update), except that the
prior is ALWAYS the initial prior N(0, s^2 / fan_in): the streaming step's KL, the base
training's and the fine-tuning's all pull towards it, and the posterior never becomes a prior
(no ``prior_refresh`` / ``refresh_every`` settings; internally ``prior_refresh = "never"``).
Whatever the head retains of the past comes from plain sequential training and from the
coreset fine-tuning. Fine-tuning before inference breaks the single-pass rule
(``violates_single_pass``).

Design choices: as ``vcl_coreset`` (reservoir coreset by default, fine-tuning from the streamed
posterior for ``finetune_epochs`` epochs with KL weight lambda1 / |C|, whose curvature cap
1 / lr never binds here: the initial prior's precision fan_in / s^2 is small). The
fine-tuning starts from the streamed posterior, not from scratch, so the two methods differ in
the prior only.
"""

from __future__ import annotations

from typing import ClassVar

from ciosl.learners.base import register
from ciosl.learners.bayes_head import BAYES_MAX_GRAD_NORM, FISHER_DECAY, BayesHead
from ciosl.learners.vcl_coreset import VCLCoreset


@register
class CoresetOnly(VCLCoreset):
    name = "coreset_only"
    violates_single_pass = True
    description = ("Bayesian MLP head with the initial prior only + a coreset filled online; a "
                   "copy of the head is fine-tuned on it before each inference")
    prior_refresh: ClassVar[str] = "never"  # the posterior never becomes the prior
    refresh_every: ClassVar[int] = 1  # unused with "never"
    choices = {k: v for k, v in VCLCoreset.choices.items() if k != "prior_refresh"}
    help = {k: v for k, v in VCLCoreset.help.items()
            if k not in ("prior_refresh", "refresh_every")}
    help["lambda1"] = "weight of KL(q || initial prior) in the tempered ELBO (T / N per sample)"
    conformance_settings: ClassVar[list[dict]] = [{"buffer": 12, "finetune_epochs": 3}]

    def __init__(self, *, buffer: int = 1000, replacement: str = "reservoir",
                 finetune_epochs: int = 10, finetune_batch_size: int = 16,
                 lambda1: float = 1.0, prediction: str = "mean", mc_samples: int = 5,
                 temperature: float = 1e-4,
                 fisher_decay: float = FISHER_DECAY, prior_scale: float = 1.0, lr: float = 0.01,
                 max_grad_norm: float = BAYES_MAX_GRAD_NORM,
                 momentum: float = 0.9, weight_decay: float = 1e-5, base_epochs: int = 10,
                 base_batch_size: int = 16, seed: int = 0):
        # vcl_coreset's constructor would store prior_refresh and refresh_every as settings
        self.buffer = buffer
        self.replacement = replacement
        self.finetune_epochs = finetune_epochs
        self.finetune_batch_size = finetune_batch_size
        self.lambda1 = lambda1
        self.prediction = prediction
        self.mc_samples = mc_samples
        self.temperature = temperature
        self.fisher_decay = fisher_decay
        self.prior_scale = prior_scale
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.base_epochs = base_epochs
        self.base_batch_size = base_batch_size
        BayesHead.__init__(self, seed=seed)
