"""Two commands writing one result: the second is refused before it computes anything, and
every piece of advice an error gives works when followed (each test follows it).

Before: ``B="ciosl run ... --out out/C"; $B --seeds 0 & $B --seeds 1 &`` ran both; the one that
finished second was refused and told that ``--resume`` writes its result, which failed (the
result still held the other seeds; the shared checkpoint "differs in: seeds"): one finished
run lost. Now one writer holds the result's name (a lock the kernel drops when the process
ends, however it ends), and a result that appears at the name while a run computes (another
tool, a sweep) gets advice that works: ``--resume --force``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import ciosl
from ciosl.cli import main
from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from ciosl.learners import registry

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "12",
         "--offline-epochs", "2", "--quiet"]
HANG_GUARD = 300  # seconds: only to end a test that would otherwise hang; never asserted on

GATED = '''
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


def gated_learner(tmp: Path, monkeypatch) -> str:
    module = f"gated_{uuid.uuid4().hex[:8]}"
    (tmp / f"{module}.py").write_text(GATED.format(name=module))
    monkeypatch.syspath_prepend(str(tmp))
    # registered for this test only: later tests list the methods (error messages, reports)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delenv("CIOSL_TEST_GATE", raising=False)  # only the first command waits
    return f"{module}:L"


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    for _ in range(HANG_GUARD * 10):
        if path.exists() or proc.poll() is not None:
            return
        time.sleep(0.1)


def test_a_second_run_into_one_result_is_refused_before_computing_and_its_advice_works(
        tmp_path, capsys, monkeypatch):
    method = gated_learner(tmp_path, monkeypatch)
    argv = ["run", *QUICK, "--method", method, "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out")]
    gate = tmp_path / "gate"
    gate.touch()
    src = str(Path(ciosl.__file__).parents[1])
    env = {**os.environ, "CIOSL_TEST_GATE": str(gate), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), src])}
    first = subprocess.Popen([sys.executable, "-m", "ciosl", *argv, "--seeds", "0"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(Path(f"{gate}.started"), first)  # the first run is computing now
        assert first.poll() is None, first.communicate()
        loaded = []
        real = experiment.load_features
        monkeypatch.setattr(experiment, "load_features",
                            lambda *a, **k: loaded.append(1) or real(*a, **k))
        rc = main([*argv, "--seeds", "1"])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, err
        assert "is being computed by another ciosl process right now (pid " in lines[0]
        assert f"pid {first.pid}, seeds 0)" in lines[0]
        assert "refused to start a second writer of it before any work" in lines[0]
        assert loaded == []  # nothing computed, so nothing is lost
    finally:
        gate.unlink()
        out, err = first.communicate(timeout=HANG_GUARD)
    assert first.returncode == 0, err
    # the advice: wait for it to end, then --seeds including its seeds extends the result
    assert "then --seeds including its seeds extends the result" in lines[0]
    held = re.search(r"seeds ([\d,]+)\)", lines[0]).group(1)
    assert main([*argv, "--seeds", f"{held},1"]) == 0, capsys.readouterr().err
    (result,) = (tmp_path / "out").glob("*.json")
    assert json.loads(result.read_text())["seeds"] == [0, 1]
    assert not list((tmp_path / "out").glob("*.ckpt"))
    assert not list((tmp_path / "out").glob(".*.lock"))  # the claim is gone with its run


def test_a_killed_run_leaves_no_claim_behind(tmp_path, capsys, monkeypatch):
    method = gated_learner(tmp_path, monkeypatch)
    argv = ["run", *QUICK, "--method", method, "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out"), "--seeds", "0", "--checkpoint-every", "1"]
    gate = tmp_path / "gate"
    gate.touch()
    src = str(Path(ciosl.__file__).parents[1])
    env = {**os.environ, "CIOSL_TEST_GATE": str(gate), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), src])}
    first = subprocess.Popen([sys.executable, "-m", "ciosl", *argv], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(Path(f"{gate}.started"), first)
        first.kill()  # SIGKILL: no handler runs, the lock file stays on disk
        first.wait(timeout=HANG_GUARD)
    finally:
        gate.unlink()
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err  # the kernel dropped it
    (result,) = (tmp_path / "out").glob("*.json")
    assert json.loads(result.read_text())["seeds"] == [0]


def advised_flags(message: str) -> list[str]:
    """The flags an error's advice says to add: "the same command with --resume --force"."""
    found = re.search(r"the same command with ((?:--[a-z-]+ ?)+)", message)
    assert found, message
    return found.group(1).split()


@pytest.fixture(scope="module")
def other_seed_result(tmp_path_factory) -> Path:
    """A finished result of the same experiment, with a seed the runs below do not repeat."""
    folder = tmp_path_factory.mktemp("other")
    spec = ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm", seeds=[5],
                          limit_per_class=12, offline_epochs=2, out_dir=folder,
                          cache_dir=folder / "cache")
    return Path(run_experiment(spec)["path"])


# what appears at the result's name while a run computes
INTRUDERS = ["another experiment", "this experiment with other seeds", "no JSON"]


@pytest.mark.parametrize("advice", ["flags", "move away"])
@pytest.mark.parametrize("intruder", INTRUDERS)
def test_the_advice_at_the_final_write_works_when_followed(tmp_path, intruder, advice,
                                                            other_seed_result):
    spec = ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm", seeds=[0, 1],
                          limit_per_class=12, offline_epochs=2, out_dir=tmp_path / "out",
                          cache_dir=tmp_path / "cache")
    computed = []

    def intrude(run: dict) -> None:
        computed.append(run["seed"])
        if len(computed) == 2:
            (name,) = [p for p in (tmp_path / "out").glob("*.ckpt")]
            target = name.with_suffix(".json")
            if intruder == "another experiment":
                target.write_text(json.dumps({"dataset": "digits", "ordering": "class_iid",
                                              "method": "ncm", "limit_per_class": 99}))
            elif intruder == "no JSON":
                target.write_text("not json")
            else:
                shutil.copy(other_seed_result, target)

    with pytest.raises(ValueError) as refused:
        run_experiment(spec, on_run=intrude)
    message = str(refused.value)
    assert "refused to" in message and "2 finished run(s) are saved in " in message
    assert computed == [0, 1]
    if advice == "flags":
        flags = advised_flags(message)
        assert set(flags) <= {"--resume", "--force"}, flags
        spec.resume, spec.force = "--resume" in flags, "--force" in flags
    else:
        assert "or move that file away and add --resume" in message
        (intruded,) = (tmp_path / "out").glob("*.json")
        intruded.rename(tmp_path / "moved.json")
        spec.resume = True
    computed.clear()
    result = run_experiment(spec, on_run=lambda run: computed.append(run["seed"]))
    assert computed == []  # the finished runs came from the checkpoint: nothing recomputed
    written = json.loads(Path(result["path"]).read_text())
    assert written["seeds"] == [0, 1] and written["limit_per_class"] == 12
