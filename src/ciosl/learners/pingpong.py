"""A tensor whose rows grow by capacity doubling, in two buffers, so that a new class costs no
pass over the rows and the rows before a call survive its step for rollback without a copy.

An MLP head's output layer (weights, bias) and its momentum grow one row per class. Growing by
concatenation reads and writes every row; ``Rows`` (``undo.py``) grows in place, but a step then
updates the rows in place and a failed call would need a copy of them to roll back. Here:

- ``live``: the ``n`` live rows, a view of the current buffer (``requires_grad`` for a
  parameter); ``grow(rows)`` writes the new rows after them (the rows before are untouched, a
  view of them stays valid) and makes a new ``live`` view; past the capacity both buffers are
  reallocated at twice the size (amortised O(row) per row);
- ``guard()`` (at the start of a call that may have to be undone): the next update writes its
  result into the *other* buffer (``target``), which becomes current; the rows as they were
  before the call stay where they were, untouched, so the call is undone by putting back the
  old view and counters (``keep(self)``): no copy. An update reads the old rows and writes
  the new ones either way (``torch.sub(p, buf, out=...)`` costs what ``p.sub_(buf)`` does).

The buffers are allocated uninitialised (``new_empty``): no row past ``n`` is ever read, and
capacity that is never written costs no resident memory (a spare buffer becomes resident once a
guarded call writes it).

Only live rows are saved (``state_dict`` clones ``live``); a tensor loaded from a file is
adopted as is (``adopt``).
"""

from __future__ import annotations

import torch


class PingPong:
    def __init__(self, data: torch.Tensor, *, grad: bool = False):
        self.grad = grad  # live is a trainable leaf
        self.adopt(data)

    def adopt(self, data: torch.Tensor) -> None:
        """Rows ``data`` (n, ...) copied into fresh buffers of twice the capacity."""
        data = data.detach()
        n, cap = len(data), max(8, 2 * len(data))
        self.bufs = [data.new_empty((cap, *data.shape[1:])) for _ in range(2)]
        self.bufs[0][:n] = data
        self.cur, self.n, self.guarded = 0, n, False
        self._view()

    def _view(self) -> None:
        self.live = self.bufs[self.cur][:self.n]
        if self.grad:
            self.live.requires_grad_(True)

    def holds(self, t: torch.Tensor | None) -> bool:
        """Whether ``t`` is this object's live view (not a tensor loaded or replaced since)."""
        return t is self.live

    def guard(self) -> None:
        self.guarded = True

    def grow(self, rows: torch.Tensor) -> torch.Tensor:
        """Append ``rows`` (k, ...) after the live rows; returns the new live view."""
        n, k = self.n, len(rows)
        if n + k > len(self.bufs[0]):  # both buffers anew; the old ones are left untouched
            cap = max(n + k, 2 * len(self.bufs[0]))
            old = self.bufs[self.cur]
            self.bufs = [old.new_empty((cap, *old.shape[1:])) for _ in range(2)]
            self.bufs[0][:n] = old[:n]
            self.cur, self.guarded = 0, False  # the rows before the call are safe in ``old``
        self.bufs[self.cur][n:n + k] = rows.detach()
        self.n = n + k
        self._view()
        return self.live

    def target(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows to update, where their new values go): the same view, or, guarded, the
        other buffer's rows, which become the live ones (call ``_view`` through ``commit``)."""
        old = self.live
        if not self.guarded:
            return old, old
        self.guarded = False
        self.cur ^= 1
        return old, self.bufs[self.cur][:self.n]

    def commit(self) -> torch.Tensor:
        """After a write through ``target``: the live view (a new object if it moved)."""
        if self.live.data_ptr() != self.bufs[self.cur].data_ptr():
            self._view()
        return self.live
