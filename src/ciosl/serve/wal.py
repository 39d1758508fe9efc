"""The write-ahead log of a served learner: one record per acknowledged learn request.

A segment file ``log-<base>.wal`` starts with a header (magic, version, base) and holds the
records numbered ``base + 1, base + 2, ...`` in order. A record is

    header  <4s I I Q I> magic b"CREC", payload length, crc32(seq + payload), seq,
                         crc32 of the header's first 20 bytes
    payload <I> json-length, json {"id", "y", "n", "d"[, "fb"]}, then n * d little-endian float32

A feedback record also holds ``fb``: per row, ``[prediction id, answered label, novelty, new,
novel]`` (the answer that was given, which the live score replays; ``feedback.py``).

The rule that reading follows: a record cut short (the file ends before the length its header
gives, or inside its header) is a torn write only when nothing follows it (the last record of the
last segment: a power cut in the middle of a write, never acknowledged); it is dropped and the
file truncated there. A complete record whose checksum fails is damage wherever it is (a flipped
bit, not a torn write), as is a bad record with anything after it: ``LogDamaged`` refuses the
folder, naming the segment and the byte. A log is never silently cut: the header's own checksum
(version 2) is what lets a length be trusted, so a flipped bit in a length field is damage, not
a record that seems to run past the end of the file (version 1 segments, which lack it, are
still read; recovery never appends to one, it starts a new segment).

A segment is created under a temporary name (``.log-<base>.wal.tmp``), its header written and
fsynced, then renamed: a full disk never leaves a segment without its header. The newest segment
of an older writer that did (0 bytes, or a cut header, named after the last record before it)
holds no record and is taken as empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FILE_MAGIC = b"CIOSL-WAL\n"
FILE_HEADER = struct.Struct("<10sIQ")  # magic, version, base seq
VERSION = 2  # what this ciosl writes
READS = (1, 2)  # what it reads
REC_MAGIC = b"CREC"
REC_HEADER = struct.Struct("<4sIIQI")  # magic, payload length, crc32, seq, header crc32
REC_HEADER_V1 = struct.Struct("<4sIIQ")  # version 1: no header checksum
MAX_PAYLOAD = 1 << 30  # a length field above this is damage, not a record


class LogDamaged(ValueError):
    """The log cannot be read back as it was written (not a torn last record)."""


@dataclass(frozen=True)
class Record:
    seq: int
    id: str | None
    x: np.ndarray  # (n, d) float32
    y: list
    fb: list | None = None  # a feedback record: [pid, answered, novelty, new, novel] per row

    @property
    def n(self) -> int:
        return len(self.y)


def payload_of(x: np.ndarray, y: list, rid: str | None, fb: list | None = None) -> bytes:
    """A record's payload: what both logs hold (a segment here, a JetStream message's body)."""
    x = np.ascontiguousarray(x, dtype="<f4")
    doc = {"id": rid, "y": y, "n": int(x.shape[0]), "d": int(x.shape[1])}
    if fb is not None:
        doc["fb"] = fb
    meta = json.dumps(doc, separators=(",", ":")).encode()
    return struct.pack("<I", len(meta)) + meta + x.tobytes()


def encode(seq: int, x: np.ndarray, y: list, rid: str | None, fb: list | None = None) -> bytes:
    """One record's bytes (header and payload)."""
    payload = payload_of(x, y, rid, fb)
    crc = zlib.crc32(struct.pack("<Q", seq) + payload)
    head = REC_HEADER_V1.pack(REC_MAGIC, len(payload), crc, seq)
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def decode_payload(seq: int, payload: bytes, where: str) -> Record:
    """The record numbered ``seq`` from its payload (``payload_of``); ``LogDamaged`` naming
    ``where`` when it does not decode."""
    return _decode(seq, payload, where)


