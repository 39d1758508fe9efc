"""``ciosl sweep``: refusals before any work (an unwritable output, a huge grid), grid names that
never leave the results folder, no worker outliving its driver, plain progress lines without a
terminal, long variant names, damaged run files computed again."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment
from ciosl.evaluation.grid import GridError, load_grid
from ciosl.evaluation.sweep import result_file, run_file, run_sweep
from helpers import (
    cli,
    grid_file,
    one_line_error,
    run_args,
)


def test_sweep_with_unwritable_out_is_refused_before_loading(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    grid = tmp_path / "g.toml"
    grid.write_text(f'out = "{blocker}/x"\ncache = "{tmp_path}/cache"\ndatasets = ["digits"]\n'
                    'orderings = ["class_iid"]\nmethods = ["ncm"]\nruns = 1\n'
                    'limit_per_class = 12\n')
    line = one_line_error(*cli(capsys, ["sweep", str(grid)]))
    assert "cannot write there (Not a directory)" in line
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------- hangs, leaks, bombs


def descendants(pid: int) -> list[int]:
    out, stack = [], [pid]
    while stack:
        for children in Path(f"/proc/{stack.pop()}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except OSError:
                continue
            out += kids
            stack += kids
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_no_worker_survives_its_sweep_driver(sig, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    grid = tmp_path / "g.toml"
    grid.write_text(f'out = "{tmp_path}/out"\ncache = "{tmp_path}/cache"\n'
                    'datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["ciosl"]\n'
                    'runs = 6\nlimit_per_class = 150\n')
    env = {**os.environ, "PYTHONPATH": str(Path(experiment.__file__).parents[2])}
    driver = subprocess.Popen([sys.executable, "-m", "ciosl", "sweep", str(grid), "--workers",
                               "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        deadline = time.time() + 240
        while time.time() < deadline and driver.poll() is None:
            workers = [p for p in descendants(driver.pid) if alive(p)]
            if len(workers) >= 2 and list((tmp_path / "cache").glob("offline/*.json")):
                break  # the workers are up and computing
            time.sleep(0.5)
        assert driver.poll() is None and len(workers) >= 2, driver.communicate()
        os.kill(driver.pid, getattr(signal, sig))
        driver.wait(timeout=300)  # hang guards, generous: a busy machine is slow, not wrong
        deadline = time.time() + 120
        while time.time() < deadline and any(alive(p) for p in workers):
            time.sleep(0.5)
        assert not [p for p in workers if alive(p)]
        if sig == "SIGTERM":  # handled as Ctrl-C: one line, finished runs kept
            err = driver.stderr.read().decode()
            assert driver.returncode == 130 and "Traceback" not in err, err
            assert "interrupted: finished runs are saved" in err
    finally:  # whatever happened, leave no process of this test behind
        for p in [driver.pid, *descendants(driver.pid), *workers]:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_dry_run_of_a_huge_grid_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """Refused before any seed list or cell is built: the work is counted (the cells checked,
    the run files read, the memory allocated: 100,000,000 seeds are a list of 800 MB), never
    timed (a test must not depend on how busy the machine is)."""
    import tracemalloc

    from ciosl.evaluation import sweep

    checked, read = [], []
    real_validate, real_read = sweep.validate, sweep.read_json
    monkeypatch.setattr(sweep, "validate", lambda exp: checked.append(exp) or real_validate(exp))
    monkeypatch.setattr(sweep, "read_json", lambda p: read.append(p) or real_read(p))
    path = grid_file(tmp_path, 'methods = ["ncm"]\nruns = 100000000')
    tracemalloc.start()
    try:
        line = one_line_error(*cli(capsys, ["sweep", path, "--dry-run"]))
        assert "runs: at most 10000 runs per cell, got 100000000" in line
        line = one_line_error(*cli(capsys, run_args(tmp_path, "--runs", "100000000")))
        assert "--runs: at most 10000 runs per cell, got 100000000" in line
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert checked == [] and peak < 100 * 2**20  # no cell checked, no huge list made
    # the largest grid allowed lists its cells: each checked once, whatever its runs
    path = grid_file(tmp_path, 'methods = ["ncm", "slda"]\nruns = 10000')
    assert main(["sweep", path, "--dry-run"]) == 0
    assert "0/10000" in capsys.readouterr().out
    assert len(checked) == 2 and read == []  # 2 cells; no run file exists to read


GRID_NAME_CASES = [
    ("dot", '"."'), ("empty", '""'), ("dotdot", '".."'), ("parent-path", '"../../x y"'),
    ("slash", '"a/b"'), ("space", '"x y"'), ("absolute", '"/tmp/x"'), ("hidden", '".x"'),
]


@pytest.mark.parametrize("name", [c[1] for c in GRID_NAME_CASES],
                         ids=[c[0] for c in GRID_NAME_CASES])
def test_grid_names_never_leave_the_results_folder(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "g.toml"
    path.write_text(f'name = {name}\ndatasets = ["digits"]\norderings = ["class_iid"]\n'
                    f'methods = ["ncm"]\nruns = 1\nlimit_per_class = 12\ncache = "{tmp_path}/c"\n')
    line = one_line_error(*cli(capsys, ["sweep", str(path)]))
    assert f"{path}: name: " in line and "not a plain folder name" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.toml"]


def test_a_grid_without_a_name_gets_a_safe_one_from_its_file(tmp_path):
    from ciosl.evaluation.grid import load_grid

    path = Path(grid_file(tmp_path, 'methods = ["ncm"]', name="my grid.toml"))
    path.write_text(path.read_text().replace(f'out = "{tmp_path}/out"\n', ""))
    assert load_grid(path).name == "my-grid"


def test_a_sweep_without_a_terminal_reports_progress_in_plain_lines(tmp_path, capsys,
                                                                    monkeypatch):
    """A sweep whose output goes to a log says how far it is while cells run, not only when
    one finishes: runs done of the total, what runs and what is left, the time spent."""
    from ciosl.report import console

    monkeypatch.setattr(console, "PLAIN_PROGRESS_SECONDS", 0.0)
    grid = grid_file(tmp_path, 'methods = ["ncm", "slda"]\nruns = 2\noffline_epochs = 2')
    assert main(["sweep", grid, "--workers", "1"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("sweep: ")]
    assert lines, err
    assert lines[0].startswith("sweep: 0 / 4 runs (") and " elapsed" in lines[0]
    assert lines[-1].startswith("sweep: 4 / 4 runs (0 running, 0 left), ")
    assert "\x1b" not in err


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


# ---------------------------------------------------------------------------- extraction flags


def test_device_backend_threads_reach_every_cell(tmp_path, capsys, monkeypatch):
    from ciosl.evaluation import sweep

    grids = []
    monkeypatch.setattr(sweep, "run_sweep", lambda grid, **k: grids.append(grid) or 1 / 0)
    path = grid_file(tmp_path, 'methods = ["ncm", "slda"]\nruns = 1')
    cli(capsys, ["sweep", path, "--device", "cpu", "--backend", "torch", "--threads", "3"])
    (grid,) = grids
    assert {(e.device, e.backend, e.extract_threads) for e in map(grid.experiment, grid.cells)
            } == {("cpu", "torch", 3)}
    plain = load_grid(path)
    assert plain.experiment(plain.cells[0]).backend is None  # $CIOSL_BACKEND, else auto


@pytest.mark.parametrize("flag, value, fragment", [
    ("--backend", "bogus", "--backend 'bogus': expected one of"),
    ("--device", "tpu", "--device 'tpu': expected one of"),
    ("--threads", "0", "--threads 0: expected an integer >= 1"),
])
def test_sweep_extraction_flags_refused_in_one_line(flag, value, fragment, tmp_path, capsys):
    path = grid_file(tmp_path, 'methods = ["ncm"]\nruns = 1')
    line = one_line_error(*cli(capsys, ["sweep", path, "--dry-run", flag, value]))
    assert fragment in line


# ---------------------------------------------------------------------------- two sweeps, one folder

GATED_SWEEP = '''
import os
import time
from pathlib import Path

from ciosl.learners.ncm import NCM


class L(NCM):
    """NCM that, where CIOSL_TEST_GATE names a file, says it started and waits while the file
    exists: a run that is computing, for as long as the test needs."""
    name = "{name}"

    def _learn_one(self, z, yi):
        gate = os.environ.get("CIOSL_TEST_GATE")
        if gate:
            Path(gate + ".started").touch()
            for _ in range(3000):
                if not Path(gate).exists():
                    break
                time.sleep(0.1)
        super()._learn_one(z, yi)
'''
HANG_GUARD = 300  # seconds: only to end a test that would otherwise hang; never asserted on


def _summary_counts(stdout: str) -> dict[str, int]:
    text = " ".join(stdout.split())  # rich may wrap the line
    counts = {"computed": r"(\d+) computed", "elsewhere": r"(\d+) by another sweep"}
    return {k: int(m.group(1)) if (m := re.search(p, text)) else 0 for k, p in counts.items()}


def _same_numbers(result: dict) -> dict:
    keys = ("seeds", "omega_all", "final_accuracy", "forgetting", "accuracy_matrix", "settings")
    return {**{k: result[k] for k in keys},
            "runs": [{k: r[k] for k in ("accuracy", "accuracy_offline", "omega_all")}
                     for r in result["runs"]]}


@pytest.mark.parametrize("holder, first_computes, second_computes", [
    # the first sweep finishes the run it claimed: the second takes its file and computes the rest
    ("finishes", 1, 3),
    # the first sweep is killed in the middle of its run: the kernel drops its claim and the
    # second sweep computes that run itself
    ("killed", None, 4),
])
def test_two_sweeps_of_one_folder_compute_each_run_once(holder, first_computes, second_computes,
                                                        tmp_path, capsys):
    """Two ``ciosl sweep`` of one grid into one folder split the runs: a run another live sweep
    has claimed is left to it and its file is taken when it appears (a crashed holder's run is
    computed), so every run is computed once and the results equal a single sweep's. Before,
    the second sweep computed all four runs again (8 computations)."""
    module = f"gated_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(GATED_SWEEP.format(name=module))
    body = (f'methods = ["{module}:L", "ncm"]\nruns = 2\noffline_epochs = 1\n')
    grid = grid_file(tmp_path, body)
    gate = tmp_path / "gate"
    gate.touch()
    src = str(Path(experiment.__file__).parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), src])}
    env.pop("CIOSL_TEST_GATE", None)
    command = [sys.executable, "-m", "ciosl", "sweep", grid, "--workers", "1"]
    # the first sweep claims its first run (cell 0, seed 0) and waits inside it at the gate
    first = subprocess.Popen(command, env={**env, "CIOSL_TEST_GATE": str(gate)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        for _ in range(HANG_GUARD * 10):
            if Path(f"{gate}.started").exists() or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()
        second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        # the second sweep computes the three runs nobody holds, then waits for the fourth
        runs = tmp_path / "out" / "runs"
        for _ in range(HANG_GUARD * 10):
            if len(list(runs.glob("*/seed-*.json"))) >= 3 or second.poll() is not None:
                break
            time.sleep(0.1)
        assert second.poll() is None, second.communicate()
        if holder == "killed":
            first.send_signal(signal.SIGKILL)
        gate.unlink()
        out2, err2 = second.communicate(timeout=HANG_GUARD)
        out1, err1 = first.communicate(timeout=HANG_GUARD)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert second.returncode == 0, err2
    counts2 = _summary_counts(out2)
    assert counts2 == {"computed": second_computes, "elsewhere": 4 - second_computes}, out2
    if first_computes is None:
        assert first.returncode == -signal.SIGKILL
        computed = counts2["computed"]
    else:
        assert first.returncode == 0, err1
        counts1 = _summary_counts(out1)
        assert counts1 == {"computed": first_computes, "elsewhere": 4 - first_computes}, out1
        computed = counts1["computed"] + counts2["computed"]
    assert computed == 4  # each of the grid's 4 runs once
    assert not list((tmp_path / "out").rglob(".*.lock"))  # every claim is gone with its run
    # the same grid by one sweep alone, into another folder: the same numbers
    single = tmp_path / "single.toml"
    single.write_text(Path(grid).read_text().replace(f'"{tmp_path}/out"', f'"{tmp_path}/single"'))
    sys.path.insert(0, str(tmp_path))  # the gated learner's module
    try:
        assert main(["sweep", str(single), "--workers", "1"]) == 0, capsys.readouterr().err
    finally:
        sys.path.remove(str(tmp_path))
    shared = sorted((tmp_path / "out").glob("*.json"))
    alone = sorted((tmp_path / "single").glob("*.json"))
    assert [p.name for p in shared] == [p.name for p in alone] and len(shared) == 2
    for a, b in zip(shared, alone, strict=True):
        assert _same_numbers(json.loads(a.read_text())) == _same_numbers(json.loads(b.read_text()))
