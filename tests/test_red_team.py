"""Issue 13, the red-team pass: every kind of bad input it found is a row of a table here, with
the one-line error it must get now and a check that nothing changed (no state, no result file,
no finished run lost). Each row failed before its fix.

Tables: ``CLI_CASES`` (``ciosl ...`` in this process: exit 2, one line, no traceback, the
fragment in it, then the row's own check of what is left on disk), ``LEARNER_CASES`` (a call on
a trained learner: the error, and the learner's state byte for byte unchanged) and
``LOAD_CASES`` (a damaged learner file: the error). Cases that need a process of their own
(SIGTERM of a sweep driver, Ctrl-C) follow the tables.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "12",
         "--offline-epochs", "2", "--quiet"]
PROTOCOL = "limit_per_class=12+offline_epochs=2"  # QUICK's options, in the result's name


def run_args(tmp: Path, *extra: str, method: str = "ncm") -> list[str]:
    return ["run", *QUICK, "--method", method, "--cache", str(tmp / "cache"),
            "--out", str(tmp / "out"), *extra]


def cli(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------------------- lost work


def test_unwritable_out_is_refused_before_computing_anything(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["run", *QUICK, "--method", "ncm", "--cache", str(tmp_path / "cache"),
            "--out", str(blocker / "x")]
    line = one_line_error(*cli(capsys, argv))
    assert f"--out {blocker / 'x'}: cannot write there (Not a directory)" in line
    assert not (tmp_path / "cache").exists()  # no feature, no offline reference computed


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


def test_a_set_variant_never_overwrites_the_default_result(tmp_path, capsys):
    assert main(run_args(tmp_path, "--runs", "2", method="slda")) == 0
    default = tmp_path / "out" / f"digits_class_iid_slda_{PROTOCOL}.json"
    before = default.read_bytes()
    assert main(run_args(tmp_path, "--runs", "1", "--set", "shrinkage=1e-2",
                         "--set", "shrinkage_estimator=fixed", method="slda")) == 0
    assert default.read_bytes() == before
    variant = json.loads((tmp_path / "out" /
                          f"digits_class_iid_slda_shrinkage-0.01+shrinkage_estimator-fixed_{PROTOCOL}.json")
                         .read_text())
    assert variant["settings"]["shrinkage"] == 0.01 and len(variant["runs"]) == 1


def test_one_stream_through_two_extractors_keeps_two_results(tmp_path):
    from ciosl.evaluation.experiment import experiment_path
    from ciosl.learners import get_method

    def path(dataset, extractor):
        spec = experiment.ExperimentSpec(dataset, "class_iid", "ncm", extractor=extractor, out_dir=tmp_path)
        return experiment_path(spec, get_method("ncm")).name

    # the dataset's default extractor, named or not, keeps the plain name; another one is named
    assert path("digits", None) == path("digits", "pixels") == "digits_class_iid_ncm.json"
    assert path("digits", "efficientnet_lite0") == "digits-efficientnet_lite0_class_iid_ncm.json"
    assert path("digits-instances", "efficientnet_lite0") == "digits-instances_class_iid_ncm.json"
    assert path("digits-instances", "pixels") == "digits-instances-pixels_class_iid_ncm.json"


def test_two_feature_files_with_one_name_keep_two_results(tmp_path):
    rng = np.random.default_rng(0)
    names = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        y = np.repeat(np.arange(4), 20)
        z = rng.normal(size=(80, 5)).astype(np.float32) + y[:, None]
        np.savez(tmp_path / folder / "feats.npz", train_z=z, train_y=y, test_z=z, test_y=y)
        res = experiment.run_experiment(experiment.ExperimentSpec(
            dataset=f"features:{tmp_path / folder / 'feats.npz'}", ordering="class_iid",
            method="ncm", seeds=[0], out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
            offline_epochs=2))
        names.append(Path(res["path"]).name)
    assert names[0] != names[1]
    assert all(n.startswith("features-feats-") for n in names)
    assert len(list((tmp_path / "out").glob("*.json"))) == 2


# ---------------------------------------------------------------------------- refused up front
# (id, arguments after `ciosl`, fragment of the one-line error); each is refused before any
# work: no output folder, no cache entry appears


def grid_file(tmp: Path, body: str) -> str:
    path = tmp / "grid.toml"
    path.write_text(f'out = "{tmp}/out"\ncache = "{tmp}/cache"\ndatasets = ["digits"]\n'
                    f'orderings = ["class_iid"]\nlimit_per_class = 12\n{body}\n')
    return str(path)


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


def test_library_refuses_nan_settings_and_repeated_seeds():
    from ciosl.learners import make_learner

    with pytest.raises(ValueError, match="'lr' expects a finite number, got lr=nan"):
        make_learner("finetune", lr=float("nan"))
    make_learner("finetune", max_grad_norm=float("inf"))  # documented: plain SGD
    with pytest.raises(ValueError, match="seeds lists seed 0 more than once"):
        experiment.validate(experiment.ExperimentSpec(dataset="digits", ordering="class_iid",
                                                      method="ncm", seeds=[0, 0]))


# ---------------------------------------------------------------------------- damaged files
# (id, writes the bad file(s) and returns the `ciosl` arguments, fragment); the one line names
# the file, and nothing is cached from it


def fashion_with(tmp: Path, damage) -> list[str]:
    from test_datasets import write_fashion

    folder = tmp / "fashion"
    write_fashion(folder, n=20)
    damage(folder)
    return ["features", "--dataset", "fashion-mnist", "--data", str(folder), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def cifar_with(tmp: Path, damage) -> list[str]:
    from test_datasets import write_cifar

    folder = tmp / "c" / "cifar-10-batches-py"
    write_cifar(folder, n=4)
    damage(folder)
    return ["features", "--dataset", "cifar10", "--data", str(tmp / "c"), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def features_file(tmp: Path, data: bytes) -> list[str]:
    path = tmp / "feats.npz"
    path.write_bytes(data)
    return run_args(tmp, "--dataset", f"features:{path}", "--ordering", "iid")


def truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


class Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('ran')",))


def npz_bytes(**arrays) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def odd_npy_member(header_shape: str) -> bytes:
    """A .npz whose train_z.npy header declares ``header_shape`` over 16 bytes of data."""
    import io
    import zipfile

    header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + header_shape + ", }"
    header = header.ljust(118) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(16)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train_z.npy", npy)
    return buf.getvalue()


FILE_CASES = [
    ("truncated-gz", lambda t: fashion_with(
        t, lambda f: truncate(f / "t10k-images-idx3-ubyte.gz", 40)),
     "t10k-images-idx3-ubyte.gz: corrupt or truncated gzip file"),
    ("not-gzip", lambda t: fashion_with(
        t, lambda f: (f / "train-labels-idx1-ubyte.gz").write_bytes(b"plain bytes, no gzip")),
     "train-labels-idx1-ubyte.gz: corrupt or truncated gzip file (BadGzipFile"),
    ("cifar-refused-global", lambda t: cifar_with(
        t, lambda f: (f / "data_batch_2").write_bytes(__import__("pickle").dumps(Evil()))),
     "data_batch_2: not a readable CIFAR pickle (UnpicklingError: refused to unpickle global "
     "builtins.exec"),
    ("cifar-truncated", lambda t: cifar_with(t, lambda f: truncate(f / "test_batch", 100)),
     "test_batch: not a readable CIFAR pickle (UnpicklingError"),
    ("npz-random-bytes", lambda t: features_file(t, np.random.default_rng(0).bytes(3000)),
     "feats.npz: not a readable features .npz: not a zip archive"),
    ("npz-truncated", lambda t: features_file(t, npz_bytes(train_z=np.ones((50, 3)))[:400]),
     "feats.npz: not a readable features .npz"),
    ("npz-declares-1e12-rows", lambda t: features_file(t, odd_npy_member("(1000000000000, 4)")),
     "array train_z.npy declares shape (1000000000000, 4) of float32 (16000000000000 bytes) "
     "but holds 16 bytes"),
    ("npz-zero-width-dtype", lambda t: features_file(
        t, odd_npy_member("(4,)").replace(b"'<f4'", b"'|V0'")),
     "feats.npz: not a readable features .npz"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in FILE_CASES],
                         ids=[c[0] for c in FILE_CASES])
def test_damaged_files_get_one_line_naming_the_file(setup, fragment, tmp_path, capsys,
                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line
    assert not (tmp_path / "cache" / "features").exists() or not any(
        (tmp_path / "cache" / "features").iterdir())
    assert not (tmp_path / "PWNED").exists()


# ---------------------------------------------------------------------------- failures mid-run


def fail_with(error: BaseException):
    def raiser(*a, **kw):
        raise error
    return raiser


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


def interrupt_second_run(monkeypatch) -> list[int]:
    """Make the second ``run_seed`` of a ``ciosl run`` raise KeyboardInterrupt (Ctrl-C); the
    list counts the calls."""
    real, calls = experiment.run_seed, []

    def interrupted_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(experiment, "run_seed", interrupted_second)
    return calls


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


# ---------------------------------------------------------------------------- ciosl report


@pytest.fixture(scope="module")
def one_result(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("result")
    return experiment.run_experiment(experiment.ExperimentSpec(
        dataset="digits", ordering="class_iid", method="ncm", seeds=[0, 1], out_dir=tmp / "out",
        cache_dir=tmp / "cache", limit_per_class=12, offline_epochs=2))


def first_run(good: dict) -> dict:
    """``good`` cut to its first run, with the summaries that run gives (as ``ciosl run
    --seeds 0`` writes it: the report refuses summaries that the runs contradict)."""
    run = good["runs"][0]
    return {**good, "runs": [run], "seeds": [run["seed"]],
            "omega_all": {**good["omega_all"], "mean": run["omega_all"], "std": 0.0},
            "final_accuracy": {"mean": run["accuracy"][-1], "std": 0.0},
            "forgetting": {"mean": run["forgetting"], "std": 0.0},
            "backward_transfer": {"mean": run["backward_transfer"], "std": 0.0},
            "accuracy_matrix": run["accuracy_matrix"],
            "samples_per_second": run["samples_per_second"],
            "peak_memory_bytes": run["peak_memory_bytes"]}


def write_result(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# (id, what is written next to a good result: name -> content (a dict is changed from the good
# result), the warning's fragment)
REPORT_CASES = [
    ("not-json", {"broken.json": '{"omega_all": {"mean": 0.5'},
     "warning: skipped {}/broken.json: not valid JSON"),
    ("unreadable", {"dir.json/x": "{}"}, "warning: skipped {}/dir.json: unreadable (Is a directory)"),
    ("no-runs", {"empty.json": {"runs": []}},
     "warning: skipped {}/empty.json: malformed result: runs must be a non-empty list"),
    ("nan-mean", {"nan.json": {"omega_all": {"mean": float("nan"), "std": 0.1}}},
     "warning: skipped {}/nan.json: malformed result: omega_all.mean must be a finite number"),
    ("wrong-types", {"types.json": {"method": 5}},
     "warning: skipped {}/types.json: malformed result: method must be a string, got 5"),
    ("run-not-object", {"runs.json": {"runs": ["x"]}},
     "warning: skipped {}/runs.json: malformed result: runs[0] must be an object"),
    ("duplicate", {"copy/digits_class_iid_ncm.json": {"runs": "first"}},
     # the column names its protocol where it departs from the dataset's (30 offline epochs)
     "note: 2 results for NCM on digits ≤12/class (offline_epochs=2) / class_iid: used "
     "digits_class_iid_ncm.json (2 runs; the most runs, then the newest), not "
     "copy/digits_class_iid_ncm.json (1 runs)"),
]


@pytest.mark.parametrize(("files", "fragment"), [c[1:] for c in REPORT_CASES],
                         ids=[c[0] for c in REPORT_CASES])
def test_report_warns_per_skipped_file_and_keeps_going(files, fragment, one_result, tmp_path,
                                                      capsys):
    folder = tmp_path / "results"
    good = json.loads(Path(one_result["path"]).read_text())
    write_result(folder, "digits_class_iid_ncm.json", good)
    for name, change in files.items():
        if isinstance(change, dict) and change.get("runs") == "first":
            change = first_run(good)
        write_result(folder, name, {**good, **change} if isinstance(change, dict) else change)
    rc = main(["report", str(folder)])
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(fragment.replace("{}", str(folder))), lines
    report = (folder / "report.md").read_text()
    assert "| NCM" in report  # the good result is in the report


# ---------------------------------------------------------------------------- the learner
D = 6


def trained(method: str):
    from ciosl.learners import make_learner

    rng = np.random.default_rng(0)
    learner = make_learner(method)
    Z = rng.normal(size=(40, D)).astype(np.float32) + np.repeat(np.eye(2, D) * 4, 20, axis=0)
    learner.fit_base(Z, [0] * 20 + [1] * 20)
    for i in range(6):
        learner.learn_one(rng.normal(size=D) + 4 * np.eye(D)[i % 2], i % 2)
    return learner


def snapshot(learner) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(learner.state_dict(), buf)
    return buf.getvalue()


def huge_at(n: int, pos: int, col: int = 2, value: float = 1e30) -> np.ndarray:
    Z = np.ones((n, D), np.float32)
    Z[pos, col] = value
    return Z


def diverging(learner):
    """The learner's update raises (as a diverging step does) on a sample of a new class."""
    def boom(z, yi):
        raise FloatingPointError("training diverged")
    learner._learn_one = boom
    learner._learn_batch = lambda Z, yi: boom(None, None)
    return learner


