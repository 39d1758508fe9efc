"""A learner defined outside the package: the README's example through `ciosl run --method
module:Class`, a sweep grid and the report; `ciosl.check_learner`; the entry-point group."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ciosl
from ciosl.conformance import CHECKS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_learner() -> str:
    (code,) = re.findall(r"```python\n(# my_method\.py.*?)```", README.read_text(), re.S)
    return code


def cli(args: list[str], cwd: Path, extra_path: str = "") -> subprocess.CompletedProcess:
    """``python -m ciosl`` with this checkout's package (the console script may be another's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (extra_path, str(ROOT / "src")) if p), "CIOSL_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "ciosl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_readme_learner_runs_through_ciosl_run_sweep_and_report(tmp_path):
    (tmp_path / "my_method.py").write_text(readme_learner())
    done = cli(["run", "--method", "my_method:CosineMeans", "--seeds", "0,1",
                "--limit-per-class", "30", "--quiet", "--out", "res"], tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    (result,) = (tmp_path / "res").glob("*.json")
    data = json.loads(result.read_text())
    assert data["method"] == "cosine_means" and len(data["runs"]) == 2
    assert data["omega_all"]["mean"] > 0.7  # nearly as good as the offline learner on digits

    (tmp_path / "grid.toml").write_text(
        'name = "ext"\nout = "sweep"\nruns = 1\ndatasets = ["digits"]\n'
        'orderings = ["class_iid"]\nlimit_per_class = 30\n'
        'methods = ["ncm", "my_method:CosineMeans"]\n'
        '[settings."my_method:CosineMeans"]\nscale = 5.0\n')
    done = cli(["sweep", "grid.toml", "--workers", "1"], tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    done = cli(["report", "sweep"], tmp_path)
    assert done.returncode == 0, done.stderr + done.stdout
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert re.search(r"\| cosine_means \(scale=5\.0\) \| \*?\*?0\.\d{4}", report), report

    done = cli(["run", "--method", "my_method:Nope", "--seeds", "0"], tmp_path)
    assert done.returncode != 0 and "has no 'Nope'" in done.stderr


def test_check_learner_passes_the_readme_learner_and_names_a_failing_check(tmp_path,
                                                                          monkeypatch):
    (tmp_path / "my_method_b.py").write_text(
        readme_learner().replace('name = "cosine_means"', 'name = "cosine_means_b"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_method_b

    passed = ciosl.check_learner(my_method_b.CosineMeans)
    assert len(passed) == len(CHECKS)

    class Uniform(my_method_b.CosineMeans):  # answers the same for every input
        name = "uniform_b"

        def _predict_proba(self, Z):
            return np.full((len(Z), len(self.classes_)), 1.0 / len(self.classes_))

    with pytest.raises(AssertionError, match="check_emerging_classes"):
        ciosl.check_learner(Uniform)


def test_entry_point_group_registers_an_installed_learner(tmp_path):
    site = tmp_path / "site"
    (site / "plug_0.1.dist-info").mkdir(parents=True)
    (site / "plug_0.1.dist-info" / "METADATA").write_text("Name: plug\nVersion: 0.1\n")
    (site / "plug_0.1.dist-info" / "entry_points.txt").write_text(
        "[ciosl.learners]\ncosine_means = my_method:CosineMeans\n")
    (site / "my_method.py").write_text(readme_learner())
    done = cli(["methods", "cosine_means"], tmp_path, extra_path=str(site))
    assert done.returncode == 0, done.stderr
    assert "cosine_means" in done.stdout and "scale" in done.stdout
