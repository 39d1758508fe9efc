"""The served learner's folder without HTTP: recovery equals a learner that never stopped,
snapshots cover and drop the log, ids make a retry a no-op, a refused request logs nothing, and
a folder that is not this server's is refused."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.serial import digest
from ciosl.serve import service as sv
from ciosl.serve import wal


def _batches(n=12, d=5, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = 1 + i % 3
        y = [int(v) for v in rng.integers(0, 2 + i // 2, size=k)]
        out.append((rng.normal(size=(k, d)).astype(np.float32) + np.array(y)[:, None], y,
                    f"req-{i}"))
    return out


def _open(folder, method=None, settings=None, **opts):
    options = sv.Options(snapshot_on_close=False, snapshot_seconds=0, **opts)
    return sv.Service(folder, method, settings, options=options).open()


def _learn(service, x, y, rid):
    return service.submit_learn(x, y, rid).result(timeout=60)


def _reference(method, batches):
    ref = make_learner(method)
    for x, y, _ in batches:
        sv._apply(ref, x, y)
    return ref


@pytest.mark.parametrize("method", ["slda", "ncm", "tinyer"])
def test_recovery_equals_a_learner_that_never_stopped(tmp_path, method):
    batches = _batches()
    s = _open(tmp_path, method, snapshot_every=15)
    for x, y, rid in batches:
        answer = _learn(s, x, y, rid)
        assert answer.status == 200 and answer.body["learned"] == len(y)
    live = s.state()["digest"]
    s.close()  # no snapshot on close: recovery replays the log after the last snapshot
    assert (tmp_path / sv.POINTER).exists()  # snapshot_every=15 took one on the way
    assert live == digest(_reference(method, batches).state_dict())
    s2 = _open(tmp_path)
    assert s2.method == method and s2.recovered > 0
    assert s2.state()["digest"] == live
    # and it goes on learning exactly like the twin
    x, y, rid = _batches(1, seed=5)[0]
    _learn(s2, x, y, "next")
    twin = _reference(method, [*batches, (x, y, rid)])
    assert s2.state()["digest"] == digest(twin.state_dict())
    s2.close()


def test_a_snapshot_drops_the_log_it_covers(tmp_path):
    s = _open(tmp_path, "ncm")
    for x, y, rid in _batches(6):
        _learn(s, x, y, rid)
    answer = s.submit_snapshot().result(timeout=60)
    assert answer.status == 200 and answer.body["seq"] == 6
    bases = [b for b, _ in wal.segments(tmp_path / "log")]
    assert bases == [6]  # records 1-6 live in the snapshot only
    for x, y, rid in _batches(3, seed=1):
        _learn(s, x, y, "b" + rid)
    live = s.state()["digest"]
    s.close()
    s2 = _open(tmp_path)
    assert s2.recovered == 3 and s2.state()["digest"] == live
    assert [q for q, _ in sv.log_ids(tmp_path)] == list(range(1, 10))
    s2.close()


def test_a_retried_id_learns_nothing_even_after_a_restart(tmp_path):
    s = _open(tmp_path, "ncm")
    x, y, _ = _batches(1)[0]
    first = _learn(s, x, y, "once")
    again = _learn(s, x, y, "once")
    assert first.body["duplicate"] is False and again.body == {
        "learned": 0, "duplicate": True, "seq": first.body["seq"], "seen": len(y)}
    s.close()
    s2 = _open(tmp_path)
    assert _learn(s2, x, y, "once").body["duplicate"] is True
    assert s2.status()["seen"] == len(y)
    s2.submit_snapshot().result(timeout=60)  # the ids survive a snapshot too
    s2.close()
    s3 = _open(tmp_path)
    assert _learn(s3, x, y, "once").body["duplicate"] is True
    s3.close()


def test_ids_in_one_group_are_learned_once(tmp_path):
    s = _open(tmp_path, "ncm")
    x, y, _ = _batches(1)[0]
    # queued before the writer looks: one group holds both
    jobs = [sv._Job("learn", x, y, "same"), sv._Job("learn", x, y, "same")]
    s._learn_group(jobs)
    bodies = [j.future.result(timeout=5).body for j in jobs]
    assert [b["duplicate"] for b in bodies] == [False, True]
    assert s.status()["seen"] == len(y)
    s.close()


def test_a_refused_request_changes_nothing_and_is_not_logged(tmp_path):
    s = _open(tmp_path, "slda")
    x, y, _ = _batches(1)[0]
    _learn(s, x, y, "a")
    before = s.state()
    bad = _learn(s, np.ones((2, 5), np.float32), [0, "text"], "b")  # labels of two kinds
    assert bad.status == 422 and "cannot be mixed" in bad.body["error"]
    assert s.state() == before
    # the refused id is not remembered: the corrected request is learned
    good = _learn(s, np.ones((2, 5), np.float32), [0, 1], "b")
    assert good.body["duplicate"] is False and good.body["seq"] == 2
    s.close()
    assert [q for q, _ in sv.log_ids(tmp_path)] == [1, 2]


def test_a_failed_log_write_refuses_later_learns(tmp_path, monkeypatch):
    s = _open(tmp_path, "ncm")
    x, y, _ = _batches(1)[0]

    def full(blob):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s._segment, "append", full)
    answer = _learn(s, x, y, "a")
    assert answer.status == 503 and "log-" in answer.body["error"]
    assert "No space left" in answer.body["error"]
    assert _learn(s, x, y, "b").status == 503
    s.close()
    s2 = _open(tmp_path)  # nothing was acknowledged, nothing is recovered
    assert s2.status()["seen"] == 0
    s2.close()


def test_another_method_or_settings_are_refused(tmp_path):
    s = _open(tmp_path, "slda")
    s.close()
    with pytest.raises(sv.ServeError, match="serves method 'slda', not 'ncm'"):
        _open(tmp_path, "ncm")
    other = sv.settings_for("slda", {"shrinkage_estimator": "fixed"})
    with pytest.raises(sv.ServeError, match="other settings.*shrinkage_estimator"):
        _open(tmp_path, "slda", other)
    same = sv.settings_for("slda", {})
    _open(tmp_path, "slda", same).close()


def test_a_folder_that_is_not_ciosls_is_refused(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(sv.ServeError, match="not a ciosl serve folder"):
        _open(tmp_path, "ncm")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".lock") == ["thesis.tex"]


def test_a_damaged_log_is_refused_never_reset(tmp_path):
    s = _open(tmp_path, "ncm")
    for x, y, rid in _batches(3):
        _learn(s, x, y, rid)
    s.close()
    (path,) = (tmp_path / "log").iterdir()
    data = bytearray(path.read_bytes())
    data[wal.FILE_HEADER.size + wal.REC_HEADER.size + 6] ^= 0xFF  # inside record 1
    path.write_bytes(bytes(data))
    with pytest.raises(sv.ServeError, match="refusing to start"):
        _open(tmp_path)
    assert path.read_bytes() == bytes(data)  # untouched


def test_one_server_per_folder(tmp_path):
    s = _open(tmp_path, "ncm")
    with pytest.raises(sv.ServeError, match="in use by another ciosl serve"):
        _open(tmp_path, "ncm")
    s.close()
    _open(tmp_path).close()


def test_unknown_settings_are_named():
    with pytest.raises(sv.ServeError, match="unknown setting.*nope"):
        sv.settings_for("ncm", {"nope": "1"})
    with pytest.raises(ValueError, match="shrinkage"):
        sv.settings_for("slda", {"shrinkage": "-3"})


@pytest.mark.parametrize("nice", [0, 7])
def test_the_writer_thread_runs_at_its_nice_value(tmp_path, nice):
    """Learns are applied by a thread of lower priority than the answers' (``writer_nice``):
    its own nice value, the rest of the process unchanged."""
    import os

    before = os.getpriority(os.PRIO_PROCESS, 0)
    s = _open(tmp_path, "ncm", writer_nice=nice)
    try:
        x, y, rid = _batches(1)[0]
        assert _learn(s, x, y, rid).status == 200  # the writer has started and set it
        assert os.getpriority(os.PRIO_PROCESS, s._thread.native_id) == before + nice
        assert os.getpriority(os.PRIO_PROCESS, 0) == before
    finally:
        s.close()


@pytest.mark.parametrize("flag, value, words", [
    ("writer_nice", 20, "--writer-nice must be in 0..19, got 20"),
    ("writer_nice", -1, "--writer-nice must be in 0..19, got -1"),
    ("snapshot_every", -1, "--snapshot-every must be >= 0, got -1")])
def test_bad_serve_flags_are_refused_in_one_line(tmp_path, flag, value, words):
    from ciosl.serve.server import serve_command

    flags = {"snapshot_every": 10, "snapshot_seconds": 0.0, "max_batch": 16,
             "max_body": 4096, "writer_nice": 10, flag: value}
    with pytest.raises(sv.ServeError) as e:
        serve_command(str(tmp_path / "dir"), "ncm", {}, **flags)
    assert str(e.value) == words and not (tmp_path / "dir").exists()


def test_a_lone_surrogate_never_reaches_the_learner_or_the_log(tmp_path):
    """Red-team 6, finding 1: ``"\\ud800"`` is valid JSON but no text; learned, it broke every
    later answer, also after a restart. Refused in one line, naming the label."""
    s = _open(tmp_path, "ncm")
    x = np.ones((2, 5), np.float32)
    answer = _learn(s, x, ["ok", "a\ud800"], "r1")
    assert answer.status == 400
    assert answer.body["error"] == ("y[1]: not valid Unicode text (a lone surrogate U+D800 at "
                                    "character 1)")
    assert _learn(s, x[:1], ["ok"], "id\udfff").body["error"].startswith("id: not valid")
    assert s.status()["seen"] == 0 and s.seq == 0
    assert _learn(s, x, ["ok", "fine"], "r1").status == 200  # the refused id is not kept
    s.state()  # answers
    s.close()
    assert [q for q, _ in sv.log_ids(tmp_path)] == [1]


def test_a_dead_writer_fails_health_and_learns_at_once(tmp_path, monkeypatch):
    """Red-team 6, finding 13: the writer died (OverflowError) and every learn hung while health
    said ok. Now its death is said once, and every learn, queued or later, is answered 503."""
    warned: list[str] = []
    s = sv.Service(tmp_path, "ncm", None, warn=warned.append,
                   options=sv.Options(snapshot_on_close=False, snapshot_seconds=0)).open()
    x, y, _ = _batches(1)[0]
    assert _learn(s, x, y, "a").status == 200 and s.dead() is None

    def boom(jobs):
        raise OverflowError("timeout value is too large")

    monkeypatch.setattr(s, "_learn_group", boom)
    answer = _learn(s, x, y, "b")  # a result, not a hang (the timeout is a guard only)
    assert answer.status == 503 and "OverflowError: timeout value is too large" in \
        answer.body["error"]
    assert s.dead() == answer.body["error"] and len(warned) == 1
    assert _learn(s, x, y, "c").status == 503
    assert s.submit_snapshot().result(timeout=60).status == 503
    s.close()
    assert [q for q, _ in sv.log_ids(tmp_path)] == [1]


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0, 1e12])
def test_snapshot_seconds_must_be_finite(value):
    with pytest.raises(sv.ServeError, match=r"--snapshot-seconds must be a number in 0\.\.\d+"):
        sv.Options(snapshot_seconds=value)


def test_the_state_digest_is_computed_once_per_seq_outside_the_writers_lock(tmp_path,
                                                                          monkeypatch):
    """Red-team 6, finding 7: ``GET /v1/state`` in a loop computed the digest under the writer's
    lock each time (learning fell from 782 to 26 learns/s). Counted, not timed."""
    from ciosl.learners.base import lock_of

    s = _open(tmp_path, "ncm")
    calls: list[bool] = []

    def counting(state):
        calls.append(lock_of(s.learner)._is_owned())  # held by this thread?
        return digest(state)

    monkeypatch.setattr(sv, "digest", counting)
    x, y, _ = _batches(1)[0]
    _learn(s, x, y, "a")
    first = [s.state() for _ in range(20)]
    assert len(calls) == 1 and calls == [False] and all(f == first[0] for f in first)
    _learn(s, x, y, "b")
    second = s.state()
    assert len(calls) == 2 and second["seq"] == 2 and second["digest"] != first[0]["digest"]
    ref = make_learner("ncm")
    sv._apply(ref, x, y)
    sv._apply(ref, x, y)
    assert second["digest"] == digest(ref.state_dict())
    s.close()


@pytest.mark.parametrize("case", ["unrelated", "empty name", "dangling link", "below a link"])
def test_a_folder_refused_is_left_untouched(tmp_path, monkeypatch, case):
    """Red-team 6, finding 18 (and "File exists" for a dangling link): refused before any
    ``.lock`` is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    if case == "unrelated":
        folder, words = tmp_path, "not a ciosl serve folder"
    elif case == "empty name":
        folder, words = "", r"--dir '': give a folder"
    else:
        (tmp_path / "link").symlink_to(tmp_path / "nowhere")
        folder = tmp_path / "link" / ("sub" if case == "below a link" else "")
        words = "a dangling symbolic link"
    with pytest.raises(sv.ServeError, match=words) as e:
        _open(folder, "ncm")
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["notes.txt"] + (["link"] if "link" in case else []))
