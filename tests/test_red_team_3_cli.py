"""Issue 29, members of its classes that a third probe found after the second pass: a learner of
the user's own whose code changed (or another class under the same ``name``) replacing a result,
a run that computes everything and then fails on an undefined Omega_all, a ``--cache`` that is
no folder, weights files read without a sensible bound (and torch's advice to load them
unsafely), two flags setting one setting, and an allocation failure that names nothing. Each
test failed before its fix.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import numpy as np

from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from test_red_team import cli, one_line_error  # the first pass's helpers
from test_red_team_2 import QUICK, make_fifo, run_args

LEARNER = '''
from ciosl.learners.ncm import NCM


class L(NCM):
    name = "{name}"
{body}
'''


def own_learner(tmp: Path, monkeypatch, body: str = "") -> tuple[Path, str]:
    """A module defining a learner ``L`` (an NCM) under a fresh method name; its file and the
    ``--method`` spec."""
    module = f"rt3_{uuid.uuid4().hex[:8]}"
    path = tmp / f"{module}.py"
    path.write_text(LEARNER.format(name=module, body=body))
    monkeypatch.syspath_prepend(str(tmp))
    return path, f"{module}:L"


# ---------------------------------------------------------------------------- lost work


def test_a_changed_learner_of_your_own_does_not_replace_its_earlier_result(
        tmp_path, capsys, monkeypatch):
    path, method = own_learner(tmp_path, monkeypatch)
    assert cli(capsys, run_args(tmp_path, method=method))[0] == 0
    assert cli(capsys, run_args(tmp_path, method=method))[0] == 0  # the same code: a rerun
    (result,) = (tmp_path / "out").glob("*.json")
    before = result.read_text()
    assert json.loads(before)["method_source"]["class"] == method
    path.write_text(path.read_text() + "\n# a change of the learner's code\n")
    line = one_line_error(*cli(capsys, run_args(tmp_path, method=method)))
    assert "holds another experiment (method_source.sha256: " in line and "--force" in line
    assert result.read_text() == before
    assert cli(capsys, run_args(tmp_path, "--force", method=method))[0] == 0


def test_results_of_ciosl_methods_record_no_source(tmp_path, capsys):
    assert cli(capsys, run_args(tmp_path))[0] == 0
    (result,) = (tmp_path / "out").glob("*.json")
    assert "method_source" not in json.loads(result.read_text())  # old results stay the same


def test_two_flags_for_one_setting_are_refused(tmp_path, capsys):
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--buffer", "30", "--set",
                                                "buffer=20", method="tinyer")))
    assert line == ("error: --buffer 30 and --set buffer=20 both set the replay buffer: give "
                    "one of them")
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------- undefined Omega


def adversarial_features(tmp: Path) -> Path:
    """Every test sample sits at the next class's training cluster: the offline reference
    scores 0 after base init."""
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 5, (4, 8))
    y_train, y_test = np.repeat(np.arange(4), 40), np.repeat(np.arange(4), 10)
    path = tmp / "adv.npz"
    np.savez(path, train_z=(centers[y_train] + rng.normal(size=(160, 8))).astype("f4"),
             train_y=y_train, test_y=y_test,
             test_z=(centers[(y_test + 1) % 4] + rng.normal(size=(40, 8))).astype("f4"))
    return path


def test_an_undefined_omega_is_refused_before_the_stream_naming_the_event(tmp_path, capsys,
                                                                         monkeypatch):
    from ciosl.evaluation import experiment

    streamed = []
    monkeypatch.setattr(experiment, "run_stream",
                        lambda *a, **k: streamed.append(1) or {})
    argv = ["run", "--dataset", f"features:{adversarial_features(tmp_path)}", "--method", "ncm",
            "--runs", "1", "--quiet", "--cache", str(tmp_path / "c"), "--out",
            str(tmp_path / "out")]
    line = one_line_error(*cli(capsys, argv))
    assert line.startswith("error: the offline reference scores 0% at testing event 1 (stream "
                           "position ")
    assert "of seed 0: Omega_all (accuracy / offline accuracy) is undefined" in line
    assert not streamed  # refused before any streaming work


# ---------------------------------------------------------------------------- the cache folder


def test_a_cache_that_is_no_folder_is_named_before_any_work(tmp_path, capsys):
    fifo = make_fifo(tmp_path, "fifo")
    for cache, kind in ((Path("/dev/null"), "a character device"),
                        (fifo, "a FIFO (named pipe)")):
        argv = ["run", *QUICK, "--method", "ncm", "--cache", str(cache), "--out",
                str(tmp_path / "out")]
        line = one_line_error(*cli(capsys, argv))
        assert line == f"error: --cache {cache}: cannot write there (it is {kind}, not a folder)"
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_unwritable_offline_cache_costs_the_cache_not_the_run(tmp_path, monkeypatch, caplog):
    from ciosl.evaluation import protocol

    def refuse(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(protocol, "atomic_write_json", refuse)
    exp = ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm", seeds=[0],
                         limit_per_class=12, offline_epochs=2, cache_dir=str(tmp_path / "c"))
    with caplog.at_level(logging.WARNING):
        result = run_experiment(exp)
    assert 0 < result["omega_all"]["mean"]
    assert "Could not write offline reference cache entry" in caplog.text


# ---------------------------------------------------------------------------- weights files


def test_weights_files_beyond_any_mobile_network_are_refused_unread(tmp_path, capsys):
    big = tmp_path / "big.pth"
    with open(big, "wb") as f:
        f.truncate(2**30 + 1)  # sparse: nothing to read
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--extractor", "efficientnet_lite0",
                                                "--weights", str(big))))
    assert line == (f"error: --weights {big}: {2**30 + 1} bytes, more than the {2**30} this "
                    "reader accepts")
    line = one_line_error(*cli(capsys, ["features", "--dataset", "digits", "--extractor",
                                        "efficientnet_lite0", "--weights", str(big), "--cache",
                                        str(tmp_path / "c")]))
    assert "weights file" in line and "more than the 1073741824 this reader accepts" in line


def test_unreadable_weights_get_no_advice_to_load_them_unsafely(tmp_path, capsys):
    import torch

    junk = tmp_path / "junk.pth"
    torch.save({"w": np.arange(3)}, junk)  # a NumPy array: refused by weights_only=True
    line = one_line_error(*cli(capsys, ["features", "--dataset", "digits", "--extractor",
                                        "efficientnet_lite0", "--weights", str(junk), "--cache",
                                        str(tmp_path / "c")]))
    assert f"Could not read EfficientNet-Lite0 weights from {junk}: " in line
    assert line.endswith("it is not a plain tensor state_dict (torch.load with weights_only=True "
                         "refused it; ciosl never loads weights any other way)")
    assert "can still be loaded" not in line and "trust the source" not in line


# ---------------------------------------------------------------------------- out of memory

ALLOCATOR = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
             "memory: you tried to allocate 41120000000 bytes. Error code 12 (Cannot allocate "
             "memory)")


def test_an_allocation_failure_names_the_method_and_its_settings(tmp_path, capsys, monkeypatch):
    body = ("    def _learn_one(self, z, yi):\n"
            f"        raise RuntimeError({ALLOCATOR!r})\n")
    _, method = own_learner(tmp_path, monkeypatch, body)
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--set", "temperature=2.0",
                                                method=method)))
    name = method.split(":")[0]
    assert line == (f"error: out of memory in method {name!r} (temperature=2.0) (an allocation "
                    "of 38.3 GiB); use smaller settings, fewer samples (--limit-per-class) or "
                    "fewer workers")
    assert "enforce fail" not in line
