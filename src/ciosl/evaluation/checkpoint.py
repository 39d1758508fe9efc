"""Crash-safe checkpoints of an experiment: written atomically, read without executing code.

A checkpoint holds everything needed to continue an interrupted ``ciosl run`` as if it had
never stopped: the identity of the experiment (so a checkpoint is never applied to another
one), the finished runs, and for the run in progress the learner's ``state_dict`` (model,
replay memory, its own random generators), the stream position, the partial per-event results
and the timings so far. The process-wide generators (Python's ``random``, NumPy's legacy global
generator, torch's default generator) are saved too, although no learner draws from them, so
that code added later cannot silently break resumption.

Format: ``torch.save`` of plain containers and tensors, read back with
``torch.load(weights_only=True)``; written with ``fileio.atomic_write_bytes`` (temporary file,
fsync, rename), so a kill at any moment leaves either the previous checkpoint or the new one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ciosl.errors import writing
from ciosl.fileio import atomic_write_bytes

FORMAT = "ciosl-checkpoint"
FORMAT_VERSION = 1


def checkpoint_path(result_path: str | Path) -> Path:
    """The checkpoint of the experiment whose result JSON is ``result_path``."""
    p = Path(result_path)
    return p.with_name(p.stem + ".ckpt")


def identity(obj: Any) -> str:
    """A canonical JSON text of ``obj`` (tuples become lists), compared on resume."""
    return json.dumps(obj, sort_keys=True, default=str)


def global_rng_state() -> dict[str, Any]:
    py_version, py_state, py_gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np.asarray(np_state["state"]["key"], np.int64)),
                  "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]),
                  "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
    }


def set_global_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: str | Path, ident: str, payload: dict[str, Any]) -> Path:
    """Write the checkpoint with a checksum of its contents (``load_checkpoint`` verifies
    it). A learner whose state cannot be stored raises ``LearnerError`` naming the method."""
    from ciosl.serial import serialize, with_checksum

    data = serialize(with_checksum({"format": FORMAT, "format_version": FORMAT_VERSION,
                                    "ident": ident, "rng": global_rng_state(), **payload}),
                     f"cannot write checkpoint {path}")
    with writing(path):
        return atomic_write_bytes(path, data)


def load_checkpoint(path: str | Path, ident: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` (None if there is none); restores the global generators.

    Refuses, with a clear error, a file that is not a checkpoint, one from a newer format, or
    one written for another experiment.
    """
    path = Path(path)
    if not path.exists():
        return None
    from ciosl.data.archive import ArchiveError, check_zip
    from ciosl.fileio import check_regular

    check_regular(path, "checkpoint")  # a FIFO or a device would block
    try:
        check_zip(path, "ciosl checkpoint")  # sizes checked before anything inflates
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except ArchiveError as e:  # the message names the file
        raise ValueError(f"checkpoint unreadable: {e}; delete it to start over") from None
    except Exception as e:  # truncated, corrupt, or not a torch file at all
        raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e}); delete it "
                         "to start over") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        raise ValueError(f"{path} is not a ciosl checkpoint")
    version = ck.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or "ident" not in ck:
        raise ValueError(f"checkpoint {path} is damaged (no format version or identity); "
                         "delete it to start over")
    if version > FORMAT_VERSION:
        raise ValueError(f"checkpoint {path} has format version {ck['format_version']}, newer "
                         f"than this ciosl supports ({FORMAT_VERSION}); upgrade ciosl")
    from ciosl.serial import checksum_problem

    problem = checksum_problem(ck)
    if problem is not None:
        raise ValueError(f"checkpoint {path} is damaged: {problem}; delete it to start over")
    if not isinstance(ck["ident"], str):
        raise ValueError(f"checkpoint {path} is damaged (its identity is not a text); delete "
                         "it to start over")
    if ck["ident"] != ident:
        mine, theirs = json.loads(ident), json.loads(ck["ident"])
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise ValueError(f"checkpoint {path} was written for a different experiment (differs in: "
                         f"{', '.join(diff)}); delete it, or run without --resume and with --force "
                         "to start over")
    set_global_rng_state(ck["rng"])
    return ck


def remove_stale_temporaries(path: str | Path) -> None:
    """Temporary files left by a writer killed before its rename."""
    path = Path(path)
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        tmp.unlink(missing_ok=True)
