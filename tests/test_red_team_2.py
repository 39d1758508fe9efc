"""Issue 29, the second red-team pass, first two classes: lost work (two experiments sharing a
result file, a result replaced without a word, grid names that escape their folder) and hangs or
unbounded work (FIFOs and devices where a file is expected, numeric options without an upper
bound, huge grids, per-class loops at every testing event). Every row is a kind of bad input
with the one-line error it must get now and a check that nothing changed; each failed before
its fix.

Tables: ``NAME_CASES`` (two experiments: two result names), ``OVERWRITE_CASES`` (a file already
at the result's name: refused, file unchanged), ``GRID_NAME_CASES``, ``NOT_A_FILE_CASES`` (a
FIFO or a device where a file is read: refused at once), ``BOUND_CASES`` (a numeric option too
large: refused before any work, the option named).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import ExperimentSpec, experiment_path, result_path, variant_slug
from ciosl.learners import get_method
from test_red_team import cli, one_line_error  # the first pass's helpers

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "12",
         "--offline-epochs", "2", "--quiet"]
NAME = "digits_class_iid_ncm_limit_per_class=12+offline_epochs=2.json"  # QUICK's ncm result


def run_args(tmp: Path, *extra: str, method: str = "ncm", out: str = "out") -> list[str]:
    return ["run", *QUICK, "--method", method, "--cache", str(tmp / "cache"),
            "--out", str(tmp / out), *extra]




def grid_file(tmp: Path, body: str, name: str = "grid.toml") -> str:
    path = tmp / name
    path.write_text(f'out = "{tmp}/out"\ncache = "{tmp}/cache"\ndatasets = ["digits"]\n'
                    f'orderings = ["class_iid"]\nlimit_per_class = 12\n{body}\n')
    return str(path)


# ---------------------------------------------------------------------------- lost work: names
# (id, two experiments) whose results must have two different file names


def spec(**kw) -> tuple[ExperimentSpec, str]:
    kw = {"dataset": "digits", "ordering": "class_iid", "method": "tinyer", "out_dir": ".",
          **kw}
    return ExperimentSpec(**kw), kw["method"]


def name_of(case: tuple[ExperimentSpec, str]) -> str:
    exp, method = case
    return experiment_path(exp, get_method(method)).name


NAME_CASES = [
    ("buffer-flag-vs-default", spec(buffer=50), spec()),
    ("limit-per-class-vs-full", spec(limit_per_class=60), spec()),
    ("offline-epochs-vs-default", spec(offline_epochs=3), spec()),
    ("batch-epochs", spec(regime="batch", epochs=2), spec(regime="batch")),
    ("online-batch-size", spec(regime="online", batch_size=3), spec(regime="online")),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in NAME_CASES], ids=[c[0] for c in NAME_CASES])
def test_two_experiments_never_share_a_name(a, b):
    assert name_of(a) != name_of(b)


def test_buffer_flag_names_like_the_set_setting_and_defaults_keep_their_names():
    assert name_of(spec(buffer=50)) == name_of(spec(settings={"buffer": "50"}))
    assert name_of(spec(buffer=100)) == name_of(spec()) == "digits_class_iid_tinyer.json"
    assert name_of(spec(offline_epochs=30)) == "digits_class_iid_tinyer.json"  # digits' own
    assert name_of(spec(regime="batch", epochs=5)) == "digits_class_iid_tinyer_batch.json"


@pytest.mark.parametrize("values", [("a/b", "a-b", "a b", "a--b", "-a-b-"), ("x+y", "x-y"),
                                    ("1,2", "1-2")], ids=["slash-dash-space", "plus", "comma"])
def test_string_settings_differing_in_dropped_characters_never_collide(values):
    slugs = {variant_slug({"tag": v}) for v in values}
    assert len(slugs) == len(values)
    assert all("/" not in s and " " not in s for s in slugs)


def test_custom_learner_names_differing_in_dropped_characters_never_collide():
    names = {result_path(".", "digits", "iid", m).name for m in ("a/b", "a-b", "a b", "a:b")}
    assert len(names) == 4 and all("/" not in n for n in names)


def test_grid_values_with_slashes_stay_in_the_output_folder(tmp_path):
    from ciosl.evaluation.grid import parse_grid

    grid = parse_grid({"datasets": ["digits"], "orderings": ["iid"], "methods": ["ciosl"],
                       "grid": {"ciosl": {"selection": ["uniform"],
                                          "lambda1": [1.0, 2.0]}}})
    assert [c.id for c in grid.cells] == ["digits_iid_ciosl_selection-uniform+lambda1-1.0",
                                          "digits_iid_ciosl_selection-uniform+lambda1-2.0"]
    from ciosl.evaluation.experiment import slug_items

    ids = {slug_items([("tag", v)]) for v in ("../x", "..-x", "a/b")}
    assert len(ids) == 3 and not any("/" in i for i in ids)


# ---------------------------------------------------------------------------- lost work: files
# (id, setup(tmp) -> argv, fragment of the one-line error); the file at the result's name is
# byte for byte unchanged afterwards


def other_result(tmp: Path, name: str = NAME, **changes) -> Path:
    """A result of another experiment (a hand-edited copy of a real one) at ``name``."""
    real = tmp / "real"
    assert main(run_args(tmp, "--runs", "1", out="real")) == 0
    data = json.loads((real / NAME).read_text())
    data.update(changes)
    path = tmp / "out" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def sweep_then_run(tmp: Path) -> tuple[Path, list[str]]:
    """A sweep's cell file (limit 12) where `ciosl run` of the full stream writes."""
    grid = grid_file(tmp, 'methods = ["ncm"]\nruns = 1\noffline_epochs = 2')
    assert main(["sweep", grid, "--workers", "1"]) == 0
    return tmp / "out" / "digits_class_iid_ncm.json", [
        "run", "--dataset", "digits", "--ordering", "class_iid", "--method", "ncm", "--quiet",
        "--runs", "1", "--cache", str(tmp / "cache"), "--out", str(tmp / "out")]


