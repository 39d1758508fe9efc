"""One line for every error a command can end with (``cli`` prints it): the file, flag or value
it concerns, never a traceback."""

from __future__ import annotations

# errors the CLI turns into one line and exit status 2; anything else is a bug in ciosl
EXPECTED: tuple[type[BaseException], ...] = (ValueError, RuntimeError, OSError,
                                             FloatingPointError)


def message(e: BaseException) -> str:
    """The one-line message of ``e``."""
    if isinstance(e, OSError) and e.strerror:
        where = e.filename if e.filename is not None else None
        return f"{where}: {e.strerror}" if where else e.strerror
    return str(e).splitlines()[0] if str(e) else type(e).__name__