def _decode(seq: int, payload: bytes, where: str) -> Record:
    try:
        (m,) = struct.unpack_from("<I", payload)
        meta = json.loads(payload[4 : 4 + m])
        n, d = int(meta["n"]), int(meta["d"])
        # a fresh, aligned, C-contiguous float32 array, as the live path gives the learner:
        # a view at the record's offset is misaligned, and some methods' arithmetic then
        # differs in the last bits (recovery must give the uninterrupted learner's bits)
        x = np.array(np.frombuffer(payload, dtype="<f4", count=n * d, offset=4 + m),
                     dtype=np.float32, order="C").reshape(n, d)
        y, rid, fb = list(meta["y"]), meta["id"], meta.get("fb")
    except Exception as e:  # a checksum matched, so this is a writer's bug, not a torn write
        raise LogDamaged(f"{where}: record {seq} does not decode ({type(e).__name__})") from None
    if len(y) != n or 4 + m + 4 * n * d != len(payload) or (fb is not None and len(fb) != n):
        raise LogDamaged(f"{where}: record {seq} has inconsistent sizes")
    return Record(seq, rid, x, y, fb)


def segment_name(base: int) -> str:
    return f"log-{base:012d}.wal"


def segment_base(path: Path) -> int | None:
    """The base of a segment file name, or None if ``path`` is not one."""
    name = path.name
    if not (name.startswith("log-") and name.endswith(".wal")):
        return None
    digits = name[4:-4]
    return int(digits) if digits.isdigit() else None


