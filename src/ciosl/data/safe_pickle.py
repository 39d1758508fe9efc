"""A restricted unpickler for the CIFAR python-pickle batches.

Only the globals those files need (numpy array reconstruction, builtin containers) resolve;
any other global raises ``pickle.UnpicklingError`` before anything is called, so a malicious
file cannot run code. Never use plain ``pickle.load`` on files from users or the network.
"""

from __future__ import annotations

import builtins
import codecs
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray  # type: ignore[no-redef]
    from numpy.core import numeric as _numeric  # type: ignore[no-redef]

_ALLOWED: dict[tuple[str, str], Any] = {}
for _mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
    _ALLOWED[(_mod, "_reconstruct")] = _multiarray._reconstruct
    _ALLOWED[(_mod, "scalar")] = _multiarray.scalar
for _mod in ("numpy.core.numeric", "numpy._core.numeric"):
    _ALLOWED[(_mod, "_frombuffer")] = _numeric._frombuffer  # protocol-5 arrays
_ALLOWED[("numpy", "ndarray")] = np.ndarray
_ALLOWED[("numpy", "dtype")] = np.dtype
_ALLOWED[("_codecs", "encode")] = codecs.encode  # bytes pickled by Python 3 at protocol < 3
for _mod in ("builtins", "__builtin__"):  # __builtin__: Python 2 pickles (the CIFAR originals)
    for _name in ("list", "dict", "tuple", "set", "frozenset", "bytes", "bytearray", "str",
                  "int", "float", "complex", "bool"):
        _ALLOWED[(_mod, _name)] = getattr(builtins, _name)
_ALLOWED[("__builtin__", "unicode")] = str


def _no_size(make: type) -> Any:
    """``bytes`` / ``bytearray`` without the ``bytes(n)`` form: a 60-byte pickle calling
    ``bytes(6_000_000_000)`` would allocate 6 GB; real pickles pass data, never a size."""
    def build(*args: Any) -> Any:
        if args and isinstance(args[0], int):
            raise pickle.UnpicklingError(
                f"refused {make.__name__}({args[0]}): a pickle asking for a buffer of a given "
                "size (a memory bomb, not a CIFAR batch)")
        return make(*args)
    return build


for _mod in ("builtins", "__builtin__"):
    for _make in (bytes, bytearray):
        _ALLOWED[(_mod, _make.__name__)] = _no_size(_make)


class BadPickleError(pickle.UnpicklingError, ValueError):
    """A pickle that was refused or could not be read; the message names the file."""


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler whose ``find_class`` only resolves an allow-list of safe globals."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused to unpickle global {module}.{name}: not a numpy array or builtin "
                "container (the file is not a CIFAR batch, or it is malicious)"
            ) from None


def safe_load(path: str | Path, *, encoding: str = "bytes") -> Any:
    """Load a pickle file with the restricted unpickler (``encoding='bytes'`` like CIFAR)."""
    with open(path, "rb") as f:
        return RestrictedUnpickler(f, encoding=encoding).load()


def safe_loads(data: bytes, *, encoding: str = "bytes") -> Any:
    """``safe_load`` for bytes already in memory."""
    return RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()
