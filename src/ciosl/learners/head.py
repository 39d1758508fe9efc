"""The shared deterministic plastic head F(.): an MLP whose output layer grows with the classes.

Plain tensors and a hand-written SGD with momentum (same update as ``torch.optim.SGD``:
``d = g + wd * p; buf = m * buf + d; p -= lr * buf``) so that growing the output layer keeps
every learned weight and momentum buffer, and a one-sample step has no optimizer overhead.

Gradient-norm clipping (``SGD(max_grad_norm=...)``, ``clip_grad_norm_``; the streaming heads'
``max_grad_norm`` setting): before the momentum update, the step's gradient (every parameter
together) is scaled down to an L2 norm of at most ``max_grad_norm``, as
``torch.nn.utils.clip_grad_norm_`` does. One SGD step on one sample at the paper's lr 0.01 with
momentum 0.9 is past its stability bound on wide standardised inputs (``check_finite``): on
Fashion-MNIST pixels fine-tuning diverges, and on the iid streams it collapses to one class on
digits too. Clipping bounds every step (and so the momentum buffer, by
max_grad_norm / (1 - momentum)) without touching the steps that were already small.
"""

from __future__ import annotations

import ctypes
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

HIDDEN = (256, 256)
_ONE = torch.tensor(1.0)  # addcmul's second factor: m buf * 1 + d rounds m buf first

MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks up to 32 MiB come from the heap
TRIM_THRESHOLD = 256 << 20  # free heap kept (not returned to the system) up to 256 MiB


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve blocks up to ``MMAP_THRESHOLD`` from its heap and to keep
    freed memory for reuse (``mallopt``): a step replaces its parameters by new tensors (the
    state rule), and with glibc's defaults each such tensor of a few MiB is a fresh ``mmap``
    whose pages fault in at every step -- an out-of-place momentum step of a 256 x 1280 layer
    took 8x the in-place one, 1.35x with this (docs/findings/state-rule.md). Process-wide;
    done once at import; ``CIOSL_MALLOC=system`` leaves malloc as it is. Returns whether it
    was applied (False off glibc)."""
    if os.environ.get("CIOSL_MALLOC") == "system":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD)) and bool(libc.mallopt(-1, TRIM_THRESHOLD))
    except (OSError, AttributeError):  # not glibc
        return False


MALLOC_KEPT = keep_freed_memory()


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
        """The number of outputs (classes)."""
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
        """Add ``n_new`` output units (torch.nn.Linear's init): the output layer is replaced by
        a new one holding the old rows and the new ones (O(n_out x fan_in), the output layer's
        own arithmetic per step); no other layer is touched."""
        W, b = self.params[-2], self.params[-1]
        Wn, bn = self._layer(W.shape[1], n_new, generator)
        with torch.no_grad():
            self.params = [*self.params[:-2],
                           torch.cat([W, Wn.to(W.device)]).requires_grad_(True),
                           torch.cat([b, bn.to(b.device)]).requires_grad_(True)]

    def state(self) -> list[torch.Tensor]:
        """Copies of the parameters (for a learner's ``_state``)."""
        return [p.detach().clone() for p in self.params]

    def load(self, tensors: list[torch.Tensor]) -> None:
        """The parameters from ``state``'s copies (trainable)."""
        self.params = [t.detach().clone().requires_grad_(True) for t in tensors]

    def to(self, device: str | torch.device) -> MLP:
        """Move the parameters to ``device`` (same values; trainable)."""
        self.params = [p.detach().to(device).requires_grad_(True) for p in self.params]
        return self

    @torch.no_grad()
    def predict_proba(self, Z: np.ndarray, batch: int = 4096) -> np.ndarray:
        """Softmax of the outputs for the rows of ``Z`` (n, dim), float32 NumPy (n, n_out)."""
        device = self.params[0].device  # inputs go to the parameters, answers come back
        out = [torch.softmax(self.forward(torch.from_numpy(Z[i:i + batch]).to(device)), dim=1)
               for i in range(0, len(Z), batch)]
        return torch.cat(out).cpu().numpy()


def check_finite(loss: torch.Tensor, X: torch.Tensor, *, name: str, n_seen: int,
                 lr: float, momentum: float = 0.9, max_grad_norm: float | None = None) -> None:
    """Raise a clear FloatingPointError when training diverged (non-finite loss), instead of
    letting a model with NaN weights answer (it would predict one class forever).

    The hint: the softmax cross-entropy of one sample has curvature up to about ||x||^2 / 2 along
    the first layer's weights, and heavy-ball SGD is stable only while lr * curvature <
    2 (1 + momentum); so a step on one sample needs roughly lr < 4 (1 + momentum) / ||x||^2
    (standardised 784-d pixels: ||x||^2 ~ 650 median, 2700 at the 99th percentile).
    ``max_grad_norm``: the learner's gradient clipping, named in the message."""
    if not torch.isfinite(loss).all():
        sq = float(X.double().pow(2).sum(1).max()) if X.numel() else 0.0
        bound = (f"; one-sample SGD steps need roughly lr < 4 (1 + momentum) / ||x||^2 = "
                 f"{4 * (1 + momentum) / sq:.2g} for this step's largest ||x||^2 = {sq:.0f}"
                 f" (max |z| = {float(X.abs().max()):.3g})" if sq > 0 else "")
        clip = "" if max_grad_norm is None else f" and max_grad_norm={max_grad_norm:g}"
        fix = ("lower lr or max_grad_norm (--set NAME=VALUE)" if max_grad_norm is not None
               else "lower lr (--set lr=...)")
        raise FloatingPointError(
            f"{name}: training diverged at sample {n_seen} (non-finite loss) with lr={lr}"
            f"{clip}{bound}: {fix}, or rescale or clip the features")


MAX_GRAD_NORM = 1.0  # default gradient clipping of the streaming MLP heads (see SGD)


@torch.no_grad()
def clip_grad_norm_(grads: list[torch.Tensor | None], max_norm: float) -> float:
    """Scale ``grads`` in place so that their joint L2 norm is at most ``max_norm`` (``inf``:
    leave them); returns the norm before clipping. The one function every head's optimizer
    step calls (``SGD.step``; a head with its own step calls it on its gradients first)."""
    present = [g for g in grads if g is not None]
    if not present or not math.isfinite(max_norm):
        return 0.0
    if len(present) == 1:  # a flat head: one reduction, no stack (the same norm)
        norm = float(torch.linalg.vector_norm(present[0]))
    else:
        norm = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(present))))
    if norm > max_norm:  # a non-finite norm is left to check_finite / the loss to report
        torch._foreach_mul_(present, max_norm / norm)
    return norm


