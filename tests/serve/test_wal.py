"""The write-ahead log: records read back as written; a torn last record is dropped; damage
before the last record, or a gap between segments, is refused."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl.serve import wal


def _segment(folder, base, records):
    seg = wal.Segment(folder / wal.segment_name(base), base, create=True)
    seg.append(b"".join(wal.encode(s, x, y, rid) for s, x, y, rid in records))
    seg.close()
    return folder / wal.segment_name(base)


def _records(first, n, d=3):
    rng = np.random.default_rng(first)
    return [(first + i, rng.normal(size=(i + 1, d)).astype(np.float32),
             [f"c{i}"] * (i + 1), f"id{first + i}" if i % 2 == 0 else None) for i in range(n)]


def test_records_read_back_exactly(tmp_path):
    recs = _records(1, 4)
    _segment(tmp_path, 0, recs)
    out, tail = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == [1, 2, 3, 4]
    for r, (seq, x, y, rid) in zip(out, recs, strict=True):
        assert r.seq == seq and np.array_equal(r.x, x) and r.y == y and r.id == rid
    assert tail[1] == 0 and tail[2] == (tmp_path / wal.segment_name(0)).stat().st_size


def test_records_covered_by_the_snapshot_are_skipped(tmp_path):
    _segment(tmp_path, 0, _records(1, 4))
    out, _ = wal.read_log(tmp_path, 2)
    assert [r.seq for r in out] == [3, 4]


@pytest.mark.parametrize("cut", [1, 5, 17, 30])
def test_a_torn_last_record_is_dropped(tmp_path, cut):
    path = _segment(tmp_path, 0, _records(1, 3))
    data = path.read_bytes()
    path.write_bytes(data[:-cut])  # the last write was cut short
    out, (_, _, good_end) = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == [1, 2]
    # appending continues where the good records end
    seg = wal.Segment(path, 0, create=False, good_end=good_end)
    seg.append(wal.encode(3, np.ones((1, 3), np.float32), ["z"], "again"))
    seg.close()
    out, _ = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == [1, 2, 3] and out[-1].id == "again"


def test_a_flipped_bit_in_the_last_complete_record_is_damage(tmp_path):
    """Red-team 6, finding 9: only a record cut short may be dropped; a complete last record
    whose checksum fails is refused, naming the segment and the byte."""
    recs = _records(1, 3)
    path = _segment(tmp_path, 0, recs)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # one bit, inside the last record's features
    path.write_bytes(bytes(data))
    start = len(data) - len(wal.encode(*recs[2][:3], recs[2][3]))
    with pytest.raises(wal.LogDamaged, match=rf"{path.name}: damaged record at byte {start} "
                       r"\(checksum mismatch\), complete"):
        wal.read_log(tmp_path, 0)


def test_zeros_to_the_end_are_blocks_never_written(tmp_path):
    """A power cut can leave the file longer than what was written (zeros): a torn write."""
    path = _segment(tmp_path, 0, _records(1, 2))
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + bytes(100))
    out, (_, _, good_end) = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == [1, 2] and good_end == size
    path.write_bytes(path.read_bytes()[:size] + b"junk" + bytes(96))  # not zeros: damage
    with pytest.raises(wal.LogDamaged, match="bad header"):
        wal.read_log(tmp_path, 0)


def test_records_are_read_back_aligned(tmp_path):
    """Red-team 6, finding 8: a record's features are a fresh aligned C array (a view at the
    record's byte offset is misaligned, and some learners' arithmetic then differs)."""
    _segment(tmp_path, 0, [(k, np.ones((2, 3), np.float32), ["a", "b"], "i" * k)
                           for k in range(1, 5)])  # one of 4 id lengths misaligns the view
    for rec in wal.read_log(tmp_path, 0)[0]:
        assert rec.x.flags.aligned and rec.x.flags.c_contiguous
        assert rec.x.dtype == np.float32 and rec.x.ctypes.data % 4 == 0


def test_a_segment_is_never_left_without_its_header(tmp_path, monkeypatch):
    """Red-team 6, finding 2: a full disk while a segment is created leaves no segment (its
    temporary is removed), and an older writer's headerless newest segment is read as empty."""
    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal.os, "write", full)
    with pytest.raises(OSError):
        wal.Segment(tmp_path / wal.segment_name(0), 0, create=True)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    _segment(tmp_path, 0, _records(1, 2))
    (tmp_path / wal.segment_name(2)).write_bytes(wal.FILE_MAGIC[:4])  # cut by a full disk
    tail: dict = {}
    assert [r.seq for r in wal.iter_log(tmp_path, 0, tail)] == [1, 2]
    assert tail["empty"] and tail["base"] == 2


def test_damage_before_the_last_record_is_refused(tmp_path):
    recs = _records(1, 3)
    path = _segment(tmp_path, 0, recs)
    data = bytearray(path.read_bytes())
    first_end = wal.FILE_HEADER.size + len(wal.encode(*recs[0][:3], recs[0][3]))
    data[first_end - 3] ^= 0xFF  # inside the first record's features
    path.write_bytes(bytes(data))
    with pytest.raises(wal.LogDamaged, match="damaged record"):
        wal.read_log(tmp_path, 0)