def iter_segment(path: Path, *, last: bool, tail: dict) -> Iterator[Record]:
    """The records of a segment, read one at a time (a log is never held in memory whole).
    ``last``: the newest segment, whose final record may be torn (dropped). Sets
    ``tail["base"]`` and, once read to the end, ``tail["good_end"]``: where its good records
    end."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(FILE_HEADER.size)
        if len(head) < FILE_HEADER.size:
            if last and FILE_MAGIC.startswith(head[: len(FILE_MAGIC)]):
                tail["base"], tail["good_end"], tail["empty"] = segment_base(path), 0, True
                return  # created, its header cut by a full disk: no record in it
            raise LogDamaged(f"{path}: not a ciosl log segment")
        magic, version, base = FILE_HEADER.unpack(head)
        if magic != FILE_MAGIC:
            raise LogDamaged(f"{path}: not a ciosl log segment")
        if version not in READS:
            raise LogDamaged(f"{path}: log format version {version}, this ciosl reads "
                             f"{' and '.join(map(str, READS))}")
        tail["base"], tail["version"] = base, version
        pos, expect = FILE_HEADER.size, base + 1
        while pos < size:
            problem, end, payload = _next_record(f, pos, size, expect, version)
            if problem is not None:
                if last and problem == "cut short":  # nothing after it: a torn last write
                    break
                after = size - max(end, pos)
                raise LogDamaged(f"{path}: damaged record at byte {pos} ({problem}), " + (
                    f"{after} bytes after it" if after else "complete (not a torn write)"))
            yield _decode(expect, payload, str(path))
            pos, expect = end, expect + 1
        tail["good_end"] = pos


def _next_record(f, pos: int, size: int, expect: int,
                 version: int = VERSION) -> tuple[str | None, int, bytearray]:
    """(what is wrong with the record at ``pos`` or None, where it ends, its payload)."""
    shape = REC_HEADER if version >= 2 else REC_HEADER_V1
    head = f.read(shape.size)
    if len(head) < shape.size:
        return "cut short", size, bytearray()
    magic, length, crc, seq = REC_HEADER_V1.unpack_from(head)
    end = pos + shape.size + length
    sound = version < 2 or zlib.crc32(head[:REC_HEADER_V1.size]) == \
        struct.unpack_from("<I", head, REC_HEADER_V1.size)[0]
    if magic != REC_MAGIC or length > MAX_PAYLOAD or not sound:
        rest = size - pos
        if rest <= 1 << 20 and not (head + f.read(rest - len(head))).strip(b"\0"):
            return "cut short", size, bytearray()  # zeros to the end: blocks never written
        return "bad header", size, bytearray()  # its length cannot be trusted
    if end > size:
        return "cut short", size, bytearray()
    payload = bytearray(length)  # writable: the features become a writable array
    f.readinto(payload)
    if seq != expect:
        return f"sequence {seq} where {expect} was due", end, payload
    if zlib.crc32(payload, zlib.crc32(struct.pack("<Q", seq))) != crc:
        return "checksum mismatch", end, payload
    return None, end, payload


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    """An open segment, appended to by one writer. ``append`` writes a group of records in one
    write and fsyncs once (group commit)."""

    def __init__(self, path: Path, base: int, *, create: bool, good_end: int | None = None):
        self.path, self.base = path, base
        if create:
            # under a temporary name until its header is durable: a full disk leaves at most a
            # temporary (removed here, or ignored and removed at the next start)
            tmp = path.with_name(f".{path.name}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, FILE_HEADER.pack(FILE_MAGIC, VERSION, base))
                os.fsync(fd)
                os.rename(tmp, path)
                fsync_dir(path.parent)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        else:
            fd = os.open(path, os.O_WRONLY)
            if good_end is not None and good_end < os.fstat(fd).st_size:
                os.ftruncate(fd, good_end)  # a torn last record: dropped
                os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_END)
        self.fd = fd

    def append(self, blob: bytes) -> None:
        _write_all(self.fd, blob)
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def segments(folder: Path) -> list[tuple[int, Path]]:
    """The segment files of ``folder`` by base; anything else there is refused."""
    found = []
    for p in folder.iterdir():
        base = segment_base(p)
        if base is None:
            if p.name.startswith("."):  # a writer's temporary
                continue
            raise LogDamaged(f"{p}: unexpected file in the log folder")
        found.append((base, p))
    return sorted(found)


def iter_log(folder: Path, after: int, tail: dict) -> Iterator[Record]:
    """Every record numbered above ``after``, in order, checked to follow each other, read
    one at a time. Once exhausted, ``tail`` holds the last segment to continue appending to
    (``path``, ``base``, ``good_end``), or nothing when there is no segment."""
    segs = segments(folder)
    expect = after + 1
    for i, (base, path) in enumerate(segs):
        last = i == len(segs) - 1
        seen: dict = {}
        for rec in iter_segment(path, last=last, tail=seen):
            if rec.seq < expect:
                continue  # already in the snapshot
            if rec.seq != expect:
                raise LogDamaged(f"{path}: record {rec.seq} follows {expect - 1}: records "
                                 "are missing")
            yield rec
            expect += 1
        if seen["base"] != base:
            raise LogDamaged(f"{path}: its header says base {seen['base']}, its name {base}")
        if last:
            tail.update(path=path, base=base, good_end=seen["good_end"],
                        empty=seen.get("empty", False), version=seen.get("version", VERSION))
    if segs and segs[-1][0] > expect - 1:
        raise LogDamaged(f"{segs[-1][1]}: starts after record {segs[-1][0]}, but the snapshot "
                         f"and the log before it end at {expect - 1}: records are missing")


def open_tail(folder: Path, tail: dict, seq: int) -> Segment:
    """The segment to append to once ``iter_log`` has read the log to ``seq``: its last
    segment (a torn last record cut off), or a new one at ``seq`` when there is none, when the
    last one's header was cut by a full disk, or when it is of an older format version (whose
    records this ciosl does not write). Temporaries of a creation cut short are removed."""
    for p in folder.glob(".log-*.wal.tmp"):
        p.unlink(missing_ok=True)
    if tail and tail.get("empty"):  # its header cut by a full disk: made again
        tail["path"].unlink()
        tail = {}
    if tail:
        seg = Segment(tail["path"], tail["base"], create=False, good_end=tail["good_end"])
        if tail.get("version", VERSION) == VERSION:
            return seg
        seg.close()  # an older format: its torn tail cut, then left as it is
        if tail["base"] == seq:  # no record in it: replaced
            tail["path"].unlink()
    return Segment(folder / segment_name(seq), seq, create=True)


def read_log(folder: Path, after: int) -> tuple[list[Record], tuple[Path, int, int] | None]:
    """``iter_log`` as a list, with the tail as (path, base, good_end) or None (for checks and
    tests: a long log does not fit in memory, recovery streams it)."""
    tail: dict = {}
    records = list(iter_log(folder, after, tail))
    return records, (tail["path"], tail["base"], tail["good_end"]) if tail else None


def iter_ids(records: list[Record]) -> Iterator[tuple[int, Any]]:
    for r in records:
        yield r.seq, r.id
