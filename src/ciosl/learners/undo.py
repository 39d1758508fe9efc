"""Cheap all-or-nothing: class-indexed arrays that grow by capacity doubling, and undo records
of only what a step overwrites.

``Learner`` calls a learner's ``_undo_record(yi)`` before a call that may grow the model (a new
class, a ``learn_many`` batch, ``fit_base``) and its ``_undo(record, n_classes)`` if the call
raises; the learner restores what the record holds and drops the classes from ``n_classes``
on. Nothing here copies a learner's whole state:

- ``Rows``: a (n, ...) tensor grown by capacity doubling (a new class costs amortised O(row)),
  rolled back by truncation;
- ``keep(obj, *mutable)``: an object's attributes by reference (lists and dicts as shallow
  copies), plus copies of the contents of the tensors named in ``mutable`` -- those a step
  changes in place. Everything a step *replaces* (a grown layer, a refreshed prior) is restored
  by putting the old reference back, at no copy;
- ``keep_attrs(obj, names, mutable)``: the same for some attributes only.
"""

from __future__ import annotations

from typing import Any

import torch


class Rows:
    """A tensor of ``n`` rows of shape ``tail`` in a buffer grown by capacity doubling: adding a
    row costs amortised O(row size), whatever ``n``; ``truncate`` is O(1)."""

    def __init__(self, tail: tuple[int, ...], dtype: torch.dtype, data: torch.Tensor | None = None):
        self.tail, self.dtype = tuple(tail), dtype
        self.buf = torch.zeros((8, *self.tail), dtype=dtype)
        self.n = 0
        if data is not None:
            self.set(data)

    @property
    def view(self) -> torch.Tensor:
        """The ``n`` rows (a view: writes go to the buffer)."""
        return self.buf[:self.n]

    def reserve(self, n: int) -> None:
        if n > len(self.buf):
            cap = max(n, 2 * len(self.buf))
            new = torch.zeros((cap, *self.tail), dtype=self.dtype)
            new[:self.n] = self.buf[:self.n]
            self.buf = new

    def grow(self, k: int = 1) -> None:
        """Append ``k`` rows of zeros (the rows past ``n`` are kept at zero: no write here)."""
        self.reserve(self.n + k)
        self.n += k

    def truncate(self, n: int) -> None:
        if n < self.n:
            self.buf[n:self.n].zero_()
            self.n = n

    def set(self, data: torch.Tensor) -> None:
        """Replace the rows by ``data`` (n, *tail) (copied)."""
        self.truncate(0)
        self.reserve(len(data))
        self.buf[:len(data)] = data
        self.n = len(data)


def _contents(v: Any) -> Any:
    """Copies of a tensor's or a list of tensors' values (None kept)."""
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, list | tuple):
        return [_contents(x) for x in v]
    return None


def _copy_back(v: Any, saved: Any) -> None:
    if isinstance(v, torch.Tensor) and saved is not None:
        with torch.no_grad():
            v.copy_(saved)
        if v.requires_grad:
            v.grad = None  # a gradient left by the failed step would add to the next one
    elif isinstance(v, list | tuple):
        for x, s in zip(v, saved, strict=True):
            _copy_back(x, s)


def _shallow(v: Any) -> Any:
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def keep_attrs(obj: Any, names: tuple[str, ...] | list[str], mutable: tuple[str, ...] = ()
               ) -> tuple:
    """An undo record of ``obj``'s attributes ``names`` (see the module docstring)."""
    values = {k: _shallow(getattr(obj, k)) for k in names}
    return obj, values, {k: _contents(values[k]) for k in mutable}, False


def keep(obj: Any, *mutable: str) -> tuple:
    """An undo record of every attribute of ``obj`` (attributes added later are removed on
    ``restore``)."""
    return *keep_attrs(obj, list(vars(obj)), mutable)[:3], True


def restore(record: tuple) -> None:
    """Put back what ``keep`` / ``keep_attrs`` recorded."""
    obj, values, contents, whole = record
    if whole:
        for k in [k for k in vars(obj) if k not in values]:
            delattr(obj, k)
    for k, v in values.items():
        setattr(obj, k, _shallow(v))
    for k, saved in contents.items():
        _copy_back(values[k], saved)
