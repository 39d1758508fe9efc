"""``ciosl run``: every refusal is one line naming the flag, file or value it concerns, given
before any work (up front, numeric bounds, usage errors, caches, weights), and an error during a
run (a failure, Ctrl-C, a full disk, an allocation failure, divergence) loses no finished run and
says how to resume; without a terminal, progress is plain lines."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import (
    ExperimentSpec,
    run_experiment,
)
from helpers import (
    PROTOCOL,
    QUICK,
    cli,
    fail_with,
    full_disk,
    grid_file,
    interrupt_second_run,
    make_fifo,
    one_line_error,
    own_learner,
    run_args,
)

# ---------------------------------------------------------------------------- lost work


def test_unwritable_out_is_refused_before_computing_anything(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["run", *QUICK, "--method", "ncm", "--cache", str(tmp_path / "cache"),
            "--out", str(blocker / "x")]
    line = one_line_error(*cli(capsys, argv))
    assert f"--out {blocker / 'x'}: cannot write there (Not a directory)" in line
    assert not (tmp_path / "cache").exists()  # no feature, no offline reference computed


def test_a_failure_at_the_final_write_loses_no_finished_run(tmp_path, capsys, monkeypatch):
    calls = []
    real_run_seed = experiment.run_seed

    def counting(*a, **kw):
        calls.append(1)
        return real_run_seed(*a, **kw)

    def full_disk(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(experiment, "run_seed", counting)
    monkeypatch.setattr(experiment, "atomic_write_json", full_disk)
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--runs", "2")))
    assert "No space left on device" in line and "--resume" in line
    assert len(calls) == 2
    monkeypatch.undo()
    monkeypatch.setattr(experiment, "run_seed", counting)
    assert main(run_args(tmp_path, "--runs", "2", "--resume")) == 0
    assert len(calls) == 2  # both runs came from the checkpoint: nothing recomputed
    saved = json.loads((tmp_path / "out" / f"digits_class_iid_ncm_{PROTOCOL}.json").read_text())
    assert saved["seeds"] == [0, 1] and len(saved["runs"]) == 2


FULL_DISK_CASES = [  # (the file that cannot be written, files that still can)
    ("lock-file", ".{name}.lock", ()),
    ("checkpoint", "{stem}.ckpt", (".lock",)),
    ("result", "{name}", (".lock", ".ckpt")),
]


@pytest.mark.parametrize(("target", "spare"), [c[1:] for c in FULL_DISK_CASES],
                         ids=[c[0] for c in FULL_DISK_CASES])
def test_a_full_disk_names_the_file_it_could_not_write(target, spare, tmp_path, capsys,
                                                       monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    full_disk(monkeypatch, out, spare)
    line = one_line_error(*cli(capsys, run_args(tmp_path)))
    name = f"digits_class_iid_ncm_{PROTOCOL}.json"
    assert str(out / target.format(name=name, stem=name[:-5])) in line, line
    assert "No space left on device" in line


UP_FRONT_CASES = [
    ("runs-zero", lambda t: run_args(t, "--runs", "0"), "--runs must be >= 1, got 0"),
    ("runs-negative", lambda t: run_args(t, "--runs", "-2"), "--runs must be >= 1, got -2"),
    ("seeds-duplicate", lambda t: run_args(t, "--seeds", "1,1"),
     "--seeds lists seed 1 more than once"),
    ("seeds-negative", lambda t: run_args(t, "--seeds", "0,-3"),
     "--seeds expects integers >= 0, got -3"),
    ("offline-epochs-zero", lambda t: run_args(t, "--offline-epochs", "0"),
     "--offline-epochs must be >= 1, got 0"),
    ("offline-epochs-negative", lambda t: run_args(t, "--offline-epochs", "-2"),
     "--offline-epochs must be >= 1, got -2"),
    ("set-lr-nan", lambda t: run_args(t, "--set", "lr=nan", method="finetune"),
     "setting 'lr' expects a finite number, got lr=nan"),
    ("set-lr-inf", lambda t: run_args(t, "--set", "lr=inf", method="finetune"),
     "setting 'lr' expects a finite number, got lr=inf"),
    ("set-temperature-nan", lambda t: run_args(t, "--set", "temperature=-nan"),
     "setting 'temperature' expects a finite number"),
    ("threads-zero", lambda t: run_args(t, "--threads", "0"), "--threads must be >= 1, got 0"),
    ("grid-lr-nan", lambda t: ["sweep", grid_file(t, 'methods = ["finetune"]\n'
                                                     '[grid.finetune]\nlr = [0.01, nan]')],
     "grid.finetune.lr: cell digits_class_iid_finetune_lr-nan: setting 'lr' expects a finite"),
    ("grid-lr-inf", lambda t: ["sweep", grid_file(t, 'methods = ["finetune"]\n'
                                                     '[settings.finetune]\nlr = inf')],
     "settings.finetune.lr: cell digits_class_iid_finetune: setting 'lr' expects a finite"),
    ("sweep-runs-zero", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]'), "--runs", "0"],
     "--runs must be >= 1, got 0"),
    ("sweep-seeds-duplicate", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]'),
                                         "--seeds", "2,0,2"],
     "--seeds lists seed 2 more than once"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in UP_FRONT_CASES],
                         ids=[c[0] for c in UP_FRONT_CASES])
def test_refused_up_front_with_the_flag_named(argv, fragment, tmp_path, capsys):
    line = one_line_error(*cli(capsys, argv(tmp_path)))
    assert fragment in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


MIDRUN_CASES = [
    ("memory-error", MemoryError("Unable to allocate 3.5 GiB for an array"),
     "error: out of memory: Unable to allocate 3.5 GiB for an array; use smaller settings, fewer samples", 2),
    ("disk-full", OSError(errno.ENOSPC, "No space left on device", "/cache/offline/x.json"),
     "error: /cache/offline/x.json: No space left on device", 2),
    ("corrupt-zip-escaping-a-reader", __import__("zipfile").BadZipFile("Bad CRC-32 for file"),
     "error: BadZipFile: Bad CRC-32 for file", 2),
    ("unexpected-bug", TypeError("unsupported operand"),
     "error: internal error (TypeError: unsupported operand): a bug in ciosl", 1),
]


@pytest.mark.parametrize(("error", "fragment", "rc"), [c[1:] for c in MIDRUN_CASES],
                         ids=[c[0] for c in MIDRUN_CASES])
def test_errors_mid_run_are_one_line(error, fragment, rc, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CIOSL_TRACEBACK", raising=False)
    monkeypatch.setattr(experiment, "run_seed", fail_with(error))
    got, err = cli(capsys, run_args(tmp_path))
    assert "Traceback" not in err and got == rc
    assert [line for line in err.splitlines() if line.strip()] == [
        next(line for line in err.splitlines() if line.strip())]
    assert fragment in err
    assert not list((tmp_path / "out").glob("*.json"))


def test_ctrl_c_says_how_to_resume_and_loses_no_finished_run(tmp_path, capsys, monkeypatch):
    calls = interrupt_second_run(monkeypatch)
    rc, err = cli(capsys, run_args(tmp_path, "--runs", "2"))
    assert rc == 130 and "Traceback" not in err
    assert err.strip() == ("interrupted: the finished runs are saved; the same command with "
                           "--resume continues")
    assert main(run_args(tmp_path, "--runs", "2", "--resume")) == 0
    assert len(calls) == 3  # seed 0 came from the checkpoint


def test_a_diverging_lr_is_one_line(tmp_path, capsys):
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--set", "lr=100", "--set",
                                                "max_grad_norm=inf", method="finetune")))
    assert line.startswith("error: finetune: training diverged")


# ---------------------------------------------------------------------------- unbounded work
# (id, argv(tmp), fragment): refused before any work, the option and its bound named


def huge_limit(tmp: Path) -> str:
    path = Path(grid_file(tmp, 'methods = ["ncm"]'))
    path.write_text(path.read_text().replace("= 12", "= 100000000000"))
    return str(path)


BOUND_CASES = [
    ("threads-5000", lambda t: run_args(t, "--threads", "5000"), "--threads must be <= "),
    ("offline-epochs-huge", lambda t: run_args(t, "--offline-epochs", "1000000000"),
     "--offline-epochs must be <= 1000, got 1000000000"),
    ("epochs-huge", lambda t: run_args(t, "--regime", "batch", "--epochs", "10000000",
                                       method="tinyer"), "--epochs must be <= 1000"),
    ("batch-size-huge", lambda t: run_args(t, "--regime", "online", "--batch-size",
                                           "99999999999", method="tinyer"),
     "--batch-size must be <= 100000"),
    ("buffer-huge", lambda t: run_args(t, "--buffer", "1000000000", method="tinyer"),
     "--buffer must be <= 1000000, got 1000000000"),
    ("buffer-overflow", lambda t: run_args(t, "--buffer", str(2**70), method="tinyer"),
     "--buffer must be <= 1000000"),
    ("limit-per-class-huge", lambda t: run_args(t, "--limit-per-class", str(10**20)),
     "--limit-per-class must be <= 10000000"),
    ("checkpoint-every-huge", lambda t: run_args(t, "--checkpoint-every", str(10**20)),
     "--checkpoint-every must be <= 1000000000"),
    ("seed-huge", lambda t: run_args(t, "--seeds", str(10**20)),
     "--seeds: a seed must be <= 2147483647"),
    ("sweep-workers-huge", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]'),
                                      "--workers", "100000"], "--workers must be <= "),
    ("sweep-seed-huge", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]'),
                                   "--seeds", str(2**64)], "a seed must be <= 2147483647"),
    ("grid-offline-epochs", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]\n'
                                                             'offline_epochs = 1000000000')],
     "grid.toml: offline_epochs: must be <= 1000, got 1000000000"),
    ("grid-limit", lambda t: ["sweep", huge_limit(t)],
     "grid.toml: limit_per_class: must be <= 10000000"),
    ("grid-epochs", lambda t: ["sweep", grid_file(t, 'methods = ["tinyer"]\nregimes = '
                                                     '["batch"]\nepochs = 99999999')],
     "grid.toml: epochs: must be <= 1000"),
    ("grid-batch-size", lambda t: ["sweep", grid_file(t, 'methods = ["tinyer"]\nregimes = '
                                                         '["online"]\nbatch_size = 99999999')],
     "grid.toml: batch_size: must be <= 100000"),
    ("grid-seed", lambda t: ["sweep", grid_file(t, 'methods = ["ncm"]\nseeds = [0, 99999999999]')],
     "grid.toml: seeds: a seed must be <= 2147483647"),
    ("grid-1e8-cells-dry-run", lambda t: ["sweep", "--dry-run", grid_file(
        t, 'methods = ["ciosl"]\n[grid.ciosl]\n' + "".join(
            f"{k} = [{', '.join(str(v + i) for i in range(10))}]\n" for k, v in (
                ("lambda1", 1.0), ("lambda2", 0.5), ("n_replay", 1), ("n_distill", 1),
                ("temperature", 1.0), ("prior_scale", 1.0), ("lr", 0.5), ("momentum", 0.0))))],
     "grid.toml: grid.ciosl: 100000000 combinations, more than the 10000 cells"),
    ("grid-too-many-cells-overall", lambda t: ["sweep", "--dry-run", grid_file(
        t, 'methods = ["ciosl", "tinyer"]\n[grid.ciosl]\n'
        f"lambda1 = [{', '.join(str(1.0 + i) for i in range(100))}]\n"
        f"lambda2 = [{', '.join(str(i / 100) for i in range(60))}]\n"
        f"[grid.tinyer]\nbuffer = [{', '.join(str(20 + i) for i in range(5000))}]\n")],
     "grid.toml: datasets: 11000 cells, more than the 10000 a grid may have"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in BOUND_CASES],
                         ids=[c[0] for c in BOUND_CASES])
def test_numeric_options_have_an_upper_bound(argv, fragment, tmp_path, capsys, monkeypatch):
    """Refused before any work, counted (no data loaded, no more grid combinations enumerated
    than a grid may have), never timed."""
    from ciosl.evaluation import grid as grid_module

    loaded, combos = [], [0]
    real_features = experiment.load_features
    monkeypatch.setattr(experiment, "load_features",
                        lambda *a, **k: loaded.append(1) or real_features(*a, **k))

    class Counting:  # itertools, counting what product() yields
        def __getattr__(self, name):
            return getattr(itertools, name)

        @staticmethod
        def product(*axes):
            for item in itertools.product(*axes):
                combos[0] += 1
                yield item

    monkeypatch.setattr(grid_module, "itertools", Counting())
    line = one_line_error(*cli(capsys, argv(tmp_path)))
    assert fragment in line
    assert "Overflow" not in line and "internal error" not in line
    # each method's grid is counted before it is enumerated: at most MAX_CELLS each (these
    # grids have two methods at most), never the 100,000,000 combinations asked for
    assert loaded == [] and combos[0] <= 2 * grid_module.MAX_CELLS
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_a_run_without_a_terminal_reports_progress_in_plain_lines(tmp_path, capsys, monkeypatch):
    """Output to a file or a pipe (no live bar): a long run still says it is alive, in plain
    lines naming the run, the samples done of the total, and the time spent."""
    from ciosl import progress

    monkeypatch.setattr(progress, "PLAIN_PROGRESS_SECONDS", 0.0)  # a line at every chunk
    rc, err = cli(capsys, run_args(tmp_path))
    assert rc == 0, err
    lines = [line for line in err.splitlines() if "samples" in line]
    assert lines, err
    total = int(lines[-1].split(" / ")[1].split()[0].replace(",", ""))
    assert lines[-1].startswith(f"ncm digits/class_iid: {total:,} / {total:,} samples (100%), ")
    assert lines[-1].endswith(" elapsed")
    assert "\x1b" not in err  # no terminal codes in a file


def test_plain_progress_lines_are_throttled(monkeypatch, capsys):
    """At most one line per PLAIN_PROGRESS_SECONDS, with the share done and the clock."""
    from ciosl.report import console

    now = [1000.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    with console.sample_progress("m d/o") as (on_start, on_progress):
        on_start(400)
        for _ in range(4):  # 10 s apart: only the one 30 s after the start prints
            now[0] += 10.0
            on_progress(100)
    err = capsys.readouterr().err
    assert err.splitlines() == ["m d/o: 300 / 400 samples (75%), 0m30s elapsed"]


@pytest.mark.parametrize(("argv", "fragment"), [
    (["run", "--method", "ncm", "--ordering", "sideways"],
     "error: ciosl run: argument --ordering: invalid choice: 'sideways'"),
    (["run", "--method", "ncm", "--runs", "3", "--seeds", "1,2"],
     "error: ciosl run: argument --seeds: not allowed with argument --runs"),
    (["bogus"], "error: ciosl: argument command: invalid choice: 'bogus'"),
    (["run"], "error: ciosl run: the following arguments are required: --method"),
    (["report"], "error: ciosl report: the following arguments are required"),
    (["run", "--method", "ncm", "--seeds", "x"], "--seeds expects integers like 0,1,2, got 'x'"),
], ids=["choice", "exclusive", "command", "required", "report", "type"])
def test_a_usage_error_is_one_line_naming_the_flag(argv, fragment, capsys):
    """argparse's usage errors too: one line (not the usage over several), naming the command
    and the flag, and where the help is."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "--help`)" in lines[0], lines


@pytest.mark.parametrize(("where", "kind"), [("fifo", "a FIFO (named pipe)"),
                                             ("folder", "a folder")])
def test_a_features_path_or_results_folder_of_the_wrong_kind_is_named(where, kind, tmp_path,
                                                                       capsys):
    """features:PATH that is a FIFO or a folder, a results folder that is a FIFO or a file:
    one line saying what it is instead (never "no such file", never a blocking read)."""
    path = tmp_path / "x.npz"
    os.mkfifo(path) if where == "fifo" else path.mkdir()
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--dataset", f"features:{path}")))
    assert f"features:{path}: {path} is not a regular file ({kind})" in line
    target = tmp_path / "results"
    os.mkfifo(target) if where == "fifo" else target.write_text("{}")
    line = one_line_error(*cli(capsys, ["report", str(target)]))
    expected = "a FIFO (named pipe)" if where == "fifo" else "a file"
    assert f"results folder {target}: not a folder ({expected})" in line


@pytest.mark.parametrize("kind", ["fifo", "file"])
def test_an_out_folder_that_is_no_folder_says_what_it_is(kind, tmp_path, capsys):
    target = tmp_path / "out"
    os.mkfifo(target) if kind == "fifo" else target.write_text("x")
    argv = ["run", *QUICK, "--method", "ncm", "--cache", str(tmp_path / "cache"),
            "--out", str(target)]
    line = one_line_error(*cli(capsys, argv))
    what = "a FIFO (named pipe)" if kind == "fifo" else "a file"
    assert f"--out {target}: cannot write there (it is {what}, not a folder)" in line


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


# (id, ``ciosl run`` arguments, text that the error must contain)
CLI_CASES = [
    ("unknown-method", ["--method", "nope"], ["unknown method 'nope'", "ciosl", "slda"]),
    ("unknown-dataset", ["--method", "ncm", "--dataset", "mnist2"],
     ["unknown dataset", "fashion-mnist"]),
    ("ordering-not-supported", ["--method", "ncm", "--ordering", "instance"],
     ["does not support", "class_iid"]),
    ("unknown-setting", ["--method", "ciosl", "--set", "lamda1=1"],
     ["unknown setting(s) lamda1", "lambda1"]),
    ("bad-choice", ["--method", "ciosl", "--set", "selection=best"],
     ["selection='best' is not valid", "uapn"]),
    ("bad-type", ["--method", "ciosl", "--set", "lambda2=high"], ["expects float"]),
    ("buffer-zero", ["--method", "tinyer", "--buffer", "0"], ["buffer must be positive"]),
    ("buffer-below-replay", ["--method", "ciosl", "--buffer", "8"],
     ["buffer (8) is smaller than n_replay (16)"]),
    ("buffer-without-memory", ["--method", "slda", "--buffer", "10"], ["no replay buffer"]),
    ("negative-checkpoint", ["--method", "ncm", "--checkpoint-every", "-1"], [">= 0"]),
]


@pytest.mark.parametrize(("args", "needles"), [c[1:] for c in CLI_CASES],
                         ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_requests_before_running(args, needles, tmp_path, capsys):
    assert main(["run", *args, "--out", str(tmp_path / "out"), "--cache", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "out").exists()  # nothing written


# ---------------------------------------------------------------------------- extraction flags


@pytest.mark.parametrize("flag, value, fragment", [
    ("--backend", "bogus", "--backend 'bogus': expected one of auto, onnxruntime, torch"),
    ("--device", "tpu", "--device 'tpu': expected one of auto, cpu, cuda"),
    ("--mean", "0.5", "--mean, --std and --layer apply to an onnx:PATH extractor"),
])
def test_extraction_flags_refused_in_one_line(flag, value, fragment, tmp_path, capsys):
    assert fragment in one_line_error(*cli(capsys, run_args(tmp_path, flag, value)))
    assert not (tmp_path / "cache").exists()  # before any work


def test_without_the_onnx_extra_onnx_paths_are_refused_in_one_line_naming_it(tmp_path, capsys,
                                                                             monkeypatch):
    """`pip install -e .` (all that `make demo` installs) leaves onnx and onnxruntime out: the
    default backend falls back to torch, and what needs them names the extra in one line."""
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    extra = 'pip install -e ".[onnx]"'
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--backend", "onnxruntime")))
    assert line.endswith(f"--backend onnxruntime: onnx and onnxruntime are not installed (the "
                         f"[onnx] extra): {extra} in the clone, or pip install onnx onnxruntime")
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not read")
    line = one_line_error(*cli(capsys, ["features", "--dataset", "digits", "--extractor",
                                        f"onnx:{model}", "--cache", str(tmp_path / "cache")]))
    assert f"extractor onnx:{model}: onnx and onnxruntime are not installed" in line
    assert extra in line
    rc, err = cli(capsys, run_args(tmp_path))  # auto: torch, no warning
    assert rc == 0 and not err.strip(), err


def test_device_backend_threads_reach_the_extraction(tmp_path, capsys, monkeypatch):
    from ciosl.data import features

    seen, real = [], features.get_features
    monkeypatch.setattr(features, "get_features",
                        lambda *a, **k: seen.append(k) or real(*a, **k))
    rc, err = cli(capsys, run_args(tmp_path, "--device", "cpu", "--backend", "torch",
                                   "--threads", "2"))
    assert rc == 0, err
    assert [(k["device"], k["backend"], k["threads"]) for k in seen] == [("cpu", "torch", 2)]
