"""Progress as plain lines on stderr, for output without a terminal (a log file, a pipe, CI):
below every layer, so that extraction (``data.features``) and the command line share it."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape

from ciosl.errors import printable

err_console = Console(stderr=True)

# without a terminal (a log file, a pipe, CI) progress is a plain line at most this often
PLAIN_PROGRESS_SECONDS = 30.0


def _plain_progress(description: str, unit: str = "samples", rates: bool = False):
    """(on_start, on_progress) that print ``description: done / total samples (p%), elapsed``
    when ``PLAIN_PROGRESS_SECONDS`` have passed since the last line (the first after that long
    from the start), ``total`` being what ``on_start`` announced. ``unit`` names what is
    counted; ``rates`` adds the rate so far and the time left at that rate
    (``..., 450 images/s, 1m46s left, 0m30s elapsed``)."""
    state = {"done": 0, "total": None, "start": time.monotonic()}
    state["last"] = state["start"]

    def on_start(total) -> None:
        state.update(done=0, total=total)

    def on_progress(n: int) -> None:
        state["done"] += n
        now = time.monotonic()
        if now - state["last"] < PLAIN_PROGRESS_SECONDS:
            return
        state["last"] = now
        total, done = state["total"], state["done"]
        share = f" ({100 * done / total:.0f}%)" if total else ""
        of = f" / {total:,}" if total else ""
        speed = ""
        if rates:
            rate = done / max(now - state["start"], 1e-9)
            left = f", {_clock((total - done) / rate)} left" if total and rate > 0 else ""
            speed = f", {rate:,.0f} {unit}/s{left}"
        err_console.print(f"{_safe(description)}: {done:,}{of} {unit}{share}{speed}, "
                          f"{_clock(now - state['start'])} elapsed", highlight=False,
                          soft_wrap=True)

    return on_start, on_progress


def plain_progress(description: str, unit: str = "samples", rates: bool = False):
    """The plain-line progress of runs without a terminal, for other counts (extraction)."""
    return _plain_progress(description, unit, rates)


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _safe(text) -> str:
    """A name for rich: printable and not read as markup."""
    return escape(printable(text))
