"""Learner files (``Learner.save`` / ``Learner.load``): damaged, edited or hostile files (a flipped
bit, a zip bomb, an inconsistent state, a module name) are refused in one line; a full disk or a
FIFO as the target is named."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from ciosl.learners import make_learner
from ciosl.learners.base import Learner
from helpers import (
    D,
    fail_with,
    flip,
    make_fifo,
    member_span,
    snapshot,
    trained,
    zip_bomb,
)


def saved_blob(tmp_path: Path, method: str = "ncm") -> dict:
    import torch

    path = trained(method).save(tmp_path / "l.ciosl")
    return torch.load(path, weights_only=True)


def fewer_classes(b):
    b["state"]["classes"] = b["state"]["classes"][:1]


def nan_tensor(b):
    b["state"]["state"]["mu"][0, 0] = float("nan")


LOAD_CASES = [
    ("classes-fewer-than-outputs", fewer_classes,
     "inconsistent learner state: the model answers with 2 outputs for 1 classes"),
    ("nan-tensor", nan_tensor, "inconsistent learner state: state.mu holds NaN"),
    ("out-of-range-setting", lambda b: b["state"]["params"].update(temperature=-5.0),
     "inconsistent learner state: params: ncm: temperature must be > 0, got -5.0"),
    ("params-overwrite-name", lambda b: b["state"]["params"].update(name="slda"),
     "inconsistent learner state: unknown setting(s) name in params"),
    ("missing-key", lambda b: b.pop("settings"), "damaged ciosl learner file: missing settings"),
    ("missing-state-key", lambda b: b["state"].pop("n_seen"),
     "inconsistent learner state: missing n_seen"),
    ("format-version-not-int", lambda b: b.update(format_version="1"),
     "format_version must be an integer, got '1'"),
    ("mixed-classes", lambda b: b["state"].update(classes=[0, "1"]), "classes mix integers and strings"),
    ("duplicate-classes", lambda b: b["state"].update(classes=[1, 1]), "classes lists a label twice"),
]


@pytest.mark.parametrize(("damage", "fragment"), [c[1:] for c in LOAD_CASES],
                         ids=[c[0] for c in LOAD_CASES])
def test_damaged_learner_files_are_refused_clearly(damage, fragment, tmp_path):

    import torch

    import ciosl

    blob = saved_blob(tmp_path)
    damage(blob)
    buf = io.BytesIO()
    torch.save(blob, buf)
    (tmp_path / "bad.ciosl").write_bytes(buf.getvalue())
    with pytest.raises(ValueError) as info:
        ciosl.Learner.load(tmp_path / "bad.ciosl")
    assert fragment in str(info.value) and str(tmp_path / "bad.ciosl") in str(info.value)


def test_learner_file_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    import torch

    import ciosl

    path = tmp_path / "bomb.ciosl"
    path.write_bytes(zip_bomb("bomb/data.pkl"))
    monkeypatch.setattr(torch, "load", fail_with(AssertionError("inflated")))
    with pytest.raises(ValueError, match="refused as a zip bomb"):
        ciosl.Learner.load(path)


def test_save_names_the_target_when_the_disk_is_full(tmp_path, monkeypatch):
    import ciosl.fileio
    from ciosl.errors import message

    learner = trained("ncm")
    target = tmp_path / "model.ciosl"

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ciosl.fileio.os, "fsync", full)
    with pytest.raises(OSError) as err:
        learner.save(target)
    assert message(err.value) == f"{target}: No space left on device"
    assert not list(tmp_path.iterdir())  # no temporary left behind


INTEGRITY_CASES = [  # (id, which member, where in it)
    ("tensor-first-byte", "/data/0", 0),
    ("tensor-middle", "/data/0", 0.5),
    ("tensor-last-byte", "/data/0", -1),
    ("pickle", "data.pkl", 0.5),
]


@pytest.mark.parametrize(("member", "where"), [c[1:] for c in INTEGRITY_CASES],
                         ids=[c[0] for c in INTEGRITY_CASES])
def test_a_flipped_bit_in_a_learner_file_is_refused(member, where, tmp_path):
    import ciosl

    learner = trained("ncm")
    data = learner.save(tmp_path / "a.ciosl").read_bytes()
    start, end = member_span(data, member)
    pos = start + (int((end - start) * where) if isinstance(where, float) else where % (
        end - start))
    bad = tmp_path / "b.ciosl"
    bad.write_bytes(flip(data, pos, 3))
    with pytest.raises(ValueError, match=f"{bad}: (not a readable ciosl learner file "
                                         r"\(damaged\)|damaged ciosl learner file)"):
        ciosl.Learner.load(bad)


def test_no_single_flipped_bit_changes_a_loaded_learner_silently(tmp_path):
    import ciosl

    learner = trained("ncm")
    data = learner.save(tmp_path / "a.ciosl").read_bytes()
    Z = np.random.default_rng(1).normal(size=(5, D))
    P = learner.predict_proba(Z)
    bad = tmp_path / "b.ciosl"
    for pos in range(0, len(data), 7):  # every 7th byte, each bit in turn
        bad.write_bytes(flip(data, pos, pos % 8))
        try:
            loaded = ciosl.Learner.load(bad)
        except ValueError:
            continue
        assert loaded.get_params() == learner.get_params(), pos
        assert np.array_equal(loaded.predict_proba(Z), P), pos
        assert snapshot(loaded) == snapshot(learner), pos


def test_saving_a_learner_onto_a_fifo_is_refused_and_leaves_it(tmp_path):
    fifo = make_fifo(tmp_path, "model.ciosl")
    learner = make_learner("ncm")
    with pytest.raises(OSError, match="not a regular file"):
        learner.save(fifo)
    assert fifo.is_fifo()


def test_a_learner_file_imports_only_the_class_path_it_records_and_only_when_intact(
        tmp_path, monkeypatch):
    """A method name alone never imports anything; the recorded class path (``class``) is
    imported from sys.path, and not at all from a file whose checksum fails."""
    from ciosl.serial import CHECKSUM_KEY, with_checksum

    marker = tmp_path / "imported"
    (tmp_path / "rt3b_planted.py").write_text(f"open({str(marker)!r}, 'w').close()\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    learner = make_learner("ncm")
    path = tmp_path / "m.ciosl"
    learner.save(path)
    blob = torch.load(path, weights_only=True)
    assert blob["class"] == "ciosl.learners.ncm:NCM"
    rest = {k: v for k, v in blob.items() if k not in (CHECKSUM_KEY, "class")}
    torch.save(with_checksum({**rest, "method": "rt3b_planted:X"}), path)  # no class recorded
    with pytest.raises(ValueError, match="method 'rt3b_planted:X' is not registered here and no "
                                         "import path is recorded"):
        Learner.load(path)
    torch.save({**blob, "method": "rt3b", "class": "rt3b_planted:X"}, path)  # checksum fails
    with pytest.raises(ValueError, match="damaged ciosl learner file"):
        Learner.load(path)
    assert not marker.exists()