def run_then_sweep(tmp: Path) -> tuple[Path, list[str]]:
    """A `ciosl run` result of another experiment where a sweep writes its cell file."""
    path = other_result(tmp, "digits_class_iid_ncm.json")  # limit 12 and 2 offline epochs
    grid = grid_file(tmp, 'methods = ["ncm"]\nruns = 1')
    Path(grid).write_text(Path(grid).read_text().replace("limit_per_class = 12\n",
                                                         "limit_per_class = 13\n"))
    return path, ["sweep", grid, "--workers", "1"]


def notes(tmp: Path) -> Path:
    path = tmp / "out" / NAME
    path.parent.mkdir(parents=True)
    path.write_text("my notes")
    return path


def fifo(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "out" / NAME
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    return path, run_args(tmp, "--runs", "1")


OVERWRITE_CASES = [
    ("other-method-at-the-name", lambda t: (other_result(t, method="slda"),
                                            run_args(t, "--runs", "1")),
     "holds another experiment (method: \"slda\" there, \"ncm\" here)"),
    ("other-setting-at-the-name", lambda t: (other_result(t, settings={"temperature": 9.0}),
                                             run_args(t, "--runs", "1")),
     "holds another experiment (settings.temperature: 9.0 there, 1.0 here)"),
    ("other-limit-at-the-name", lambda t: (other_result(t, limit_per_class=60),
                                           run_args(t, "--runs", "1")),
     "holds another experiment (limit_per_class: 60 there, 12 here"),
    ("not-a-result", lambda t: (notes(t), run_args(t, "--runs", "1")), "not valid JSON"),
    ("fewer-seeds-drop-runs", lambda t: (other_result(t, seeds=[0, 1, 2, 3]),
                                         run_args(t, "--runs", "1")),
     "does not repeat (seeds 1,2,3): refused to drop them"),
    ("sweep-cell-then-run", sweep_then_run,
     "digits_class_iid_ncm.json holds another experiment (limit_per_class: 12 there, null "
     "here"),
    ("run-result-then-sweep", run_then_sweep,
     "digits_class_iid_ncm.json holds another experiment (limit_per_class: 12 there, 13 here"),
    ("fifo-at-the-name", fifo, "not a regular file (a FIFO (named pipe))"),
]


def snapshot(path: Path) -> bytes | str:
    return path.read_bytes() if path.is_file() else "fifo"


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in OVERWRITE_CASES],
                         ids=[c[0] for c in OVERWRITE_CASES])