# (id, methods, call on a trained learner, error, message pattern): the state is unchanged after
LEARNER_CASES = [
    ("mixed-label-types", ["ncm", "slda", "ciosl", "tinyer"], lambda L: L.learn_one(np.ones(D), "1"),
     TypeError, "label '1' is a string but this learner's labels are integers \\(first: 0\\)"),
    ("mixed-label-types-in-a-batch", ["ncm", "finetune"],
     lambda L: L.learn_many(np.ones((3, D)), [1, "a", 0]), TypeError, "label 'a' is a string"),
    ("score-length", ["ncm", "ciosl"], lambda L: L.score(np.ones((3, D)), [0]), ValueError,
     "score: 3 samples but 1 labels"),
    ("huge-feature-ncm-slda", ["ncm", "slda"], lambda L: L.learn_one(huge_at(1, 0)[0], 0),
     ValueError, "position 0 has feature 2 = 1e\\+30, beyond \\+-1e\\+12"),
    ("huge-feature-in-a-batch", ["ncm", "slda", "ciosl"],
     lambda L: L.learn_many(huge_at(5, 3, value=-3e20), [0] * 5), ValueError,
     "position 3 has feature 2 = -3e\\+20"),
    ("huge-feature-predict", ["slda"], lambda L: L.predict_proba(huge_at(4, 1)), ValueError,
     "position 1 has feature 2"),
    ("new-class-then-raise", ["ciosl", "ncm", "tinyer"],
     lambda L: diverging(L).learn_one(np.ones(D), 9), FloatingPointError, "diverged"),
    ("batch-raises-midway", ["ciosl", "finetune"],
     lambda L: diverging(L).learn_many(np.ones((4, D)), [0, 1, 5, 5]), FloatingPointError,
     "diverged"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in LEARNER_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in LEARNER_CASES for m in c[1]])
