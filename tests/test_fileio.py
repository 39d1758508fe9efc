"""Files that are not regular files (FIFOs, devices, symbolic links) and full disks: refused at
once or written through, never read until they block, never replaced; errors name the file asked
for, not its temporary."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from ciosl.fileio import atomic_write_bytes
from helpers import (
    NAME,
    cli,
    make_fifo,
    one_line_error,
    run_args,
)

# ---------------------------------------------------------------------------- hangs: not files
# (id, setup(tmp) -> argv, fragment); each answers at once (a thread would hang otherwise)


def checkpoint_fifo(tmp: Path) -> list[str]:
    (tmp / "out").mkdir()
    os.mkfifo(tmp / "out" / NAME.replace(".json", ".ckpt"))
    return run_args(tmp, "--runs", "1", "--resume")


NOT_A_FILE_CASES = [
    ("grid-fifo", lambda t: ["sweep", str(make_fifo(t, "g.toml"))],
     "g.toml: not a regular file (a FIFO (named pipe))"),
    ("grid-dev-zero", lambda t: ["sweep", "/dev/zero"],
     "/dev/zero: not a regular file (a character device)"),
    ("grid-dry-run-dev-zero", lambda t: ["sweep", "/dev/zero", "--dry-run"],
     "/dev/zero: not a regular file (a character device)"),
    ("grid-too-large", lambda t: ["sweep", str(t / "big.toml")] if (t / "big.toml").write_bytes(
        b"#" * (17 * 2**20)) else None, "larger than the 16777216 bytes"),
    ("grid-not-utf8", lambda t: ["sweep", str(t / "g.toml")] if (t / "g.toml").write_bytes(
        b'name = "\xff"\n') else None, "g.toml: not UTF-8 text (byte 8"),
    ("checkpoint-fifo", checkpoint_fifo, ".ckpt: not a regular file (a FIFO (named pipe))"),
    ("weights-fifo", lambda t: run_args(t, "--weights", str(make_fifo(t, "w.pth"))),
     "w.pth: not a regular file (a FIFO (named pipe))"),
    ("weights-dev-zero", lambda t: run_args(t, "--weights", "/dev/zero"),
     "--weights /dev/zero: not a regular file (a character device)"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in NOT_A_FILE_CASES],
                         ids=[c[0] for c in NOT_A_FILE_CASES])
def test_fifos_and_devices_are_refused_at_once(argv, fragment, tmp_path, capsys):
    args = argv(tmp_path)
    answer: list = []
    worker = threading.Thread(target=lambda: answer.append(cli(capsys, args)), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the reader, then fail
        for fifo_path in tmp_path.rglob("*"):
            if fifo_path.is_fifo():
                with open(fifo_path, "wb", buffering=0) as f:
                    f.write(b"x")
        pytest.fail("the command blocked on a FIFO or a device")
    line = one_line_error(*answer[0])
    assert fragment in line


def test_read_json_skips_fifos_and_devices(tmp_path):
    from ciosl.fileio import load_json, read_json

    fifo_path = make_fifo(tmp_path, "r.json")
    assert read_json(fifo_path) is None and read_json("/dev/zero") is None
    with pytest.raises(ValueError, match="nested too deeply"):
        (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
        load_json(tmp_path / "deep.json")


def test_a_full_disk_names_the_file_asked_for_not_its_temporary(tmp_path, monkeypatch):

    from ciosl import fileio

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "fsync", full)
    target = tmp_path / "result.json"
    with pytest.raises(OSError, match="No space left on device") as e:
        fileio.atomic_write_json(target, {"a": 1})
    assert e.value.filename == str(target)
    assert not list(tmp_path.iterdir())  # no temporary left behind, nothing written


@pytest.mark.parametrize("what", ["learner", "checkpoint"])
def test_a_fifo_given_as_a_learner_file_or_checkpoint_is_refused_at_once(what, tmp_path):
    from ciosl.evaluation.checkpoint import load_checkpoint
    from ciosl.learners import Learner

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    load = Learner.load if what == "learner" else (lambda p: load_checkpoint(p, "x"))
    with pytest.raises(ValueError, match=r"pipe: not a regular file \(a FIFO"):
        load(fifo)  # returns at once: nothing opens the pipe


# ---------------------------------------------------------------------------- every write


def test_writes_never_replace_a_fifo_and_go_through_a_symbolic_link(tmp_path):
    fifo = make_fifo(tmp_path, "fifo")
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO \(named pipe\)\): refused"):
        atomic_write_bytes(fifo, b"x")
    assert fifo.is_fifo()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    atomic_write_bytes(link, b"through")
    assert link.is_symlink() and (tmp_path / "target").read_bytes() == b"through"
