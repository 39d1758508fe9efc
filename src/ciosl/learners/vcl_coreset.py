"""VCL with a coreset (Nguyen et al. 2018, "Variational Continual Learning"), filled online.

The streaming learner is exactly ``vcl`` plus a coreset of ``buffer`` items
(``memory.ReplayMemory``, reservoir by default). Before inference, a COPY of the head is
fine-tuned on the coreset and answers; the streamed posterior never sees the fine-tuning (VCL's
q~_t is propagated, q_t only predicts). Fine-tuning before inference breaks the single-pass rule
(``violates_single_pass``; the paper marks VCL w/ C red).

- Every sample is learned by the streaming step AND offered to the coreset.
- Fine-tuning starts from q~_t with prior q~_t, for ``finetune_epochs`` epochs of the coreset,
  the streaming step's objective with a fresh momentum buffer; its KL weight lambda1 T / |C| is
  capped so that the KL's curvature on a mean stays <= 1 / lr.
- The fine-tuned copy is a cache (not state) keyed by (samples seen, classes), rebuilt
  identically from the same state: its generator is seeded by (seed, samples seen).

Design rationale and measurements: docs/findings/bayesian-head.md.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import register
from ciosl.learners.bayes_head import BAYES_MAX_GRAD_NORM, FISHER_DECAY
from ciosl.learners.bnn import BayesMLP
from ciosl.learners.memory import ReplayMemory
from ciosl.learners.vcl import VCL

_NO_LOGITS = torch.zeros(0)
CORESET_POLICIES = ("reservoir", "class_balanced_random")


@register
class VCLCoreset(VCL):
    name = "vcl_coreset"
    violates_single_pass = True
    description = ("VCL + a coreset filled online; a copy of the head is fine-tuned on it "
                   "before each inference")
    choices = {**VCL.choices, "replacement": CORESET_POLICIES}
    help = {
        "buffer": "coreset capacity (items)",
        "replacement": "coreset policy: reservoir (uniform random subset of the stream) or "
                       "class_balanced_random",
        "finetune_epochs": "epochs of coreset fine-tuning (on a copy) before inference",
        "finetune_batch_size": "mini-batch size of the coreset fine-tuning",
        **VCL.help,
        "seed": "seed of the init, the noise draws, the coreset's choices and the fine-tuning",
    }
    conformance_settings: ClassVar[list[dict]] = [
        {"buffer": 12, "finetune_epochs": 3},
        {"replacement": "class_balanced_random", "prediction": "mc", "buffer": 20},
    ]

    def __init__(self, *, buffer: int = 1000, replacement: str = "reservoir",
                 finetune_epochs: int = 10, finetune_batch_size: int = 16,
                 lambda1: float = 1.0, prior_refresh: str = "every", refresh_every: int = 500,
                 prediction: str = "mean", mc_samples: int = 5, temperature: float = 1e-4,
                 fisher_decay: float = FISHER_DECAY,
                 prior_scale: float = 1.0, lr: float = 0.01,
                 max_grad_norm: float = BAYES_MAX_GRAD_NORM, momentum: float = 0.9,
                 weight_decay: float = 1e-5, base_epochs: int = 10, base_batch_size: int = 16,
                 seed: int = 0):
        self.buffer = buffer
        self.replacement = replacement
        self.finetune_epochs = finetune_epochs
        self.finetune_batch_size = finetune_batch_size
        super().__init__(lambda1=lambda1, prior_refresh=prior_refresh,
                         refresh_every=refresh_every, prediction=prediction,
                         mc_samples=mc_samples, temperature=temperature,
                         fisher_decay=fisher_decay, prior_scale=prior_scale,
                         lr=lr, max_grad_norm=max_grad_norm, momentum=momentum,
                         weight_decay=weight_decay, base_epochs=base_epochs,
                         base_batch_size=base_batch_size, seed=seed)

    def _conditions(self) -> list[tuple[str, bool, str]]:
        return [*super()._conditions(), ("buffer", self.buffer >= 1, ">= 1"),
                ("finetune_epochs", self.finetune_epochs >= 0, ">= 0"),
                ("finetune_batch_size", self.finetune_batch_size >= 1, ">= 1")]

    # ------------------------------------------------------------------ state
    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)
        self.memory = ReplayMemory(self.buffer, dim, replacement=self.replacement)
        self._tuned: BayesMLP | None = None  # the fine-tuned copy, valid for _tuned_key
        self._tuned_key: tuple[int, int] = (-1, -1)

    def memory_size(self) -> int:
        return len(self.memory)

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        return {**super()._undo_record(yi), "memory": self.memory.begin(),
                "tuned": (self._tuned, self._tuned_key)}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        self.memory.rollback(record["memory"])
        self._tuned, self._tuned_key = record["tuned"]

    def _undo_done(self, record: dict[str, Any]) -> None:
        super()._undo_done(record)
        self.memory.commit()

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "memory": self.memory.state()}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.memory.load(state["memory"])
        self._tuned = None

    # ------------------------------------------------------------------ learning
    def _offer(self, z: Any, yi: int) -> None:
        self.memory.offer(z, yi, logits=_NO_LOGITS, loss=0.0, uncertainty=0.0, rng=self.rng)

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._learn_batch(Z, yi)  # VCL's _learn_one is a batch of one: streaming too
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._fit_base(Z, yi)
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    # ------------------------------------------------------------------ inference
    def finetuned_head(self) -> BayesMLP:
        """A copy of the head fine-tuned on the coreset (cached until the next update)."""
        key = (self.n_seen_, self.net.n_out)
        if self._tuned is None or self._tuned_key != key:
            self._tuned, self._tuned_key = self._finetune(), key
        return self._tuned

    def _finetune(self) -> BayesMLP:
        # a shallow twin shares the settings and reads nothing else; it gets its own head,
        # optimizer, gradient buffer and generator, so the learner's state is untouched
        twin = copy.copy(self)
        twin.net = self._new_net(int(self.dim_), self.net.n_out, torch.Generator())
        twin.net.load(self.net.state())
        if self.prior_refresh != "never":
            twin.net.refresh_prior()  # VCL: the prior of the fine-tuning is q~_t itself
        twin.opt = self._new_opt(twin.net)
        twin._grad = torch.zeros_like(twin.net.mu)
        twin.torch_rng = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + self.n_seen_)
        Zm, ym = self.memory.batch(np.arange(len(self.memory)))  # (m, d), (m,)
        kl_scale = min(self._kl_scale(len(ym)),
                       1.0 / (self.lr * float(twin.net.prior_prec.max())))  # curvature <= 1/lr
        twin._train(Zm, ym, epochs=self.finetune_epochs, batch_size=self.finetune_batch_size,
                    n_data=self.n_seen_, kl_scale=kl_scale)
        return twin.net

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        return self._predict_net(self.finetuned_head(), Z)  # (n, n_seen)
