"""Recovery gives the uninterrupted learner's bits for every method; a full disk during a clean
stop still restarts to the acknowledged state; the ids a folder keeps stay within what its
reader takes (red-team pass 6, findings 8, 2 and 3)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.learners.registry import available_methods
from ciosl.serial import digest
from ciosl.serve import ids as ids_mod
from ciosl.serve import service as sv
from ciosl.serve import wal

NEEDS_BASE = {"remind"}  # trains its quantizer in fit_base: a server cannot start it


def _requests(n=24, d=6, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = 1 + i % 3
        y = [int(v) for v in rng.integers(0, 2 + i // 4, size=k)]
        out.append((rng.normal(size=(k, d)).astype(np.float32) + np.array(y)[:, None], y,
                    f"r{i}" * (1 + i % 4)))  # ids of several lengths: records of all offsets
    return out


def _open(folder, method=None, **opts):
    options = sv.Options(snapshot_on_close=False, snapshot_seconds=0, **opts)
    return sv.Service(folder, method, None, options=options).open()


def _learn(s, x, y, rid):
    return s.submit_learn(x, y, rid).result(timeout=120)


@pytest.mark.parametrize("method", sorted(set(available_methods()) - NEEDS_BASE))
def test_recovery_gives_the_uninterrupted_learners_bits(tmp_path, method):
    """Finding 8: finetune, coreset_only (and vcl after 60 requests) recovered to other bits:
    the log's features were read as misaligned views. Every method: the state after replaying
    the log is the state of a learner fed the same requests in process."""
    reqs = _requests()
    s = _open(tmp_path, method)
    for x, y, rid in reqs:
        assert _learn(s, x, y, rid).status == 200
    live = s.state()["digest"]
    s.close()  # no snapshot: the whole state comes back from the log
    ref = make_learner(method)
    for x, y, _ in reqs:
        ref.learn_one(x[0], y[0]) if len(y) == 1 else ref.learn_many(x, y)
    assert live == digest(ref.state_dict())
    s2 = _open(tmp_path)
    try:
        assert s2.recovered == len(reqs)
        assert s2.state()["digest"] == live
    finally:
        s2.close()


def test_a_full_disk_at_a_clean_stop_restarts_to_the_acknowledged_state(tmp_path, monkeypatch):
    """Finding 2: the stop's snapshot rotates the log; with the disk full, the new segment was
    left with 0 bytes and the restart refused ("log segment without a complete header")."""
    reqs = _requests(6)
    warned: list[str] = []
    s = sv.Service(tmp_path, "ncm", None, warn=warned.append,
                   options=sv.Options(snapshot_seconds=0)).open()
    for x, y, rid in reqs:
        assert _learn(s, x, y, rid).status == 200
    live = s.state()
    real_write = wal.os.write

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(wal.os, "write", full)  # the disk fills before the stop
    s.close()  # its snapshot fails; said once
    monkeypatch.setattr(wal.os, "write", real_write)  # space freed
    assert len(warned) == 1 and "No space left" in warned[0] and "restart recovers" in warned[0]
    assert not any(p.stat().st_size == 0 for p in (tmp_path / "log").iterdir())
    s2 = _open(tmp_path)
    try:
        assert s2.state() == live
        x, y, rid = _requests(1, seed=3)[0]
        assert _learn(s2, x, y, "after").status == 200  # and it goes on
    finally:
        s2.close()


def test_the_id_window_is_bounded_in_bytes_and_the_reader_takes_it(tmp_path):
    """Finding 3: 238,000 ids of 199 emoji wrote a 550 MB ids file that the reader (512 MiB)
    then refused. The window is bounded in bytes as in count; what is written is read back."""
    bound = 1 << 16
    s = _open(tmp_path, "ncm", id_window_bytes=bound)
    x = np.ones((1, 4), np.float32)
    ids = [f"{i:06d}" + "\U0001F600" * 193 for i in range(60)]  # 199 characters each
    for rid in ids:
        assert _learn(s, x, [0], rid).status == 200
    assert _learn(s, x, [0], ids[-1]).body["duplicate"] is True  # the newest is remembered
    s.submit_snapshot().result(timeout=60)
    s.close()
    (ids_file,) = (tmp_path / "snapshots").glob("ids-*.json")
    size = ids_file.stat().st_size
    assert size <= bound
    kept = json.loads(ids_file.read_text())
    assert 0 < len(kept) < len(ids) and [r for _, r in kept] == ids[-len(kept):]
    assert size == 2 + sum(ids_mod.entry_bytes(q, r) for q, r in kept) - 1
    s2 = _open(tmp_path)  # the reader takes what the writer wrote
    try:
        assert _learn(s2, x, [0], ids[-1]).body["duplicate"] is True
        assert _learn(s2, x, [0], ids[0]).body["duplicate"] is False  # forgotten: learned
    finally:
        s2.close()


def test_the_writers_bound_is_below_the_readers_cap():
    assert ids_mod.MAX_WINDOW_BYTES < ids_mod.MAX_IDS_FILE
    with pytest.raises(sv.ServeError, match="--id-window-bytes must be in"):
        sv.Options(id_window_bytes=ids_mod.MAX_IDS_FILE)
