"""A tensor whose rows grow by capacity doubling, in a small pool of buffers, so that a new class
costs no pass over the rows, the rows before a call survive its step for rollback without a
copy, and another store can take the rows as its value without a copy (``lend``).

An MLP head's output layer (weights, bias) and its momentum grow one row per class. Growing by
concatenation reads and writes every row; ``Rows`` (``undo.py``) grows in place, but a step then
updates the rows in place and a failed call would need a copy of them to roll back. Here:

- ``live``: the ``n`` live rows, a view of the current buffer (``requires_grad`` for a
  parameter); ``grow(rows)`` writes the new rows after them (the rows before are untouched, a
  view of them stays valid) and makes a new ``live`` view; past the capacity the pool is
  reallocated at twice the size (amortised O(row) per row);
- ``guard()`` (at the start of a call that may have to be undone): the buffers that the state
  before the call uses (the current one, the one lent) are locked until ``unlock`` (the call
  succeeded) or the next ``guard``: no update writes into them, so the call is undone by
  putting back the old view and counters (``snapshot`` / ``restore``): no copy;
- ``lend()``: the live rows as a read-only value for another store (EWC's anchor theta* :=
  theta, its frozen importance Omega := Omega_run): the buffer is marked lent and the next
  update writes its result into another buffer. Re-anchoring is then a reference, not a copy;
- ``target()``: (the rows to update, where their new values go): the current buffer in place,
  or, when it is locked or lent, a free buffer of the pool, which becomes current. An update
  reads the old rows and writes the new ones either way (``torch.sub(p, buf, out=...)`` costs
  what ``p.sub_(buf)`` does, with the same bits). The pool holds two buffers, and up to four
  when buffers are lent and locked (the current, the lent one, the two locked by the guard).

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
        """Rows ``data`` (n, ...) copied into a fresh pool of twice the capacity."""
        data = data.detach()
        n = len(data)
        self._fresh_pool(data, n, max(8, 2 * n))

    def _fresh_pool(self, data: torch.Tensor, n: int, cap: int) -> None:
        self.bufs = [data.new_empty((cap, *data.shape[1:])) for _ in range(2)]
        self.bufs[0][:n] = data[:n]
        self.cur, self.n = 0, n
        self._moved: torch.Tensor | None = None  # the rows ``target`` moved the live ones to
        self.lent: torch.Tensor | None = None  # the buffer another store reads (``lend``)
        self.locked: tuple[torch.Tensor, ...] = ()  # the buffers the guarded call must keep
        self._view()

    def _view(self) -> None:
        self.live = self.bufs[self.cur][:self.n]
        if self.grad:
            self.live.requires_grad_(True)

    def holds(self, t: torch.Tensor | None) -> bool:
        """Whether ``t`` is this object's live view (not a tensor loaded or replaced since)."""
        return t is self.live

    def guard(self) -> None:
        """Lock the buffers the state before a call uses (the current one, the lent one): until
        the next ``guard``, no update writes into them."""
        self.locked = (self.bufs[self.cur],) if self.lent is None else (
            self.bufs[self.cur], self.lent)

    def unlock(self) -> None:
        """The guarded call succeeded: its buffers are free again (a later write may use them
        rather than a buffer more)."""
        self.locked = ()

    def lend(self) -> torch.Tensor:
        """The live rows as a value another store keeps (a view, no copy, not a trainable
        leaf); the next update writes into another buffer, so the value stays as it is. The
        buffer lent before is free again (its borrower has moved on; a guarded call keeps it
        locked)."""
        self.lent = self.bufs[self.cur]
        return self.live.detach() if self.grad else self.live

    def _protected(self, buf: torch.Tensor) -> bool:
        if buf is self.lent:
            return True
        for b in self.locked:
            if buf is b:
                return True
        return False

    def snapshot(self) -> tuple:
        """What ``restore`` needs to put this object back as it is (references, no copy; the
        buffers the rows are in must be left unwritten: ``guard``)."""
        return (self, list(self.bufs), self.cur, self.n, self.live, self.lent, self.locked)

    @staticmethod
    def restore(snap: tuple) -> None:
        """Put back what ``snapshot`` recorded."""
        pp, bufs, pp.cur, pp.n, pp.live, pp.lent, pp.locked = snap
        pp.bufs, pp._moved = bufs, None

    def grow_zeros(self, k: int) -> torch.Tensor:
        """``grow`` with ``k`` rows of zeros (written in place: no tensor of zeros made)."""
        n = self.n
        if n + k > len(self.bufs[0]):
            self._fresh_pool(self.bufs[self.cur], n, max(n + k, 2 * len(self.bufs[0])))
        self.bufs[self.cur][n:n + k].zero_()
        self.n = n + k
        self._view()
        return self.live

    def grow(self, rows: torch.Tensor) -> torch.Tensor:
        """Append ``rows`` (k, ...) after the live rows; returns the new live view. (The rows
        go after the ``n`` rows of the current buffer: a lent or locked value is ``n`` rows, so
        it is untouched.)"""
        n, k = self.n, len(rows)
        if n + k > len(self.bufs[0]):  # a fresh pool; the old buffers are left untouched
            self._fresh_pool(self.bufs[self.cur], n, max(n + k, 2 * len(self.bufs[0])))
        self.bufs[self.cur][n:n + k] = rows.detach()
        self.n = n + k
        self._view()
        return self.live

    def target(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rows to update, where their new values go): the same view, or, when the current
        buffer is locked or lent, the rows of a free buffer, which become the live ones (call
        ``_view`` through ``commit``)."""
        old = self.live
        if not self._protected(self.bufs[self.cur]):
            return old, old
        free = None
        for i, b in enumerate(self.bufs):
            if i != self.cur and not self._protected(b):
                free = i
                break
        if free is None:  # every buffer is in use (lent and locked): one more
            self.bufs = [*self.bufs, self.bufs[self.cur].new_empty(self.bufs[self.cur].shape)]
            free = len(self.bufs) - 1
        self.cur = free
        self._moved = new = self.bufs[free][:self.n]
        return old, new

    def commit(self) -> torch.Tensor:
        """After a write through ``target``: the live view (the rows written if it moved)."""
        new = self._moved
        if new is not None:
            self._moved = None
            if self.grad:
                new.requires_grad_(True)
            self.live = new
        return self.live


class Borrowed:
    """A value that one store keeps without owning storage: another store's rows lent to it
    (``PingPong.lend``), or a tensor of its own that nobody writes (a loaded value). It is only
    ever replaced, never written."""

    def __init__(self, value: torch.Tensor):
        self.live = value

    def snapshot(self) -> tuple:  # the same undo protocol as ``PingPong`` (nothing to lock)
        return self, self.live

    @staticmethod
    def restore(snap: tuple) -> None:
        snap[0].live = snap[1]

    def guard(self) -> None:
        pass

    def unlock(self) -> None:
        pass