def test_a_result_of_another_experiment_is_never_replaced(setup, fragment, tmp_path, capsys):
    path, argv = setup(tmp_path)
    before = snapshot(path)
    capsys.readouterr()
    line = one_line_error(*cli(capsys, argv))
    assert fragment in line and str(path) in line and "--force" in line
    assert snapshot(path) == before
    assert not list(path.parent.glob("*.ckpt"))


def test_force_replaces_and_the_same_experiment_still_extends(tmp_path, capsys):
    path = other_result(tmp_path, method="slda")
    assert main(run_args(tmp_path, "--runs", "1", "--force")) == 0
    assert json.loads(path.read_text())["method"] == "ncm"
    assert main(run_args(tmp_path, "--runs", "2")) == 0  # the same experiment, more seeds
    assert json.loads(path.read_text())["seeds"] == [0, 1]
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--seeds", "1")))
    assert "(seeds 0)" in line
    assert main(run_args(tmp_path, "--seeds", "1", "--force")) == 0


def test_a_result_appearing_during_the_run_is_not_replaced(tmp_path, capsys, monkeypatch):
    """Another command writes at the name while this one computes: refused at the write, the
    finished runs kept in the checkpoint for --resume."""
    other = json.dumps({"dataset": "digits", "ordering": "class_iid", "method": "slda"})
    real_run_seed = experiment.run_seed

    def meanwhile(*a, **kw):
        (tmp_path / "out" / NAME).write_text(other)
        return real_run_seed(*a, **kw)

    monkeypatch.setattr(experiment, "run_seed", meanwhile)
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--runs", "1")))
    assert "holds another experiment (method" in line and "--resume" in line
    assert (tmp_path / "out" / NAME).read_text() == other
    assert list((tmp_path / "out").glob("*.ckpt"))


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


# ---------------------------------------------------------------------------- hangs: not files
# (id, setup(tmp) -> argv, fragment); each answers at once (a thread would hang otherwise)


def make_fifo(tmp: Path, name: str) -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


def checkpoint_fifo(tmp: Path) -> list[str]:
    (tmp / "out").mkdir()
    os.mkfifo(tmp / "out" / NAME.replace(".json", ".ckpt"))
    return run_args(tmp, "--runs", "1", "--resume")


NOT_A_FILE_CASES = [
    ("grid-fifo", lambda t: ["sweep", str(make_fifo(t, "g.toml"))],
     "g.toml: not a regular file (a FIFO (named pipe))"),
    ("grid-dev-zero", lambda t: ["sweep", "/dev/zero"],
     "/dev/zero: not a regular file (a character device)"),
    ("grid-dry-run-dev-zero", lambda t: ["sweep", "/dev/zero", "--dry-run"],
     "/dev/zero: not a regular file (a character device)"),
    ("grid-too-large", lambda t: ["sweep", str(t / "big.toml")] if (t / "big.toml").write_bytes(
        b"#" * (17 * 2**20)) else None, "larger than the 16777216 bytes"),
    ("grid-not-utf8", lambda t: ["sweep", str(t / "g.toml")] if (t / "g.toml").write_bytes(
        b'name = "\xff"\n') else None, "g.toml: not UTF-8 text (byte 8"),
    ("checkpoint-fifo", checkpoint_fifo, ".ckpt: not a regular file (a FIFO (named pipe))"),
    ("weights-fifo", lambda t: run_args(t, "--weights", str(make_fifo(t, "w.pth"))),
     "w.pth: not a regular file (a FIFO (named pipe))"),
    ("weights-dev-zero", lambda t: run_args(t, "--weights", "/dev/zero"),
     "--weights /dev/zero: not a regular file (a character device)"),
]


@pytest.mark.parametrize(("argv", "fragment"), [c[1:] for c in NOT_A_FILE_CASES],
                         ids=[c[0] for c in NOT_A_FILE_CASES])
