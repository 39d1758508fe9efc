"""Checkpoint and resume: a run killed with SIGKILL at random points, resumed each time, ends
with the same result JSON as an uninterrupted run (timings aside)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ciosl.cli import main
from ciosl.evaluation import checkpoint as ck
from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import ExperimentSpec, result_path, run_experiment
from helpers import (
    D,
    cli,
    flip,
    interrupt_second_run,
    member_span,
    one_line_error,
    run_args,
    trained,
)

TIMINGS = {"base_seconds", "learn_seconds", "predict_seconds", "seconds_per_sample",
           "samples_per_second", "wall_seconds", "path"}
ARGS = ["run", "--dataset", "digits", "--ordering", "class_iid", "--runs", "2",
        "--limit-per-class", "60", "--quiet"]


def without_timings(obj):
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if k not in TIMINGS}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


# (method, checkpoint interval, longest wait before the kill): SLDA streams ~40k samples/s, so
# it is killed right after a checkpoint appears, with checkpoints every 5 samples
CASES = [("ciosl", 50, 0.4), ("tinyer", 50, 0.4), ("remind", 50, 0.4), ("slda", 5, 0.0)]


@pytest.mark.parametrize(("method", "every", "max_wait"), CASES, ids=[c[0] for c in CASES])
def test_sigkill_then_resume_gives_the_uninterrupted_result(method, every, max_wait, tmp_path,
                                                            cache):
    assert main([*ARGS, "--method", method, "--out", str(tmp_path / "ref"),
                 "--cache", str(cache)]) == 0
    ref = json.loads(next((tmp_path / "ref").glob("*.json")).read_text())

    out = tmp_path / "killed"
    result = result_path(out, "digits", "class_iid", method, protocol="limit_per_class=60")
    ckpt = ck.checkpoint_path(result)
    cmd = [sys.executable, "-m", "ciosl.cli", *ARGS, "--method", method, "--out", str(out),
           "--cache", str(cache), "--checkpoint-every", str(every), "--resume"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rng = np.random.default_rng(sum(map(ord, method)))
    interrupted, stderr = 0, []
    for _ in range(8):
        if interrupted == 3 or result.exists():
            break
        before = ckpt.stat().st_mtime_ns if ckpt.exists() else None
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 120
        # wait until this process has written a checkpoint of its own, then kill it at a
        # random moment of what follows
        while proc.poll() is None and time.monotonic() < deadline:
            if ckpt.exists() and ckpt.stat().st_mtime_ns != before:
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, max_wait))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        stderr.append(proc.communicate()[1])
        assert proc.returncode in (0, -signal.SIGKILL), stderr[-1]
        interrupted += not result.exists()
    assert interrupted >= 1  # at least one kill landed before the experiment was complete
    if not result.exists():
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        stderr.append(done.stderr)
    assert any("resuming from the checkpoint" in e for e in stderr[1:])
    assert not ckpt.exists()  # removed once the experiment completed
    got = json.loads(result.read_text())
    assert without_timings(got) == without_timings(ref)


def test_checkpoint_refuses_another_experiment_and_newer_formats(tmp_path, cache):
    spec = dict(dataset="digits", ordering="class_iid", method="ncm", seeds=[0],
                limit_per_class=20, out_dir=tmp_path, cache_dir=cache)
    path = ck.checkpoint_path(result_path(tmp_path, "digits", "class_iid", "ncm",
                                          protocol="limit_per_class=20"))
    ident = ck.identity({"something": "else"})
    ck.save_checkpoint(path, ident, {"runs": [], "current": None, "wall_seconds": 0.0})
    with pytest.raises(ValueError, match="different experiment"):
        run_experiment(ExperimentSpec(**spec, resume=True))
    blob = torch.load(path, weights_only=True)
    blob["format_version"] = ck.FORMAT_VERSION + 1
    torch.save(blob, path)
    with pytest.raises(ValueError, match="newer than this ciosl supports"):
        ck.load_checkpoint(path, ident)
    path.write_bytes(b"truncated")
    with pytest.raises(ValueError, match="unreadable"):
        run_experiment(ExperimentSpec(**spec, resume=True))
    with pytest.raises(ValueError, match="need an output folder"):
        run_experiment(ExperimentSpec(**{**spec, "out_dir": None}, checkpoint_every=10))


def test_global_generators_round_trip(tmp_path):
    import random

    state = ck.global_rng_state()
    ck.save_checkpoint(tmp_path / "c.ckpt", "{}", {})
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    loaded = ck.load_checkpoint(tmp_path / "c.ckpt", "{}")  # restores the saved generators
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
    assert loaded["rng"]["python"][1] == state["python"][1]


def test_resume_without_checkpoint_starts_fresh_and_files_are_readable(tmp_path, cache):
    res = run_experiment(ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm",
                                        seeds=[0], limit_per_class=20, out_dir=tmp_path,
                                        cache_dir=cache, resume=True, checkpoint_every=7))
    assert len(res["runs"]) == 1
    mode = os.stat(res["path"]).st_mode & 0o777
    assert mode & 0o044 == 0o044 & ~_umask()  # not private to its writer (mkstemp's 0600)


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def test_a_flipped_bit_in_a_checkpoint_is_refused(tmp_path):
    from ciosl.evaluation import checkpoint as ck

    learner = trained("tinyer")
    path, ident = tmp_path / "x.ckpt", ck.identity({"experiment": 1})
    ck.save_checkpoint(path, ident, {"runs": [], "current": {"learner": learner.state_dict(),
                                                             "position": 7}})
    assert ck.load_checkpoint(path, ident)["current"]["position"] == 7
    data = path.read_bytes()
    for member in ("/data/0", "/data/3", "data.pkl"):
        start, end = member_span(data, member)
        path.write_bytes(flip(data, (start + end) // 2, 5))
        with pytest.raises(ValueError, match=f"checkpoint {path} is damaged|{path}: not a "
                                             r"readable ciosl checkpoint \(damaged\)"):
            ck.load_checkpoint(path, ident)


def test_a_checkpoint_of_an_unsaveable_learner_is_a_clear_error(tmp_path, user_modules,
                                                                monkeypatch):
    from ciosl.errors import LearnerError
    from ciosl.evaluation import checkpoint as ck
    from ciosl.learners.base import load_method

    monkeypatch.syspath_prepend(str(user_modules))
    learner = load_method("rt3_learners:Unsaveable")()
    learner.fit_base(np.eye(2, D), [0, 1])
    with pytest.raises(LearnerError, match="cannot write checkpoint .*lambda"):
        ck.save_checkpoint(tmp_path / "x.ckpt", "{}", {"learner": learner.state_dict()})
    with pytest.raises(LearnerError, match="rt3-unsaveable.*cannot save to .*lambda"):
        learner.save(tmp_path / "l.ciosl")
    assert not list(tmp_path.iterdir())


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
