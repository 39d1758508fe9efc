"""Rollback by references: the records a learner's ``_undo_record`` returns, and the rows that
grow by capacity doubling.

The state rule (docs/design.md, "State: one rule"): a tensor, once published in a learner's
state, is never written in place; a step computes new tensors and assigns them after its checks.
So a record of a call is the object's attributes by reference, taken before the call, and
rollback puts them back -- no value is copied:

- ``keep(obj)``: every attribute of ``obj`` by reference (lists and dicts as shallow copies;
  attributes added later are removed on ``restore``);
- ``keep_attrs(obj, names)``: the same for some attributes only;
- ``Rows``: a class-indexed (n, ...) tensor grown in place past its live length by capacity
  doubling (a new class costs amortised O(row)); rollback truncates it, and a reader sees only
  the rows below the length it read.
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


def _shallow(v: Any) -> Any:
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def keep_attrs(obj: Any, names: tuple[str, ...] | list[str]) -> tuple:
    """A record of ``obj``'s attributes ``names``, by reference."""
    return obj, {k: _shallow(getattr(obj, k)) for k in names}, False


def keep(obj: Any) -> tuple:
    """A record of every attribute of ``obj``, by reference (attributes added later are removed
    on ``restore``)."""
    return obj, {k: _shallow(v) for k, v in vars(obj).items()}, True


def restore(record: tuple) -> None:
    """Put back what ``keep`` / ``keep_attrs`` recorded."""
    obj, values, whole = record
    if whole:
        for k in [k for k in vars(obj) if k not in values]:
            delattr(obj, k)
    for k, v in values.items():
        setattr(obj, k, _shallow(v))