def test_a_torn_record_in_an_older_segment_is_damage(tmp_path):
    old = _segment(tmp_path, 0, _records(1, 2))
    _segment(tmp_path, 2, _records(3, 2))
    old.write_bytes(old.read_bytes()[:-4])
    with pytest.raises(wal.LogDamaged):
        wal.read_log(tmp_path, 0)


def test_segments_continue_and_a_gap_is_refused(tmp_path):
    _segment(tmp_path, 0, _records(1, 2))
    _segment(tmp_path, 2, _records(3, 2))
    out, tail = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == [1, 2, 3, 4] and tail[1] == 2
    (tmp_path / wal.segment_name(0)).unlink()
    with pytest.raises(wal.LogDamaged, match="missing"):
        wal.read_log(tmp_path, 0)  # records 1-2 are gone
    out, _ = wal.read_log(tmp_path, 2)  # a snapshot at 2 covers them
    assert [r.seq for r in out] == [3, 4]


def test_a_file_that_is_not_a_segment_is_refused(tmp_path):
    (tmp_path / wal.segment_name(0)).write_bytes(b"hello, this is not a log at all")
    with pytest.raises(wal.LogDamaged, match="not a ciosl log segment"):
        wal.read_log(tmp_path, 0)
    (tmp_path / wal.segment_name(0)).unlink()
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(wal.LogDamaged, match="unexpected file"):
        wal.read_log(tmp_path, 0)


def test_the_log_is_read_one_record_at_a_time(tmp_path, monkeypatch):
    _segment(tmp_path, 0, _records(1, 3))
    monkeypatch.setattr(type(tmp_path), "read_bytes", lambda self: pytest.fail("whole file"))
    reader = wal.iter_log(tmp_path, 0, {})
    first = next(reader)  # available before the rest is read
    assert first.seq == 1 and first.x.flags.writeable
    assert [r.seq for r in reader] == [2, 3]


def _length_field(data: bytearray, start: int) -> None:
    """Add 64 KiB to the payload length of the record at ``start``: past the end of the file,
    under the largest length a record may have."""
    data[start + 4 + 2] ^= 0x01


@pytest.mark.parametrize("which", [0, 2])
def test_a_flipped_bit_in_a_length_field_is_damage_not_a_torn_tail(tmp_path, which):
    """A length that runs past the end of the file looked like a torn last write (version 1):
    the record and every one after it would have been cut. The header's own checksum makes it
    damage, named, wherever the record is (the first of three, and the last)."""
    recs = _records(1, 3)
    path = _segment(tmp_path, 0, recs)
    data = bytearray(path.read_bytes())
    start = wal.FILE_HEADER.size + sum(len(wal.encode(*r[:3], r[3])) for r in recs[:which])
    _length_field(data, start)
    path.write_bytes(bytes(data))
    with pytest.raises(wal.LogDamaged, match=rf"damaged record at byte {start} \(bad header\)"):
        wal.read_log(tmp_path, 0)


def _v1_segment(folder, base, records):
    """A segment as ciosl wrote it before the header checksum (format version 1)."""
    import struct
    import zlib

    blob = wal.FILE_HEADER.pack(wal.FILE_MAGIC, 1, base)
    for seq, x, y, rid in records:
        payload = wal.payload_of(x, y, rid)
        crc = zlib.crc32(struct.pack("<Q", seq) + payload)
        blob += wal.REC_HEADER_V1.pack(wal.REC_MAGIC, len(payload), crc, seq) + payload
    path = folder / wal.segment_name(base)
    path.write_bytes(blob)
    return path


@pytest.mark.parametrize("torn", [False, True])
def test_a_version_1_log_is_read_and_continued_in_a_new_segment(tmp_path, torn):
    recs = _records(1, 3)
    path = _v1_segment(tmp_path, 0, recs)
    if torn:
        path.write_bytes(path.read_bytes()[:-5])
    tail: dict = {}
    got = list(wal.iter_log(tmp_path, 0, tail))
    n = 2 if torn else 3
    assert [r.seq for r in got] == list(range(1, n + 1))
    assert all(np.array_equal(r.x, x) and r.id == rid
               for r, (_, x, _, rid) in zip(got, recs[:n], strict=True))
    seg = wal.open_tail(tmp_path, tail, n)
    assert seg.base == n and seg.path != path  # never a version-2 record in a version-1 file
    seg.append(wal.encode(n + 1, np.ones((1, 3), np.float32), ["z"], "new"))
    seg.close()
    out, _ = wal.read_log(tmp_path, 0)
    assert [r.seq for r in out] == list(range(1, n + 2)) and out[-1].id == "new"


def test_an_empty_version_1_tail_is_replaced(tmp_path):
    _segment(tmp_path, 0, _records(1, 2))
    _v1_segment(tmp_path, 2, [])
    tail: dict = {}
    assert [r.seq for r in wal.iter_log(tmp_path, 0, tail)] == [1, 2]
    seg = wal.open_tail(tmp_path, tail, 2)
    seg.append(wal.encode(3, np.ones((1, 3), np.float32), ["z"], None))
    seg.close()
    assert [r.seq for r in wal.read_log(tmp_path, 0)[0]] == [1, 2, 3]
    with open(tmp_path / wal.segment_name(2), "rb") as f:
        assert wal.FILE_HEADER.unpack(f.read(wal.FILE_HEADER.size))[1] == wal.VERSION