class SGD:
    """SGD with momentum and weight decay over a list of tensors that may grow; with a finite
    ``max_grad_norm`` the gradients are first clipped to that joint norm (``clip_grad_norm_``).
    ``step`` returns new parameters and replaces the momentum buffers: nothing is written in
    place (the state rule), with the arithmetic of ``torch.optim.SGD``'s in-place step."""

    def __init__(self, params: list[torch.Tensor], *, lr: float, momentum: float,
                 weight_decay: float, max_grad_norm: float = math.inf):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.max_grad_norm = max_grad_norm
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor | None] | tuple
             ) -> list[torch.Tensor]:
        """The parameters after one step on ``grads`` (new tensors, trainable leaves; a
        parameter without a gradient is kept): d = g + wd p; buf = m buf + d; p - lr buf.
        ``grads`` are the step's own tensors (clipped in place)."""
        grads = list(grads)
        if math.isfinite(self.max_grad_norm):
            clip_grad_norm_(grads, self.max_grad_norm)
        new_params, new_buffers = [], []
        for p, g, buf in zip(params, grads, self.buffers, strict=True):
            if g is None:
                new_params.append(p)
                new_buffers.append(buf)
                continue
            d = g.add(p, alpha=self.weight_decay) if self.weight_decay else g
            fresh = None  # first step / grown: 0 * m + d == d, into the new zero-padded buffer
            if buf is None or buf.shape != p.shape:
                buf = fresh = self._fit(buf, p.shape, p.device)
            # m buf + d in one pass, m buf rounded before the sum: buf.mul(m).add_(d)'s bits
            buf = torch.addcmul(d, buf, _ONE, value=self.momentum, out=fresh)
            new_buffers.append(buf)
            new_params.append(p.detach().sub(buf, alpha=self.lr).requires_grad_(p.requires_grad))
        self.buffers = new_buffers
        return new_params

    @staticmethod
    def _fit(buf: torch.Tensor | None, shape: torch.Size,
             device: torch.device | None = None) -> torch.Tensor:
        """A momentum buffer zero-padded to a grown parameter's shape (a new tensor)."""
        out = torch.zeros(shape, device=device)
        if buf is not None:
            out[tuple(slice(0, s) for s in buf.shape)] = buf
        return out

    def state(self) -> list[torch.Tensor | None]:
        """Copies of the momentum buffers (for a learner's ``_state``)."""
        return [None if b is None else b.clone() for b in self.buffers]

    def load(self, buffers: list[torch.Tensor | None]) -> None:
        """The momentum buffers from ``state``'s copies."""
        self.buffers = [None if b is None else b.clone() for b in buffers]


def train_offline(Z: np.ndarray, yi: np.ndarray, n_classes: int, *, epochs: int,
                  batch_size: int, seed: int, lr: float = 0.01, momentum: float = 0.9,
                  weight_decay: float = 1e-5, hidden: tuple[int, ...] = HIDDEN,
                  device: str = "cpu") -> MLP:
    """Train a fresh MLP head on (Z, yi) for several epochs of shuffled mini-batches, on
    ``device`` (the initial weights and the shuffles come from the CPU generator either way;
    the head stays on ``device``, its ``predict_proba`` answers in numpy)."""
    gen = torch.Generator().manual_seed(int(seed))
    net = MLP(Z.shape[1], n_classes, hidden, generator=gen)
    if device != "cpu":
        net.to(device)
    opt = SGD(net.params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    X = torch.from_numpy(np.ascontiguousarray(Z, dtype=np.float32)).to(device)
    Y = torch.from_numpy(np.asarray(yi, dtype=np.int64)).to(device)
    for _ in range(epochs):
        perm = torch.randperm(len(X), generator=gen).to(device)
        for s in range(0, len(X), batch_size):
            idx = perm[s:s + batch_size]
            loss = F.cross_entropy(net(X[idx]), Y[idx])
            check_finite(loss, X[idx], name="offline training", n_seen=s, lr=lr)
            net.params = opt.step(net.params, torch.autograd.grad(loss, net.params))
    return net
