"""Learner files: self-describing, read with weights_only=True, refused clearly when they are
of another method, of a newer format, or not learner files at all. (Every method's round trip
is conformance check 6b, ``check_save_load``.)"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import ciosl
from ciosl.learners import get_method
from ciosl.learners.base import FILE_VERSION


@pytest.fixture
def saved(tmp_path):
    learner = ciosl.make_learner("tinyer", buffer=50)
    rng = np.random.default_rng(0)
    for i in range(30):
        learner.learn_one(rng.normal(size=4), ["a", "b"][i % 2])
    return learner, learner.save(tmp_path / "l.ciosl")


def test_file_describes_itself(saved):
    learner, path = saved
    blob = torch.load(path, weights_only=True)
    assert blob["method"] == "tinyer" and blob["format_version"] == FILE_VERSION
    assert blob["ciosl_version"] == ciosl.__version__
    assert blob["settings"] == learner.get_params()
    assert ciosl.Learner.load(path).classes_ == ["a", "b"]


def test_loading_with_another_method_is_refused(saved):
    _, path = saved
    with pytest.raises(ValueError, match="holds a 'tinyer' learner, not 'ciosl'"):
        get_method("ciosl").load(path)


def test_newer_format_is_refused(saved):
    _, path = saved
    blob = torch.load(path, weights_only=True)
    blob["format_version"] = FILE_VERSION + 1
    torch.save(blob, path)
    with pytest.raises(ValueError, match="newer than this ciosl supports.*upgrade"):
        ciosl.Learner.load(path)


class Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('ran')",))


def test_files_never_run_code_and_garbage_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.ciosl"
    evil.write_bytes(pickle.dumps({"format": "ciosl-learner", "x": Payload()}))
    with pytest.raises(ValueError, match="not a readable ciosl learner file"):
        ciosl.Learner.load(evil)
    torch.save({"format": "ciosl-learner", "x": Payload()}, tmp_path / "evil2.ciosl")
    with pytest.raises(ValueError, match="not a readable"):
        ciosl.Learner.load(tmp_path / "evil2.ciosl")
    assert not (tmp_path / "PWNED").exists()  # the payload never ran
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a ciosl learner file"):
        ciosl.Learner.load(tmp_path / "other.pt")
    (tmp_path / "cut.ciosl").write_bytes(b"\x80\x02")
    with pytest.raises(ValueError, match="not a readable"):
        ciosl.Learner.load(tmp_path / "cut.ciosl")
    with pytest.raises(FileNotFoundError):
        ciosl.Learner.load(tmp_path / "absent.ciosl")
