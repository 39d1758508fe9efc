"""TinyER: experience replay with a tiny episodic memory (Chaudhry et al. 2019, "On Tiny
Episodic Memories in Continual Learning").

The shared MLP head (hidden [256, 256], ReLU) of ``finetune`` with a replay memory of
``buffer`` items (``memory.ReplayMemory``, reservoir replacement: every stream item is held
with probability buffer / n_offered). Per incoming sample (z, y): ONE SGD step (lr 0.01,
momentum 0.9, weight decay 1e-5) on the mean cross-entropy of one mini-batch made of the new
sample and N1' = ``n_replay`` items drawn uniformly without replacement from the memory, then
the sample is offered to the memory.

Design choices:

- The new sample is not in the memory when it is replayed against it (offered after the
  step), so the batch is 1 + min(N1', size) distinct rows; the mean weighs the new sample by
  1 / (1 + N1'), as ER's joint batch does (the paper's section 5.3 fixes N1' = 16 for every
  replay method).
- ``fit_base`` is finetune's (``base_epochs`` epochs of shuffled ``base_batch_size`` batches,
  momentum carried on into the stream), then every base sample is offered to the memory in
  the order given, through the same reservoir rule as the stream.
- The memory stores no logits or scores (the reservoir ignores them): empty logits, zero loss.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.learners.base import register
from ciosl.learners.finetune import FineTune
from ciosl.learners.head import MAX_GRAD_NORM
from ciosl.learners.memory import ReplayMemory

_NO_LOGITS = torch.zeros(0)


@register
class TinyER(FineTune):
    name = "tinyer"
    description = "experience replay: new sample + N1' uniform replays from a reservoir memory"
    help = {
        **FineTune.help,
        "buffer": "replay memory capacity (items), reservoir replacement",
        "n_replay": "N1': replayed memory items per step",
        "seed": "seed of the weight init, the base shuffling, replay and reservoir draws",
    }
    conformance_settings: ClassVar[list[dict]] = [{"buffer": 16, "n_replay": 4}]

    def __init__(self, *, buffer: int = 1000, n_replay: int = 16, lr: float = 0.01,
                 momentum: float = 0.9, weight_decay: float = 1e-5,
                 max_grad_norm: float = MAX_GRAD_NORM, base_epochs: int = 20,
                 base_batch_size: int = 16, seed: int = 0):
        self.buffer = buffer
        self.n_replay = n_replay
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay,
                         max_grad_norm=max_grad_norm,
                         base_epochs=base_epochs, base_batch_size=base_batch_size, seed=seed)

    def _check_settings(self) -> None:
        super()._check_settings()
        if self.n_replay < 0:
            raise ValueError(f"{self.name}: n_replay must be >= 0, got {self.n_replay}")

    def _init_state(self, dim: int) -> None:
        super()._init_state(dim)
        self.memory = ReplayMemory(self.buffer, dim, replacement="reservoir")

    def memory_size(self) -> int:
        return len(self.memory)

    def _offer(self, z: Any, yi: int) -> None:
        self.memory.offer(z, yi, logits=_NO_LOGITS, loss=0.0, uncertainty=0.0, rng=self.rng)

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        super()._fit_base(Z, yi)
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    def _replay(self, z: np.ndarray, yi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The new sample followed by up to N1' uniform memory items: (1 + r, d), (1 + r,)."""
        return self._with_replay(torch.from_numpy(z)[None], torch.tensor([yi]))  # (1, d), (1,)

    def _with_replay(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New rows (b, d), (b,) followed by up to N1' uniform memory items."""
        if len(self.memory) and self.n_replay:
            Zm, ym = self.memory.batch(self.memory.sample_uniform(self.n_replay, self.rng))
            X, Y = torch.cat([X, Zm]), torch.cat([Y, ym])
        return X, Y

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        self._step(*self._replay(z, yi))  # mean CE over the joint batch
        self._offer(z, yi)

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Online / batch regimes: one step on the mini-batch + N1' replays, then each new
        sample is offered to the memory in order."""
        X = torch.from_numpy(np.ascontiguousarray(Z))  # (b, d)
        self._step(*self._with_replay(X, torch.from_numpy(yi)))
        for z, k in zip(Z, yi, strict=True):
            self._offer(z, int(k))

    def _undo_record(self, yi: np.ndarray) -> dict[str, Any]:
        return {**super()._undo_record(yi), "memory": self.memory.begin()}

    def _undo(self, record: dict[str, Any], n_classes: int) -> None:
        super()._undo(record, n_classes)
        self.memory.rollback(record["memory"])

    def _undo_done(self, record: dict[str, Any]) -> None:
        super()._undo_done(record)
        self.memory.commit()

    def _state(self) -> dict[str, Any]:
        return {**super()._state(), "memory": self.memory.state()}

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.memory.load(state["memory"])
