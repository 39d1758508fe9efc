"""Issue 29, members found by a second probe of this stop: a report written over a result or a
grid, writes that replace a FIFO, a device or a symbolic link, a learner file that names a
module to import, an interrupted run's checkpoint dropped by a rerun, names too long for a file
system, and a damaged sweep run file that stopped every later sweep. Each test failed before
its fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import fit_name
from ciosl.evaluation.grid import GridError, load_grid
from ciosl.evaluation.sweep import result_file, run_file, run_sweep
from ciosl.fileio import atomic_write_bytes
from ciosl.learners import make_learner
from ciosl.learners.base import Learner
from test_red_team import cli, interrupt_second_run, one_line_error
from test_red_team_2 import make_fifo, run_args

# ---------------------------------------------------------------------------- the report's --out


@pytest.fixture
def results(tmp_path, capsys) -> Path:
    assert cli(capsys, run_args(tmp_path))[0] == 0
    return tmp_path / "out"


def test_a_report_never_replaces_a_file_that_is_no_report(results, tmp_path, capsys):
    (result,) = results.glob("*.json")
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n')
    for target, fmt in ((result, "html"), (grid, "md")):
        before = target.read_bytes()
        line = one_line_error(*cli(capsys, ["report", str(results), "--format", fmt, "--out",
                                            str(target)]))
        assert line == (f"error: --out {target}: holds a file that is not a ciosl report: "
                        "refused to replace it; choose another --out, or delete it first")
        assert target.read_bytes() == before


def test_a_report_replaces_an_earlier_report(results, tmp_path, capsys):
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        assert cli(capsys, ["report", str(results), "--format", fmt, "--out", str(out)])[0] == 0
        out.write_text(out.read_text() + "\nan old line\n")
        assert cli(capsys, ["report", str(results), "--format", fmt, "--out", str(out)])[0] == 0
        assert "an old line" not in out.read_text()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_report_onto_a_fifo_or_a_device_is_refused_before_drawing(results, tmp_path, capsys,
                                                                   kind):
    target = make_fifo(tmp_path, "f") if kind == "fifo" else Path("/dev/null")
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    line = one_line_error(*cli(capsys, ["report", str(results), "--out", str(target)]))
    assert line == f"error: --out {target}: not a regular file ({what}): refused to replace it"
    assert not (tmp_path / "figures").exists()
    assert kind == "device" or target.is_fifo()


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


def test_saving_a_learner_onto_a_fifo_is_refused_and_leaves_it(tmp_path):
    fifo = make_fifo(tmp_path, "model.ciosl")
    learner = make_learner("ncm")
    with pytest.raises(OSError, match="not a regular file"):
        learner.save(fifo)
    assert fifo.is_fifo()


def test_a_learner_file_never_imports_the_module_it_names(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "rt3b_planted.py").write_text(f"open({str(marker)!r}, 'w').close()\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    learner = make_learner("ncm")
    path = tmp_path / "m.ciosl"
    learner.save(path)
    blob = torch.load(path, weights_only=True)
    blob["method"] = "rt3b_planted:X"
    torch.save(blob, path)
    with pytest.raises(ValueError, match="holds a learner of method 'rt3b_planted:X', which is "
                                         "not registered here"):
        Learner.load(path)
    assert not marker.exists()


# ---------------------------------------------------------------------------- checkpoints


def test_a_rerun_without_resume_keeps_an_interrupted_runs_work(tmp_path, capsys, monkeypatch):
    real = experiment.run_seed
    interrupt_second_run(monkeypatch)
    assert cli(capsys, run_args(tmp_path, "--runs", "2"))[0] == 130
    monkeypatch.setattr(experiment, "run_seed", real)
    (ckpt,) = (tmp_path / "out").glob("*.ckpt")
    before = ckpt.read_bytes()
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--runs", "2")))
    assert line == (f"error: {ckpt} holds the work of an interrupted run of this result: "
                    "--resume continues it; --force starts over, dropping it")
    assert ckpt.read_bytes() == before
    assert cli(capsys, run_args(tmp_path, "--runs", "2", "--force"))[0] == 0
    assert not ckpt.exists()


# ---------------------------------------------------------------------------- long names


def test_names_too_long_for_a_file_system_are_shortened_without_collisions():
    short = "digits_iid_ncm"
    assert fit_name(short) == short
    a, b = fit_name("x" * 300), fit_name("x" * 299 + "y")
    assert a != b and len(a.encode()) <= 200 and len(b.encode()) <= 200
    assert len(fit_name("é" * 300).encode()) <= 200


def test_a_sweep_with_a_very_long_variant_name_runs_and_reports(tmp_path, capsys):
    path = tmp_path / "long.toml"
    path.write_text(f'name = "long"\nout = "{tmp_path}/out"\ncache = "{tmp_path}/cache"\n'
                    'datasets = ["digits"]\norderings = ["iid"]\nmethods = ["ncm"]\nruns = 1\n'
                    f'limit_per_class = 12\n[variants.ncm.{"a" * 300}]\ntemperature = 2.0\n')
    grid = load_grid(path)
    summary = run_sweep(grid, executor="local", workers=1)
    assert (summary.computed, summary.failed) == (1, [])
    assert json.loads(result_file(grid.out, grid.cells[0]).read_text())["runs"]
    assert cli(capsys, ["report", str(grid.out), "--out", str(tmp_path / "r.md")])[0] == 0


# ---------------------------------------------------------------------------- damaged run files


@pytest.mark.parametrize("damage", [
    lambda s: {**s, "run": {}},
    lambda s: {**s, "wall_seconds": "abc"},
    lambda s: {**s, "run": {**s["run"], "accuracy": [2.0] * len(s["run"]["accuracy"])}},
], ids=["empty-run", "text-seconds", "accuracy-out-of-range"])
def test_a_damaged_run_file_is_computed_again(tmp_path, damage):
    path = tmp_path / "g.toml"
    path.write_text(f'name = "g"\nout = "{tmp_path}/out"\ncache = "{tmp_path}/cache"\n'
                    'datasets = ["digits"]\norderings = ["iid"]\nmethods = ["ncm"]\nruns = 1\n'
                    'limit_per_class = 12\n')
    grid = load_grid(path)
    run_sweep(grid, executor="local", workers=1)
    rf, cell = run_file(grid.out, grid.cells[0], 0), result_file(grid.out, grid.cells[0])
    good = json.loads(rf.read_text())
    rf.write_text(json.dumps(damage(good)))
    os.unlink(cell)
    summary = run_sweep(grid, executor="local", workers=1)
    assert (summary.computed, summary.failed) == (1, [])
    assert json.loads(rf.read_text())["run"]["accuracy"] == good["run"]["accuracy"]


def test_a_missing_weights_file_of_a_grid_is_blamed_on_its_key(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('name = "w"\ndatasets = ["digits"]\norderings = ["iid"]\nmethods = ["ncm"]\n'
                    f'extractor = "efficientnet_lite0"\nweights = "{tmp_path}/none.pth"\n')
    with pytest.raises(GridError, match=r"w\.toml: weights: "):
        load_grid(path)


def test_a_report_of_an_earlier_version_is_still_replaced(results, tmp_path, capsys):
    """A demo folder's report.html from before the generator tag: `make demo` rewrites it."""
    out = tmp_path / "old.html"
    assert cli(capsys, ["report", str(results), "--format", "html", "--out", str(out)])[0] == 0
    out.write_text(out.read_text().replace('<meta name="generator" content="ciosl report">', ""))
    assert cli(capsys, ["report", str(results), "--format", "html", "--out", str(out)])[0] == 0
    assert '<meta name="generator" content="ciosl report">' in out.read_text()