def test_fifos_and_devices_are_refused_at_once(argv, fragment, tmp_path, capsys):
    args = argv(tmp_path)
    answer: list = []
    worker = threading.Thread(target=lambda: answer.append(cli(capsys, args)), daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the reader, then fail
        for fifo_path in tmp_path.rglob("*"):
            if fifo_path.is_fifo():
                with open(fifo_path, "wb", buffering=0) as f:
                    f.write(b"x")
        pytest.fail("the command blocked on a FIFO or a device")
    line = one_line_error(*answer[0])
    assert fragment in line


def test_read_json_skips_fifos_and_devices(tmp_path):
    from ciosl.fileio import load_json, read_json

    fifo_path = make_fifo(tmp_path, "r.json")
    assert read_json(fifo_path) is None and read_json("/dev/zero") is None
    with pytest.raises(ValueError, match="nested too deeply"):
        (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
        load_json(tmp_path / "deep.json")


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


# ---------------------------------------------------------------------------- 10,000 classes


def python_calls(fn) -> int:
    """The Python function calls ``fn()`` makes (a count of work, not a time); the garbage
    collector is off meanwhile (its finalizers would add calls that are not ``fn``'s)."""
    import gc
    import sys

    calls = [0]

    def count(frame, event, arg):
        calls[0] += event == "call"

    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls[0]


def test_per_event_metrics_do_not_loop_over_classes():
    """class_counts (every testing event) and the accuracy matrix: one vectorised pass, not a
    Python loop over the classes. Counted: the Python calls made are the same for 2,000 and
    for 20,000 classes (a loop over the classes makes some per class). The time of 20,000
    classes is a benchmark: ``python benchmarks/metrics_time.py``."""
    from ciosl.evaluation.metrics import accuracy_matrix, class_counts, matrix_columns

    def metrics(C: int):
        rng = np.random.default_rng(0)
        y = rng.permutation(np.repeat(np.arange(C), 2))
        pred = np.where(rng.random(len(y)) < 0.5, y, 0)
        steps = [list(range(0, C * (t + 1) // 40)) for t in range(40)]
        out = {}

        def work():
            out["counts"] = [class_counts(pred, y) for _ in range(3)]
            out["R"] = accuracy_matrix(out["counts"], matrix_columns(None, range(C)))
            matrix_columns(steps, range(C))
        return work, out, pred, y

    python_calls(metrics(100)[0])  # warm-up: first calls import and cache
    small, big = (python_calls(metrics(C)[0]) for C in (2_000, 20_000))
    # a loop over the classes would make 18,000 more (one per class at least); a few calls
    # may come and go with NumPy's own caches
    assert big - small < 100, (small, big)
    work, out, pred, y = metrics(20_000)
    work()
    assert out["counts"][0]["5"] == [int((pred[y == 5] == 5).sum()), 2]
    assert out["R"][0][5] == out["counts"][0]["5"][0] / 2


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


def test_another_data_folder_is_another_experiment(tmp_path, capsys):
    """``--data`` elsewhere with other contents: the result file is refused, naming the
    difference (the features' key covers the data's fingerprint), and --force replaces it."""
    import gzip

    from test_datasets import idx_bytes

    def write(folder: Path, seed: int) -> None:  # learnable: each class its own brightness
        rng = np.random.default_rng(seed)
        folder.mkdir()
        for split, count in (("train", 200), ("t10k", 100)):
            y = np.arange(count) % 10
            x = np.clip(y[:, None, None] * 25 + rng.integers(0, 20, (count, 28, 28)), 0, 255)
            for stem, arr in ((f"{split}-images-idx3-ubyte", x), (f"{split}-labels-idx1-ubyte", y)):
                (folder / (stem + ".gz")).write_bytes(gzip.compress(idx_bytes(arr)))

    def argv(folder: str, *extra: str) -> list[str]:
        return ["run", "--dataset", "fashion-mnist", "--data", str(tmp_path / folder),
                "--ordering", "iid", "--method", "ncm", "--extractor", "pixels",
                "--offline-epochs", "1", "--cache", str(tmp_path / "cache"),
                "--out", str(tmp_path / "out"), "--quiet", *extra]

    for folder, seed in (("a", 0), ("b", 1)):
        write(tmp_path / folder, seed)
    rc, err = cli(capsys, argv("a"))
    assert rc == 0, err
    (result,) = (tmp_path / "out").glob("*.json")
    before = result.read_bytes()
    line = one_line_error(*cli(capsys, argv("b")))
    assert f"{result} holds another experiment (features_key: " in line and "--force" in line
    assert result.read_bytes() == before
    rc, err = cli(capsys, argv("b", "--force"))
    assert rc == 0, err
    assert json.loads(result.read_text())["features_key"] != json.loads(before)["features_key"]


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
