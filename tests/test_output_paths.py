"""Where ciosl writes: never outside the folder given. A dangling symbolic link (a link to
nothing) as a learner file, as ``--out``, at a result's name or at a checkpoint's name is named
as such, refused before any work, and never followed into a chain of new folders; an empty path
is named as empty.

Before: ``L.save(link)`` created the link target's missing folders (``fileio._destination`` +
``mkdir(parents=True)``); ``--out link`` said "cannot write there (File exists)"; a link at the
result's name was followed after the whole run was computed (with ``--force``) or named as "No
such file or directory"; at the checkpoint's name with ``--resume``, "No such file or
directory"; ``L.save('')`` gave a ``FileExistsError`` naming ``''``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.cli import main
from ciosl.learners.base import Learner

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--method", "ncm",
         "--limit-per-class", "12", "--offline-epochs", "2", "--quiet"]
NAME = "digits_class_iid_ncm_limit_per_class=12+offline_epochs=2"  # QUICK's result, no suffix


def learner() -> Learner:
    L = make_learner("ncm")
    L.learn_many(np.eye(3, dtype=np.float32), [0, 1, 2])
    return L


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (links not followed)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def one_error_line(capsys, argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---------------------------------------------------------------------------- library


@pytest.mark.parametrize("target", ["missing/a/b/m.ciosl", "missing/m.ciosl"])
def test_saving_through_a_dangling_link_never_creates_folders(tmp_path, target):
    (tmp_path / "given").mkdir()
    link = tmp_path / "given" / "m.ciosl"
    link.symlink_to(tmp_path / "elsewhere" / target)
    (tmp_path / "elsewhere").mkdir()
    before = tree(tmp_path)
    with pytest.raises(OSError, match="a dangling symbolic link .*: refused to create folders"):
        learner().save(link)
    assert tree(tmp_path) == before  # not one folder made along the link


def test_saving_through_a_link_whose_target_folder_exists_writes_the_target(tmp_path):
    # writing through a link stays (docs/refused.md): the link kept, its target written
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "m.ciosl"
    link.symlink_to(tmp_path / "elsewhere" / "m.ciosl")
    L = learner()
    L.save(link)
    assert link.is_symlink() and (tmp_path / "elsewhere" / "m.ciosl").is_file()
    assert Learner.load(link).classes_ == L.classes_


def test_saving_under_a_dangling_link_folder_names_the_link(tmp_path):
    (tmp_path / "dir").symlink_to(tmp_path / "gone")
    with pytest.raises(ValueError, match=r"dir: a dangling symbolic link \(to .*gone"):
        learner().save(tmp_path / "dir" / "sub" / "m.ciosl")
    assert tree(tmp_path) == {"dir"}


@pytest.mark.parametrize("path", ["", Path("")])
def test_saving_to_an_empty_path_is_named_as_empty(tmp_path, path):
    if isinstance(path, Path):  # Path("") is "." itself: a folder, refused as one
        with pytest.raises(OSError, match=r"not a regular file \(a folder\)"):
            learner().save(path)
        return
    with pytest.raises(ValueError, match="cannot write to an empty path ''; give a file name"):
        learner().save(path)


# ---------------------------------------------------------------------------- ciosl run

# (what the dangling link stands for, extra flags) -> refused before any work, named
CASES = [
    ("out", []),
    ("out", ["--force"]),
    ("result", []),
    ("result", ["--force"]),
    ("checkpoint", ["--resume"]),
    ("checkpoint", []),
    ("checkpoint", ["--force"]),
    ("out parent", []),
]


@pytest.mark.parametrize("what,extra", CASES, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else v)
def test_a_dangling_link_in_the_way_of_a_run_is_refused_before_any_work(
        tmp_path, capsys, monkeypatch, what, extra):
    out = tmp_path / "out"
    target = tmp_path / "nowhere" / "a" / "b"
    if what == "out":
        out.symlink_to(target)
    elif what == "out parent":
        (tmp_path / "up").symlink_to(target)
        out = tmp_path / "up" / "out"
    else:
        out.mkdir()
        suffix = ".json" if what == "result" else ".ckpt"
        (out / f"{NAME}{suffix}").symlink_to(target / f"x{suffix}")
    calls = []
    import ciosl.evaluation.experiment as experiment

    real = experiment.load_features
    monkeypatch.setattr(experiment, "load_features",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    before = tree(tmp_path)
    line = one_error_line(capsys, ["run", *QUICK, "--cache", str(tmp_path / "cache"),
                                   "--out", str(out), *extra])
    assert "a dangling symbolic link (to " in line and str(tmp_path / "nowhere") in line
    assert "before any work" in line
    assert calls == []  # refused before any feature was loaded, let alone a run computed
    assert tree(tmp_path) == before  # nothing made: no folder, no cache, no result