def test_learner_refuses_and_stays_unchanged(method, call, error, pattern):
    learner = trained(method)
    before, classes = snapshot(learner), list(learner.classes_)
    with pytest.raises(error, match=pattern):
        call(learner)
    for name in ("_learn_one", "_learn_batch"):
        learner.__dict__.pop(name, None)
    assert learner.classes_ == classes
    assert snapshot(learner) == before


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
    import io

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


def test_load_state_dict_refusal_leaves_the_learner_unchanged(tmp_path):
    learner = trained("slda")
    before = snapshot(learner)
    bad = learner.state_dict()
    bad["classes"] = [0, 1, 2]  # one class more than the model has
    with pytest.raises(ValueError, match="inconsistent learner state"):
        learner.load_state_dict(bad)
    assert snapshot(learner) == before


# ---------------------------------------------------------------------------- caches, loaders


def test_an_edited_offline_reference_is_recomputed(tmp_path):
    spec = dict(dataset="digits", ordering="class_iid", method="ncm", seeds=[0],
                cache_dir=tmp_path / "cache", limit_per_class=12, offline_epochs=2)
    first = experiment.run_experiment(experiment.ExperimentSpec(**spec))
    entries = sorted((tmp_path / "cache" / "offline").glob("*.json"))
    assert entries
    for path in entries:  # an edit that keeps the JSON valid and the identity intact
        entry = json.loads(path.read_text())
        entry["accuracy"] = 0.011
        path.write_text(json.dumps(entry))
    again = experiment.run_experiment(experiment.ExperimentSpec(**spec))
    assert again["runs"][0]["accuracy_offline"] == first["runs"][0]["accuracy_offline"]
    assert again["omega_all"] == first["omega_all"]
    assert all(json.loads(p.read_text())["accuracy"] != 0.011 for p in entries)  # rewritten


