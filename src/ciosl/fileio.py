"""Crash-safe file writes: temporary file in the same folder, fsync, atomic rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def check_writable(folder: str | Path, what: str = "--out") -> Path:
    """Create ``folder`` if needed and check a file can be written in it, before any work (a
    run that computes for hours and then cannot write its result has lost everything)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".ciosl-write-check.", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"{what} {folder}: cannot write there "
                         f"({e.strerror or type(e).__name__})") from None
    return folder


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or None if it is missing or unreadable (then it is rebuilt)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def cache_root() -> Path:
    """``$CIOSL_CACHE`` or ``~/.cache/ciosl``: feature caches and offline reference results."""
    env = os.environ.get("CIOSL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ciosl"
