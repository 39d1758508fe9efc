"""One line for every error a command can end with (``cli`` prints it): the file, flag or value
it concerns, never a traceback.

The library raises ``ValueError`` (bad input, damaged files: the message names them),
``FileNotFoundError`` / ``OSError`` (the file system), ``RuntimeError`` and
``FloatingPointError`` (training diverged); data readers turn format errors (a truncated gzip, a
damaged zip or pickle) into ``ValueError`` naming the file. ``EXPECTED`` also lists the raw
format errors, as a safety net for a reader that lets one through. Anything else is a bug in
ciosl: one line too, asking for a report; ``CIOSL_TRACEBACK=1`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

EXPECTED: tuple[type[BaseException], ...] = (
    ValueError, RuntimeError, OSError, FloatingPointError, MemoryError, EOFError,
    pickle.UnpicklingError, zipfile.BadZipFile)



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