def cifar_batch(folder: Path, name: str, images: int, labels) -> None:
    import pickle

    data = np.zeros((images, 3072), np.uint8)
    (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": list(labels)}))


def fashion_images(folder: Path, stem: str, shape: tuple) -> None:
    import gzip

    from test_datasets import idx_bytes

    (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(shape, np.uint8))))


LOADER_CASES = [
    ("cifar-misaligned", lambda t: cifar_with(t, lambda f: cifar_batch(f, "data_batch_3", 40,
                                                                          range(30))),
     "data_batch_3: 40 images but labels of shape (30,)"),
    ("cifar-label-minus-one", lambda t: cifar_with(t, lambda f: cifar_batch(f, "test_batch", 4,
                                                                           [0, -1, 2, 3])),
     "test_batch: labels must be in 0..9, found -1..3"),
    ("cifar-label-too-big", lambda t: cifar_with(t, lambda f: cifar_batch(f, "data_batch_1", 4,
                                                                          [0, 10, 2, 3])),
     "data_batch_1: labels must be in 0..9, found 0..10"),
    ("cifar-meta-names", lambda t: cifar_with(t, lambda f: (f / "batches.meta").write_bytes(
        __import__("pickle").dumps({b"label_names": [b"a", b"b"]}))),
     "batches.meta: expected 10 class names under b'label_names', got 2"),
    ("fashion-test-images-20x20", lambda t: fashion_with(
        t, lambda f: fashion_images(f, "t10k-images-idx3-ubyte", (10, 20, 20))),
     "inconsistent Fashion-MNIST files (t10k-images-idx3-ubyte: (10, 20, 20), expected "
     "(n, 28, 28)"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in LOADER_CASES],
                         ids=[c[0] for c in LOADER_CASES])
