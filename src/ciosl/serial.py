"""Files of plain containers and tensors: ``serialize`` (checked to read back with
``weights_only=True``) and the checksums that learner files and checkpoints store."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import torch

from ciosl.errors import LearnerError, _describe

CHECKSUM_KEY = "sha256"  # learner files and checkpoints: digest() of everything else


def digest(obj: Any) -> str:
    """sha256 of a nested value of plain containers, numbers, strings and tensors, as loaded
    (not of the file's bytes: a zip can be rewritten alike). ``Learner.save`` and checkpoints
    store it and the loaders recompute it, so a flipped bit anywhere in the values is refused
    instead of changing predictions or results."""
    h = hashlib.sha256()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            h.update(b"d%d;" % len(v))
            for k in sorted(v, key=lambda k: (type(k).__name__, repr(k))):
                walk(k)
                walk(v[k])
        elif isinstance(v, list | tuple):
            h.update(b"l%d;" % len(v) if isinstance(v, list) else b"t%d;" % len(v))
            for x in v:
                walk(x)
        elif isinstance(v, torch.Tensor):
            t = v.detach().cpu().reshape(-1).contiguous()
            h.update(f"T{t.dtype}{tuple(v.shape)};".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(v, str):
            b = v.encode("utf-8", "surrogatepass")
            h.update(b"s%d;" % len(b) + b)
        else:
            h.update(f"{type(v).__name__}:{v!r};".encode())

    walk(obj)
    return h.hexdigest()


def with_checksum(blob: dict) -> dict:
    """``blob`` with its ``digest`` under ``CHECKSUM_KEY``."""
    return {**blob, CHECKSUM_KEY: digest(blob)}


def checksum_problem(blob: dict) -> str | None:
    """None if ``blob`` matches its stored checksum (or stores none: a file written before
    checksums), else what is wrong."""
    if CHECKSUM_KEY not in blob:
        return None
    stored = blob[CHECKSUM_KEY]
    rest = {k: v for k, v in blob.items() if k != CHECKSUM_KEY}
    if not isinstance(stored, str) or stored != digest(rest):
        return ("its contents do not match the checksum stored when it was written (the file "
                "changed since: a damaged disk or copy, or an edit)")
    return None


def serialize(obj: Any, what: str) -> bytes:
    """``torch.save`` of ``obj`` (plain containers and tensors) as bytes, checked to read back
    with ``torch.load(weights_only=True)``: a state holding a function, a NumPy array or an
    object of its own is refused here, with ``LearnerError`` (``what``: who cannot save), rather
    than written as a file no one can load."""
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
        data = buf.getvalue()
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        import re

        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        why = f"it holds a {found.group(1)}" if found else _describe(e)
        raise LearnerError(f"{what}: its state holds something other than numbers, strings, "
                           f"lists, tables and tensors ({why})") from None
    return data

