"""The shared deterministic plastic head F(.): an MLP whose output layer grows with the classes.

Plain tensors and a hand-written SGD with momentum (same update as ``torch.optim.SGD``:
``d = g + wd * p; buf = m * buf + d; p -= lr * buf``) so that growing the output layer keeps
every learned weight and momentum buffer, and a one-sample step has no optimizer overhead.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN = (256, 256)


def _uniform(shape: tuple[int, ...], bound: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=gen) * 2.0 - 1.0) * bound


class MLP:
    """Fully connected ReLU network dim -> hidden... -> n_out (torch.nn.Linear's init)."""

    def __init__(self, dim: int, n_out: int, hidden: tuple[int, ...] = HIDDEN, *,
                 generator: torch.Generator):
        sizes = [dim, *hidden]
        self.params: list[torch.Tensor] = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            self.params += self._layer(fan_in, fan_out, generator)
        self.params += self._layer(sizes[-1], n_out, generator)
        for p in self.params:
            p.requires_grad_(True)

    @staticmethod
    def _layer(fan_in: int, fan_out: int, gen: torch.Generator) -> list[torch.Tensor]:
        bound = 1.0 / math.sqrt(fan_in)
        return [_uniform((fan_out, fan_in), bound, gen), _uniform((fan_out,), bound, gen)]

    @property
    def n_out(self) -> int:
        return int(self.params[-1].shape[0])

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        h = X
        n_layers = len(self.params) // 2
        for i in range(n_layers):
            W, b = self.params[2 * i], self.params[2 * i + 1]
            h = F.linear(h, W, b)  # (n, fan_out)
            if i < n_layers - 1:
                h = F.relu(h)
        return h

    __call__ = forward

    def grow(self, n_new: int, generator: torch.Generator) -> None:
        """Add ``n_new`` output units; existing weights are untouched."""
        W, b = self.params[-2], self.params[-1]
        Wn, bn = self._layer(W.shape[1], n_new, generator)
        self.params[-2] = torch.cat([W.detach(), Wn]).requires_grad_(True)
        self.params[-1] = torch.cat([b.detach(), bn]).requires_grad_(True)

    def state(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def load(self, tensors: list[torch.Tensor]) -> None:
        self.params = [t.detach().clone().requires_grad_(True) for t in tensors]

    @torch.no_grad()
    def predict_proba(self, Z: np.ndarray, batch: int = 4096) -> np.ndarray:
        out = [torch.softmax(self.forward(torch.from_numpy(Z[i:i + batch])), dim=1)
               for i in range(0, len(Z), batch)]
        return torch.cat(out).numpy()


def check_finite(loss: torch.Tensor, X: torch.Tensor, *, name: str, n_seen: int,
                 lr: float, momentum: float = 0.9) -> None:
    """Raise a clear FloatingPointError when training diverged (non-finite loss), instead of
    letting a model with NaN weights answer (it would predict one class forever).

    The hint: the softmax cross-entropy of one sample has curvature up to about ||x||^2 / 2 along
    the first layer's weights, and heavy-ball SGD is stable only while lr * curvature <
    2 (1 + momentum); so a step on one sample needs roughly lr < 4 (1 + momentum) / ||x||^2
    (standardised 784-d pixels: ||x||^2 ~ 650 median, 2700 at the 99th percentile)."""
    if not torch.isfinite(loss).all():
        sq = float(X.double().pow(2).sum(1).max()) if X.numel() else 0.0
        bound = (f"; one-sample SGD steps need roughly lr < 4 (1 + momentum) / ||x||^2 = "
                 f"{4 * (1 + momentum) / sq:.2g} for this step's largest ||x||^2 = {sq:.0f}"
                 f" (max |z| = {float(X.abs().max()):.3g})" if sq > 0 else "")
        raise FloatingPointError(
            f"{name}: training diverged at sample {n_seen} (non-finite loss) with lr={lr}"
            f"{bound}: lower lr (--set lr=...), or rescale or clip the features")


class SGD:
    """SGD with momentum and weight decay over a list of tensors that may grow."""

    def __init__(self, params: list[torch.Tensor], *, lr: float, momentum: float,
                 weight_decay: float):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    @torch.no_grad()
    def step(self, params: list[torch.Tensor]) -> None:
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            d = p.grad
            if self.weight_decay:
                d = d.add(p, alpha=self.weight_decay)
            buf = self.buffers[i]
            if buf is None or buf.shape != p.shape:
                buf = self._fit(buf, p.shape)  # first step: 0 * m + d == d, as torch does
            buf.mul_(self.momentum).add_(d)
            self.buffers[i] = buf
            p.sub_(buf, alpha=self.lr)
            p.grad = None

    @staticmethod
    def _fit(buf: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
        """Zero-pad a momentum buffer to a grown parameter's shape."""
        out = torch.zeros(shape)
        if buf is not None:
            out[tuple(slice(0, s) for s in buf.shape)] = buf
        return out

    def state(self) -> list[torch.Tensor | None]:
        return [None if b is None else b.clone() for b in self.buffers]

    def load(self, buffers: list[torch.Tensor | None]) -> None:
        self.buffers = [None if b is None else b.clone() for b in buffers]


def train_offline(Z: np.ndarray, yi: np.ndarray, n_classes: int, *, epochs: int,
                  batch_size: int, seed: int, lr: float = 0.01, momentum: float = 0.9,
                  weight_decay: float = 1e-5, hidden: tuple[int, ...] = HIDDEN) -> MLP:
    """Train a fresh MLP head on (Z, yi) for several epochs of shuffled mini-batches."""
    gen = torch.Generator().manual_seed(int(seed))
    net = MLP(Z.shape[1], n_classes, hidden, generator=gen)
    opt = SGD(net.params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    X = torch.from_numpy(np.ascontiguousarray(Z, dtype=np.float32))
    Y = torch.from_numpy(np.asarray(yi, dtype=np.int64))
    for _ in range(epochs):
        perm = torch.randperm(len(X), generator=gen)
        for s in range(0, len(X), batch_size):
            idx = perm[s:s + batch_size]
            loss = F.cross_entropy(net(X[idx]), Y[idx])
            check_finite(loss, X[idx], name="offline training", n_seen=s, lr=lr)
            loss.backward()
            opt.step(net.params)
    return net