def test_dataset_loaders_check_counts_shapes_and_labels(setup, fragment, tmp_path, capsys):
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line
    assert not (tmp_path / "cache" / "features").exists() or not any(
        (tmp_path / "cache" / "features").iterdir())


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


def zip_bomb(inner: str) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(inner, bytes(80 << 20))  # 80 MB of zeros: ~80 KB deflated
    return buf.getvalue()


BOMB_CASES = [
    ("npz-inflating-1000x", lambda t: features_file(t, zip_bomb("train_z.npy")),
     "would inflate to 83886080 bytes (over 50 times the file's size): refused as a zip bomb"),
    ("cifar-bytes-of-a-size", lambda t: cifar_with(t, lambda f: (f / "data_batch_1").write_bytes(
        b"\x80\x02cbuiltins\nbytes\nJ\x00\x10\x00\x00\x85R.")),
     "data_batch_1: not a readable CIFAR pickle (UnpicklingError: refused bytes(4096)"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in BOMB_CASES],
                         ids=[c[0] for c in BOMB_CASES])
def test_memory_bombs_are_refused_before_allocating(setup, fragment, tmp_path, capsys):
    line = one_line_error(*cli(capsys, setup(tmp_path)))
    assert fragment in line


def test_learner_file_bomb_is_refused_before_inflating(tmp_path, monkeypatch):
    import torch

    import ciosl

    path = tmp_path / "bomb.ciosl"
    path.write_bytes(zip_bomb("bomb/data.pkl"))
    monkeypatch.setattr(torch, "load", fail_with(AssertionError("inflated")))
    with pytest.raises(ValueError, match="refused as a zip bomb"):
        ciosl.Learner.load(path)
