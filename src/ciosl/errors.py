"""One line for every error a command can end with (``cli`` prints it): the file, flag or value
it concerns, never a traceback.

The library raises ``ValueError`` (bad input, damaged files: the message names them),
``FileNotFoundError`` / ``OSError`` (the file system), ``RuntimeError`` and
``FloatingPointError`` (training diverged); data readers turn format errors (a truncated gzip, a
damaged zip or pickle) into ``ValueError`` naming the file. ``EXPECTED`` also lists the raw
format errors, as a safety net for a reader that lets one through. An unexpected exception
raised in the code of a learner of the user's own is that method's error, a ``LearnerError``
naming the method and its hook (``learners/guard.py``'s ``user_error``). Anything else is a bug
in ciosl: one line too, asking for a report; ``CIOSL_TRACEBACK=1`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

EXPECTED: tuple[type[BaseException], ...] = (
    ValueError, RuntimeError, OSError, FloatingPointError, MemoryError, EOFError,
    pickle.UnpicklingError, zipfile.BadZipFile)



ECHO_WIDTH = 80  # an echoed value keeps this many characters, then says how long it was
LINE_MAX = 1000  # an error line longer than this is cut (``clip_line``)
LONG_TOKEN = 200  # a run of this many characters without a space is a value to shorten


def shown(text: str, width: int = ECHO_WIDTH) -> str:
    """``text`` as it is if short, else its first ``width`` characters and how long it was:
    a 100,000-character value in an error makes a line of 100 kB."""
    text = str(text)
    return text if len(text) <= width else f"{text[:width]}... ({len(text):,} characters)"


def magnitude(value: int) -> str:
    """An int of more than ``ECHO_WIDTH`` digits as its order of magnitude ("1e+400 (an
    int)"): all its digits would make a long line (or, past Python's 4300, none at all)."""
    if abs(value) < 10**ECHO_WIDTH:
        return repr(value)
    exp = int(math.log10(abs(value)))  # math.log10 takes ints of any size
    exp += (abs(value) >= 10**(exp + 1)) - (abs(value) < 10**exp)  # log10's rounding
    mantissa = abs(value) / 10**exp  # int / int: exact to a float, however large
    if f"{mantissa:.3g}" == "10":  # 10**40 - 1 rounds up: 1e+40, not 10e+39
        mantissa, exp = mantissa / 10, exp + 1
    return f"{'-' if value < 0 else ''}{mantissa:.3g}e+{exp} (an int)"


def echo(value: object, width: int = ECHO_WIDTH) -> str:
    """``repr(value)`` for an error message, never longer than about ``width`` characters: a
    huge int as its magnitude, a long text or container cut (``shown``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return magnitude(value)
    try:
        text = repr(value)
    except ValueError:  # a container holding an int beyond 4300 digits
        text = f"<{type(value).__name__}>"
    return shown(text, width)


_LONG_RUN = re.compile(r"\S{" + str(LONG_TOKEN) + ",}")


def clip_line(text: str, limit: int = LINE_MAX) -> str:
    """The safety net under every echo: each run of ``LONG_TOKEN`` or more characters without
    a space shortened (``shown``), then a line still over ``limit`` characters cut in the
    middle, so that what it names (at its start) and its advice (at its end) both stay."""
    text = _LONG_RUN.sub(lambda m: shown(m.group(0)), str(text))
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} ... ({len(text) - 2 * half:,} characters) ... {text[-half:]}"


class LearnerError(RuntimeError):
    """A learner broke the protocol: it answered NaN probabilities, the wrong number of rows or
    columns, labels it never learned, it exited instead of raising, or its state cannot be
    saved. The message names the method; the CLI prints it as one line (a ``RuntimeError``)."""


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` raised while writing it: a full disk or a refused rename
    reports the file the user asked for, not only the temporary file written first (or no file
    at all: ``write`` raises "No space left on device" without one)."""
    try:
        yield
    except OSError as e:
        if e.errno is None or str(e.filename) == str(path):
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e


INTERRUPTED_RUN = ("interrupted: the finished runs are saved; the same command with --resume "
                   "continues")


def show_traceback() -> bool:
    return os.environ.get("CIOSL_TRACEBACK", "") not in ("", "0")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


_ALLOCATION = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")


def is_out_of_memory(e: BaseException) -> bool:
    """A ``MemoryError``, or torch's allocator failure (a ``RuntimeError``)."""
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError)
                                          and bool(_ALLOCATION.search(str(e))))


def too_large(e: BaseException) -> bool:
    """An allocation that failed because it was too large: ``is_out_of_memory``, or torch's
    refusal of a size whose byte count overflows. Any other error while allocating is not."""
    return is_out_of_memory(e) or (isinstance(e, RuntimeError) and str(e).startswith(
        "Storage size calculation overflowed"))


def size_text(n: int) -> str:
    """``n`` bytes as ``1.5 GiB`` (the largest unit) / ``12.0 MiB`` / ``3.0 KiB`` / ``12 bytes``: a small size
    never reads "0.0 GiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def out_of_memory(e: BaseException, what: str = "") -> str:
    """One line for an allocation that failed: how much was asked for, by what, and what to
    change; never the allocator's internals."""
    if str(e).startswith("out of memory"):  # already said
        return _first_line(e)
    found = _ALLOCATION.search(str(e))
    asked = f" (an allocation of {int(found.group(1)) / 2**30:.1f} GiB)" if found else ""
    detail = "" if found or not _first_line(e) else f": {_first_line(e)}"
    return (f"out of memory{what}{asked}{detail}; use smaller settings, fewer samples "
            "(--limit-per-class) or fewer workers")


def message(e: BaseException) -> str:
    """The one-line message of ``e`` (an expected error or not)."""
    if isinstance(e, OSError) and e.strerror:
        names = [str(n) for n in (e.filename, e.filename2) if n is not None]
        return f"{' -> '.join(names)}: {e.strerror}" if names else e.strerror
    if is_out_of_memory(e):
        return out_of_memory(e)
    if isinstance(e, EOFError | pickle.UnpicklingError | zipfile.BadZipFile):
        return f"{type(e).__name__}: {_first_line(e) or 'no details'}"
    if not isinstance(e, EXPECTED):
        return (f"internal error ({type(e).__name__}: {_first_line(e)}): a bug in ciosl, please "
                "report it (CIOSL_TRACEBACK=1 shows where)")
    return _first_line(e) or type(e).__name__


def _describe(e: BaseException) -> str:
    """``Type: first line of the message`` of an exception raised by a user's code."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def printable(text: str) -> str:
    """``text`` with every non-printable character (escape sequences, newlines, C1 controls)
    written as its Python escape, so nothing in it acts on a terminal or breaks a line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def describe_learner(learner: object) -> str:
    """``method 'name'``, with the class's module for a learner defined outside ciosl."""
    cls = type(learner)
    where = "" if cls.__module__.startswith("ciosl.") else f" ({cls.__module__}:{cls.__qualname__})"
    return f"method {getattr(learner, 'name', cls.__name__)!r}{where}"
