"""A flat vector [head, Wo, bo] whose output layer grows in place, in two buffers, so that a new
class costs no pass over the vector and a call that grew it can be undone (``bnn.BayesMLP``).

The Bayesian head keeps every per-parameter quantity (means, Fisher, prior, momentum) as one
flat (P,) vector in the layout [W1, b1, ..., Wo, bo]: the output layer last, its bias after its
weights. ``Flat`` stores it in a buffer with room for twice the output rows; the live vector is
the view ``buf[:P]`` (offset 0, contiguous: every reduction over it sees what a fresh tensor
would). A new unit moves ``bo`` (n_out elements) right by fan_in, writes the new row of ``Wo``
where ``bo`` was and appends the new bias: O(fan_in + n_out), the layout unchanged. Past the
capacity the buffers are reallocated at twice the rows (amortised O(row) per row; the old
buffers are left as they were).

All-or-nothing (``undo.py``): ``snapshot()`` (before a call) and ``restore(snap)`` (if it
raised). The second buffer is the spare (``pingpong.py`` does the same for the plain MLP
heads): after ``guard()``, the next write (``target``) goes to the spare buffer, which becomes
current, and the buffer of the snapshot keeps the values it had; writes after that go in place.
Growth is in place: ``restore`` moves ``bo`` back (the buffers record the output size each one
is laid out for), so a call that grew and stepped is undone in O(n_out).
"""

from __future__ import annotations

import torch


class Flat:
    def __init__(self, data: torch.Tensor | None, head: int, fan_in: int, *, n: int = 0,
                 pair: bool = True):
        """``data`` (P,) = [head elements, n_out (fan_in) rows, n_out biases], copied; None:
        ``n`` output units, values unset."""
        self.head, self.fan_in, self.pair = int(head), int(fan_in), pair
        if data is not None:
            n = (data.numel() - self.head) // (self.fan_in + 1)
            assert self.head + n * (self.fan_in + 1) == data.numel(), "not [head, Wo, bo]"
        self._alloc(n, max(8, 2 * n))
        if data is not None:
            self.bufs[0][:data.numel()] = data.detach()

    def fresh(self) -> Flat:
        """A new ``Flat`` of the same layout, values unset."""
        return Flat(None, self.head, self.fan_in, n=self.n, pair=self.pair)

    def _alloc(self, n: int, rows: int) -> None:
        size = self.head + rows * (self.fan_in + 1)
        self.rows = rows
        self.bufs = [torch.empty(size), None]  # the spare is made at its first use
        self.lay = [n, n]  # the output size each buffer is laid out for
        self.cur, self.n, self.guarded = 0, n, False
        self._view()

    @property
    def P(self) -> int:
        return self.head + self.n * (self.fan_in + 1)

    def _view(self) -> None:
        self.live = self.bufs[self.cur][:self.P]

    # ------------------------------------------------------------------ growth
    def grow(self, W: torch.Tensor | float, b: torch.Tensor | float, k: int = 1) -> torch.Tensor:
        """Append ``k`` output units: rows ``W`` (k, fan_in) and biases ``b`` (k,), or a
        constant for each. Returns the new live view."""
        H, f, n = self.head, self.fan_in, self.n
        if n + k > self.rows:  # new buffers; the old ones keep their values and layout
            old = self.live
            self._alloc(n, max(n + k, 2 * self.rows))
            self.bufs[0][:old.numel()] = old
        buf = self.bufs[self.cur]
        bo = buf[H + n * f:H + n * f + n]
        if k * f < n:  # the moved biases overlap their old place
            bo = bo.clone()
        buf[H + (n + k) * f:H + (n + k) * f + n] = bo
        buf[H + n * f:H + (n + k) * f] = W if isinstance(W, float) else W.reshape(-1)
        buf[H + (n + k) * f + n:H + (n + k) * (f + 1)] = b
        self.n = self.lay[self.cur] = n + k
        self._view()
        return self.live

    # ------------------------------------------------------------------ writes and undo
    def guard(self) -> None:
        """The next ``target`` writes into the spare buffer (the current one stays as it is)."""
        assert self.pair
        self.guarded = True

    def target(self, copy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(the live vector, where its new values go): the same view, or, guarded, the spare
        buffer's (holding a copy of the live values if ``copy``), which becomes current."""
        old = self.live
        if not self.guarded:
            return old, old
        self.guarded = False
        other = self.cur ^ 1
        if self.bufs[other] is None:
            self.bufs[other] = torch.empty_like(self.bufs[self.cur])
        self.cur, self.lay[other] = other, self.n
        self._view()
        if copy:
            self.live.copy_(old)
        return old, self.live

    def snapshot(self) -> tuple:
        return self.bufs, self.lay, self.cur, self.n, self.rows, self.live

    def restore(self, snap: tuple) -> None:
        """Back to ``snapshot``'s vector: its buffer, with ``bo`` moved back if it grew since."""
        self.bufs, self.lay, self.cur, self.n, self.rows, self.live = snap
        self.guarded = False
        H, f, n, grown = self.head, self.fan_in, self.n, self.lay[self.cur]
        if grown != n:
            buf = self.bufs[self.cur]
            buf[H + n * f:H + n * f + n] = buf[H + grown * f:H + grown * f + n].clone()
            self.lay[self.cur] = n
