"""A replica's snapshots in JetStream's object store (bucket ``ciosl_snapshots``).

One object per snapshot, named ``<stream>/<seq:012d>``: a blob of

    b"CIOSL-SNAP\\n", <Q> header length, the header (JSON: seq, method, skipped, ids, score),
    the learner file (``Learner.save``'s bytes)

whose SHA-256 is the object's description (``sha256:<hex>``). The loader checks it itself
(never trusting only the transport): a snapshot that fails it, or does not decode, is skipped
for an older one, never loaded. The two newest are kept per stream; once one is stored the
stream is purged below the oldest kept (its records stay: that snapshot ends at them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

from ciosl.learners.base import Learner

MAGIC = b"CIOSL-SNAP\n"
LENGTH = struct.Struct("<Q")
KEEP = 2


def name_of(stream: str, seq: int) -> str:
    return f"{stream}/{seq:012d}"


def seq_of_name(name: str) -> int | None:
    tail = name.rpartition("/")[2]
    return int(tail) if tail.isdigit() else None


def checksum(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def pack(learner: Learner, header: dict, scratch: Path) -> bytes:
    """The blob of ``learner`` with ``header`` (JSON-able: seq, method, ids, score, ...);
    the learner file is written in ``scratch`` and read back."""
    fd, tmp = tempfile.mkstemp(prefix=".snap-", suffix=".ciosl", dir=scratch)
    os.close(fd)
    try:
        learner.save(tmp)
        data = Path(tmp).read_bytes()
    finally:
        Path(tmp).unlink(missing_ok=True)
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + LENGTH.pack(len(head)) + head + data


def unpack(blob: bytes, description: str | None, scratch: Path) -> tuple[Learner, dict]:
    """(the learner, the header) of a blob whose checksum is ``description``;
    ``ValueError`` saying why not."""
    if description != checksum(blob):
        raise ValueError("its SHA-256 is not the one stored with it (damaged)")
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + LENGTH.size:
        raise ValueError("not a ciosl snapshot")
    (n,) = LENGTH.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + LENGTH.size
    header = json.loads(blob[start:start + n])
    fd, tmp = tempfile.mkstemp(prefix=".snap-", suffix=".ciosl", dir=scratch)
    try:
        os.write(fd, blob[start + n:])
        os.close(fd)
        learner = Learner.load(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return learner, header


def newest(log, stream: str, scratch: Path, warn) -> tuple[Learner, dict] | None:
    """The newest snapshot of ``stream`` that loads (``warn``: one line per one skipped), or
    None when none does."""
    from nats.js.errors import NotFoundError

    names = sorted((s, n) for n in log.obj_list(stream + "/")
                   if (s := seq_of_name(n)) is not None)
    for seq, name in reversed(names):
        try:
            blob, description = log.obj_get(name)
            learner, header = unpack(blob, description, scratch)
            if int(header["seq"]) != seq:
                raise ValueError(f"it ends at seq {header['seq']}, its name says {seq}")
        except (ValueError, KeyError, TypeError, NotFoundError) as e:  # damaged, or gone
            # meanwhile: an older one (a log that does not answer is raised: tried again)
            warn(f"ciosl serve: snapshot {name} skipped ({str(e).splitlines()[0][:200]}); "
                 "trying an older one")
            continue
        return learner, header
    return None


def store(log, stream: str, seq: int, blob: bytes) -> int:
    """Put the blob as the snapshot of ``stream`` at ``seq``, drop all but the ``KEEP``
    newest, purge the stream below the oldest kept; that seq."""
    log.obj_put(name_of(stream, seq), blob, checksum(blob))
    names = sorted((s, n) for n in log.obj_list(stream + "/")
                   if (s := seq_of_name(n)) is not None)
    kept = names[-KEEP:]
    for _, name in names[:-KEEP]:
        with contextlib.suppress(Exception):  # another replica removed it meanwhile
            log.obj_delete(name)
    oldest = kept[0][0] if kept else seq
    log.purge_below(stream, oldest)
    return oldest
