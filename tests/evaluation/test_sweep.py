"""Experiment grids and sweeps: validation before anything runs, local and Ray executors giving
exactly ``run_experiment``'s results, resuming, shared caches."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.evaluation.experiment import (
    ExperimentSpec,
    load_features,
    offline_settings,
    run_experiment,
    stream_ordering,
    validate,
)
from ciosl.evaluation.grid import GridError, load_grid, parse_grid, spec_fields, tomllib
from ciosl.evaluation.protocol import offline_accuracy
from ciosl.evaluation.sweep import plan, prepare, result_file, run_file, run_sweep
from ciosl.fileio import claim
from ciosl.learners.ciosl import CIOSL
from ciosl.learners.tinyer import TinyER

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TIMING = {"wall_seconds", "samples_per_second", "predict_seconds", "path", "sweep"}
RUN_TIMING = {"base_seconds", "learn_seconds", "predict_seconds", "seconds_per_sample",
              "samples_per_second"}

SMALL = """
name = "small"
datasets = ["digits"]
orderings = ["class_iid"]
methods = ["ncm", "tinyer"]
seeds = [0, 1]
limit_per_class = 15

[grid.tinyer]
buffer = [20, 40]
"""


def write_grid(folder: Path, text: str, name: str = "grid.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def comparable(result: dict) -> dict:
    out = {k: v for k, v in result.items() if k not in TIMING}
    out["runs"] = [{k: v for k, v in r.items() if k not in RUN_TIMING} for r in result["runs"]]
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, cache):
    folder = tmp_path_factory.mktemp("sweep")
    path = write_grid(folder, f'cache = "{cache}"\nout = "{folder / "out"}"\n' + SMALL)
    grid = load_grid(path)
    summary = run_sweep(grid, executor="local", workers=2)
    return grid, summary


# ---------------------------------------------------------------------------- validation


def grid_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(GridError) as info:
        load_grid(write_grid(tmp_path, text))
    return str(info.value)


BASE = 'datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["ncm", "ciosl"]\n'


ERRORS = [
    (BASE + "colour = 3\n", "colour", "unknown top-level key"),
    ('datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["ncm", "nope"]\n',
     "methods", "unknown method 'nope'"),
    (BASE + "[settings.ciosl]\nlambda3 = 1.0\n", "settings.ciosl.lambda3",
     "unknown setting 'lambda3'"),
    (BASE + "[settings.ciosl]\nbuffer = \"big\"\n", "settings.ciosl.buffer",
     "expects an integer, got string"),
    (BASE + "[grid.ciosl]\nlambda2 = [0.1, \"x\"]\n", "grid.ciosl.lambda2", "expects a number"),
    (BASE + "[grid.ciosl]\nlambda2 = 0.3\n", "grid.ciosl.lambda2", "non-empty list"),
    (BASE + "[grid.ciosl]\nlambda2 = [0.1]\nout = \"x\"\n", "grid.ciosl.out",
     "unknown setting 'out'"),
    (BASE + "[variants.ciosl.best]\nselection = \"best\"\n", "variants.ciosl.best.selection",
     "valid choices"),
    (BASE + "[settings.slda]\nshrinkage = 0.1\n", "settings.slda", "not in methods"),
    ('datasets = ["digits"]\norderings = ["instance"]\nmethods = ["ncm"]\n', "orderings",
     "does not support the 'instance' ordering"),
    ('methods = ["ncm"]\n[datasets]\ndigits-video = ["instance"]\ndigits = ["class_instance"]\n',
     "datasets.digits", "does not support the 'class_instance' ordering"),
    ('datasets = ["digits", "mnist9"]\norderings = ["iid"]\nmethods = ["ncm"]\n', "datasets",
     "unknown dataset 'mnist9'"),
    (BASE + "runs = 3\nseeds = [0, 1]\n", "seeds", "either runs or seeds"),
    (BASE + "runs = 2.5\n", "runs", "expects a positive integer, got float"),
    (BASE + "limit_per_class = 0\n", "limit_per_class", "positive integer"),
    (BASE + 'extractor = "resnet"\n', "extractor", "unknown extractor 'resnet'"),
    (BASE + 'omega_events = "first"\n', "omega_events", "valid choices: after_base, all"),
]


@pytest.mark.parametrize("text, key, words", ERRORS, ids=[key for _, key, _ in ERRORS])
def test_grid_errors_name_the_key(tmp_path, text, key, words):
    message = grid_error(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'grid.toml'}: {key}: "), message
    assert words in message


def test_invalid_grid_is_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    path = write_grid(tmp_path, BASE + f'out = "{out}"\n[settings.ncm]\ntemprature = 2.0\n')
    assert main(["sweep", str(path)]) == 2
    assert "settings.ncm.temprature" in capsys.readouterr().err
    assert not out.exists()


def test_regimes_make_cells_or_are_refused_clearly(tmp_path):
    text = ('datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["tinyer", "ciosl"]\n'
            'regimes = ["batch", "streaming"]\nbatch_size = 10\n')
    if "regime" in spec_fields():
        grid = load_grid(write_grid(tmp_path, text))
        assert [c.regime for c in grid.cells] == ["batch", "streaming"] * 2
        assert [c.id for c in grid.cells[:2]] == ["digits_class_iid_tinyer_batch",
                                                  "digits_class_iid_tinyer"]
        assert grid.experiment(grid.cells[0]).batch_size == 10
        ncm = text.replace('"tinyer"', '"ncm"')
        assert "regimes: cell digits_class_iid_ncm_batch: method 'ncm' does not support the " \
            "batch regime" in grid_error(tmp_path, ncm)
    else:
        assert "regimes: this version of ciosl cannot run" in grid_error(tmp_path, text)
    assert "batch_size: only applies with regimes" in grid_error(tmp_path, BASE + "epochs = 3\n"
                                                                 "batch_size = 4\n")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    text = path.read_text()
    if "regimes" in text and "regime" not in spec_fields():
        with pytest.raises(GridError, match=r": regimes: this version of ciosl cannot run"):
            load_grid(path)
        return
    grid = load_grid(path)
    assert grid.cells and grid.seeds
    assert len({c.id for c in grid.cells}) == len(grid.cells)
    assert grid.out == Path("results") / path.stem


def test_variants_get_their_own_cells_and_ids():
    grid = parse_grid({
        "datasets": ["digits"], "orderings": ["iid"], "methods": ["ciosl", "ncm"],
        "settings": {"ciosl": {"lambda1": 0.5}},
        "grid": {"ciosl": {"selection": ["uniform", "lapn"], "replacement": ["lawrrr", "lawcbr"]}},
        "variants": {"ciosl": {"no-kd": {"lambda2": 0}}},
    })
    ids = [c.id for c in grid.cells]
    assert ids == [
        "digits_iid_ciosl_selection-uniform+replacement-lawrrr",
        "digits_iid_ciosl_selection-uniform+replacement-lawcbr",
        "digits_iid_ciosl_selection-lapn+replacement-lawrrr",
        "digits_iid_ciosl_selection-lapn+replacement-lawcbr",
        "digits_iid_ciosl_no-kd", "digits_iid_ncm"]
    assert grid.cells[1].settings == {"lambda1": "0.5", "selection": "uniform",
                                      "replacement": "lawcbr"}
    assert grid.cells[4].settings == {"lambda1": "0.5", "lambda2": "0"}
    assert grid.seeds == [0, 1, 2]


# ---------------------------------------------------------------------------- running


def test_local_sweep_equals_run_experiment(local_sweep, cache):
    grid, summary = local_sweep
    assert [c.id for c in grid.cells] == ["digits_class_iid_ncm", "digits_class_iid_tinyer_buffer-20",
                                         "digits_class_iid_tinyer_buffer-40"]
    assert (summary.computed, summary.skipped, summary.failed) == (6, 0, [])
    assert sorted(summary.results) == sorted(str(result_file(grid.out, c)) for c in grid.cells)
    for cell in grid.cells:
        swept = json.loads(result_file(grid.out, cell).read_text())
        assert swept["sweep"]["cell"] == cell.id
        direct = run_experiment(grid.experiment(cell))
        assert comparable(swept) == comparable(direct)
    tinyer = [json.loads(result_file(grid.out, c).read_text()) for c in grid.cells[1:]]
    assert [r["settings"]["buffer"] for r in tinyer] == [20, 40]


def test_resumed_sweep_recomputes_only_missing_or_stale_runs(local_sweep):
    grid, _ = local_sweep
    files = {(c.id, s): run_file(grid.out, c, s) for c in grid.cells for s in grid.seeds}
    before = {k: json.loads(p.read_text()) for k, p in files.items()}
    mtimes = {k: p.stat().st_mtime_ns for k, p in files.items()}
    aggregate = json.loads(result_file(grid.out, grid.cells[1]).read_text())
    deleted, stale = ("digits_class_iid_tinyer_buffer-20", 1), ("digits_class_iid_ncm", 0)
    files[deleted].unlink()
    files[stale].write_text(json.dumps({**before[stale], "fingerprint": "another grid"}))

    summary = run_sweep(grid, executor="local", workers=1)

    assert (summary.computed, summary.skipped, summary.failed) == (2, 4, [])
    for key, path in files.items():
        if key in (deleted, stale):
            assert json.loads(path.read_text())["run"]["accuracy"] == before[key]["run"]["accuracy"]
        else:
            assert path.stat().st_mtime_ns == mtimes[key], f"{key} was recomputed"
    again = json.loads(result_file(grid.out, grid.cells[1]).read_text())
    assert comparable(again) == comparable(aggregate)

    nothing = run_sweep(grid, executor="local", workers=1)
    assert (nothing.computed, nothing.skipped) == (0, 6)


def test_runs_override_reuses_finished_runs_and_rewrites_cell_results(local_sweep, tmp_path,
                                                                      capsys):
    import shutil

    grid, _ = local_sweep
    out = tmp_path / "out"
    shutil.copytree(grid.out, out)
    path = write_grid(tmp_path, f'cache = "{grid.cache}"\nout = "{out}"\n' + SMALL)
    runs = {c.id: [run_file(out, c, s).stat().st_mtime_ns for s in grid.seeds]
            for c in grid.cells}

    assert main(["sweep", str(path), "--runs", "1", "--workers", "1"]) == 0
    for cell in grid.cells:
        result = json.loads(result_file(out, cell).read_text())
        assert result["seeds"] == [0] and len(result["runs"]) == 1, cell.id
        # the finished runs were reused, not recomputed
        assert [run_file(out, cell, s).stat().st_mtime_ns for s in grid.seeds] == runs[cell.id]

    assert main(["sweep", str(path), "--seeds", "0,1", "--workers", "1"]) == 0
    for cell in grid.cells:
        result = json.loads(result_file(out, cell).read_text())
        full = json.loads(result_file(grid.out, cell).read_text())
        assert result["seeds"] == [0, 1] and comparable(result) == comparable(full)

    assert main(["sweep", str(path), "--runs", "0"]) == 2
    assert "--runs must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", str(path), "--runs", "1", "--seeds", "0"])


def test_omega_events_rewrites_cell_results_without_rerunning(local_sweep, tmp_path):
    """The Omega_all definition is a grid key (and a `ciosl sweep` flag): changing it rewrites
    each cell's result from the finished runs' per-event accuracies, re-running nothing."""
    import shutil

    grid, _ = local_sweep
    out = tmp_path / "out"
    shutil.copytree(grid.out, out)
    runs = {c.id: [run_file(out, c, s).stat().st_mtime_ns for s in grid.seeds]
            for c in grid.cells}
    path = write_grid(tmp_path, f'cache = "{grid.cache}"\nout = "{out}"\n'
                      'omega_events = "all"\n' + SMALL)
    assert load_grid(path).omega_events == "all"
    summary = run_sweep(load_grid(path), executor="local", workers=1)
    assert (summary.computed, len(summary.results)) == (0, len(grid.cells))
    for cell in grid.cells:
        result = json.loads(result_file(out, cell).read_text())
        ratios = [np.array(r["accuracy"]) / np.array(r["accuracy_offline"])
                  for r in result["runs"]]
        assert result["omega_all"]["events"] == "all"
        assert result["omega_all"]["mean"] == pytest.approx(np.mean([r.mean() for r in ratios]))
        assert [run_file(out, cell, s).stat().st_mtime_ns for s in grid.seeds] == runs[cell.id]
    assert main(["sweep", str(path), "--omega-events", "after_base", "--workers", "1"]) == 0
    for cell in grid.cells:
        result = json.loads(result_file(out, cell).read_text())
        ratios = [np.array(r["accuracy"]) / np.array(r["accuracy_offline"])
                  for r in result["runs"]]
        assert result["omega_all"]["events"] == "after_base"
        assert result["omega_all"]["mean"] == pytest.approx(
            np.mean([r[1:].mean() for r in ratios]))


def test_ray_executor_gives_the_local_results(local_sweep, tmp_path):
    if not os.environ.get("CI"):
        pytest.importorskip("ray")
    import ray

    grid, _ = local_sweep
    local = {c.id: json.loads(result_file(grid.out, c).read_text()) for c in grid.cells}
    grid = dataclasses.replace(grid, out=tmp_path / "ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_sweep(grid, executor="ray", workers=2)
    finally:
        ray.shutdown()
    assert (summary.computed, summary.failed) == (6, [])
    for cell in grid.cells:
        remote = json.loads(result_file(grid.out, cell).read_text())
        assert [r["accuracy"] for r in remote["runs"]] == \
            [r["accuracy"] for r in local[cell.id]["runs"]]
        assert remote["omega_all"] == local[cell.id]["omega_all"]
        assert comparable(remote) == comparable(local[cell.id])


def test_features_are_cached_before_any_worker_starts(tmp_path):
    grid = parse_grid({"datasets": ["digits"], "orderings": ["iid", "class_iid"],
                       "methods": ["ncm", "slda"], "cache": str(tmp_path), "seeds": [0]})
    infos = prepare(grid)
    assert len(list((tmp_path / "features").glob("*.npz"))) == 1
    assert len({i.fs.key for i in infos}) == 1 and infos[0].fs.train_z.size == 0
    assert len({i.fingerprint for i in infos}) == 4


def test_concurrent_writers_of_one_offline_entry_leave_one_complete_file(tmp_path):
    exp = ExperimentSpec(dataset="digits", ordering="class_iid", method="ncm",
                         limit_per_class=10, cache_dir=tmp_path)
    spec, _, _ = validate(exp)
    fs = load_features(exp, spec)
    ordering = stream_ordering(exp, spec, fs, 3)
    barrier, results = threading.Barrier(2), []

    def write():
        barrier.wait()
        results.append(offline_accuracy(fs, ordering, 1, offline_settings(exp, spec), tmp_path))

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries = list((tmp_path / "offline").iterdir())
    assert len(results) == 2 and results[0] == results[1]
    assert len(entries) == 1 and entries[0].suffix == ".json"
    assert json.loads(entries[0].read_text())["accuracy"] == results[0]


def test_cli_dry_run_lists_cells_and_finished_runs(local_sweep, tmp_path, capsys):
    grid, _ = local_sweep
    path = write_grid(tmp_path, f'out = "{grid.out}"\n' + SMALL)
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for cell in grid.cells:
        assert cell.id in out
    assert out.count("2/2") == 3


def test_readme_grid_example_is_valid():
    readme = (CONFIGS.parent / "README.md").read_text()
    text = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    grid = parse_grid(tomllib.loads(text), source="README.md")
    ids = {c.id for c in grid.cells}
    assert "digits_iid_ciosl_selection-lapn+replacement-lawcbr" in ids
    assert "fashion-mnist-video_class_instance_ciosl_no-distillation" in ids
    assert len(grid.cells) == 4 * (6 + 1 + 1) and grid.seeds == list(range(10))


def test_a_changed_learner_default_changes_the_fingerprint(tmp_path, monkeypatch):
    """A new release that changes a method's default must not reuse runs made with the old
    one: the fingerprint holds every resolved setting, not only those the grid or the
    protocol set."""
    grid = parse_grid({"datasets": ["digits"], "orderings": ["iid"], "methods": ["ciosl"],
                       "cache": str(tmp_path), "seeds": [0]})
    before = prepare(grid)[0].fingerprint
    assert prepare(grid)[0].fingerprint == before
    settings = CIOSL.settings()
    changed = [dataclasses.replace(st, default=0.7) if st.name == "lambda2" else st
               for st in settings]
    monkeypatch.setattr(CIOSL, "settings", classmethod(lambda cls: changed))
    assert prepare(grid)[0].fingerprint != before


def test_dry_run_counts_only_the_runs_the_sweep_will_reuse(local_sweep, monkeypatch):
    """--dry-run reads each run file's settings fingerprint: after a default changes, the
    cells it changes show no finished run (the sweep recomputes them), the others all."""
    grid, _ = local_sweep
    assert all(done == grid.seeds for _, done in plan(grid))
    changed = [dataclasses.replace(st, default=8) if st.name == "n_replay" else st
               for st in TinyER.settings()]
    monkeypatch.setattr(TinyER, "settings", classmethod(lambda cls: changed))
    counts = {cell.method: len(done) for cell, done in plan(grid)}
    assert counts == {"ncm": len(grid.seeds), "tinyer": 0}
    assert {info.cell.method for info in prepare(grid)
            if info.fingerprint != json.loads(run_file(grid.out, info.cell, 0).read_text())[
                "fingerprint"]} == {"tinyer"}  # and the sweep agrees


def test_an_extended_folder_divides_every_method_by_its_one_offline_reference(tmp_path):
    """A sweep that adds a method to a folder takes the offline reference its finished runs
    divide by, not a freshly trained one (a cache rebuilt on another machine can train a
    slightly different offline MLP): every method of a stream keeps one reference."""
    head = (f'cache = "{tmp_path / "cache"}"\nout = "{tmp_path / "out"}"\nname = "x"\n'
            'datasets = ["digits"]\norderings = ["class_iid"]\nseeds = [0]\n'
            'limit_per_class = 15\n')
    first = load_grid(write_grid(tmp_path, head + 'methods = ["ncm"]\n', "a.toml"))
    run_sweep(first, executor="local", workers=1)
    path = run_file(first.out, first.cells[0], 0)
    saved = json.loads(path.read_text())
    folder_reference = [0.5 + 0.01 * i for i in range(len(saved["run"]["accuracy_offline"]))]
    saved["run"]["accuracy_offline"] = folder_reference  # as if trained on another machine
    path.write_text(json.dumps(saved))
    statuses = []

    class Monitor:
        def update(self, status):
            statuses.append(dataclasses.replace(status))

        def run_done(self, *args):
            pass

        run_failed = cell_done = run_done

    both = load_grid(write_grid(tmp_path, head + 'methods = ["ncm", "slda"]\n', "b.toml"))
    summary = run_sweep(both, executor="local", workers=1, monitor=Monitor())

    assert (summary.computed, summary.skipped, summary.failed) == (1, 1, [])
    assert statuses and all(st.offline == 0 for st in statuses)  # no offline task was run
    slda = json.loads(result_file(both.out, both.cells[1]).read_text())
    assert slda["runs"][0]["accuracy_offline"] == folder_reference
    acc = slda["runs"][0]["accuracy"]
    assert slda["omega_all"]["mean"] == pytest.approx(
        np.mean(np.divide(acc[1:], folder_reference[1:])))


def test_a_partial_grid_swept_into_a_folder_keeps_the_folder_grid_text(tmp_path):
    """The grid file a sweep leaves for the report is never replaced by another grid's (a
    resumed subset): each grid's text stays."""
    from ciosl.evaluation.sweep import write_grid_text

    whole = 'name = "g"\nmethods = ["ncm", "slda"]\n'
    part = 'name = "g"\nmethods = ["ncm"]\n'
    first = write_grid_text(tmp_path, "g", whole)
    assert write_grid_text(tmp_path, "g", whole) == first  # the same grid: the same file
    second = write_grid_text(tmp_path, "g", part)
    assert first.read_text() == whole and second.read_text() == part and second != first
    assert second.name.startswith("sweep-g-") and second.suffix == ".toml"


@pytest.mark.parametrize("default, reused", [("old", True), ("new", False)])
def test_a_setting_added_later_keeps_the_runs_made_at_its_old_value(local_sweep, monkeypatch,
                                                                   default, reused):
    """A new setting (``added_settings``: the value runs saved before it ran at) changes no
    cell whose value is that one: the sweep and --dry-run reuse its runs; at another value
    the cell is computed again."""
    from ciosl.learners.base import Setting

    grid, _ = local_sweep
    added = [*TinyER.settings(), Setting("new_rule", default, str, "")]
    monkeypatch.setattr(TinyER, "settings", classmethod(lambda cls: added))
    monkeypatch.setattr(TinyER, "added_settings", {"new_rule": "old"})
    monkeypatch.setattr(TinyER, "new_rule", default, raising=False)  # as its constructor would
    counts = {cell.method: len(done) for cell, done in plan(grid)}
    assert counts == {"ncm": len(grid.seeds), "tinyer": len(grid.seeds) if reused else 0}
    for info in prepare(grid):
        saved = json.loads(run_file(grid.out, info.cell, 0).read_text())["fingerprint"]
        assert (saved in (info.fingerprint, *info.legacy_fingerprints)) == (
            reused or info.cell.method == "ncm")


@pytest.mark.parametrize("second, reused", [("old2", True), ("new2", False)])
def test_runs_saved_between_two_added_settings_are_kept(local_sweep, monkeypatch, second,
                                                        reused):
    """Settings are added one after another: a run saved after the first existed and before
    the second records the first and not the second. It counts when the cell runs the second
    at its old value, whatever the first is (not only runs older than every added setting)."""
    from ciosl.learners.base import Setting

    grid, _ = local_sweep
    first = [*TinyER.settings(), Setting("rule_a", "a0", str, "")]
    monkeypatch.setattr(TinyER, "settings", classmethod(lambda cls: first))
    monkeypatch.setattr(TinyER, "added_settings", {})
    monkeypatch.setattr(TinyER, "rule_a", "a0", raising=False)
    monkeypatch.setattr(TinyER, "new_rule", "x", raising=False)
    # the runs of this "version" record rule_a (at "a0", the value older runs ran at)
    for info in prepare(grid):
        if info.cell.method == "tinyer":
            for seed in grid.seeds:
                path = run_file(grid.out, info.cell, seed)
                saved = json.loads(path.read_text())
                saved["fingerprint"] = info.fingerprint
                saved["settings_fingerprint"] = info.settings_fingerprint
                path.write_text(json.dumps(saved))
    both = [*first, Setting("new_rule", second, str, "")]
    monkeypatch.setattr(TinyER, "settings", classmethod(lambda cls: both))
    monkeypatch.setattr(TinyER, "added_settings", {"rule_a": "a0", "new_rule": "old2"})
    monkeypatch.setattr(TinyER, "new_rule", second, raising=False)
    counts = {cell.method: len(done) for cell, done in plan(grid)}
    assert counts == {"ncm": len(grid.seeds), "tinyer": len(grid.seeds) if reused else 0}
    for info in prepare(grid):
        saved = json.loads(run_file(grid.out, info.cell, 0).read_text())["fingerprint"]
        assert (saved in (info.fingerprint, *info.legacy_fingerprints)) == (
            reused or info.cell.method == "ncm")


def test_a_result_written_before_a_setting_existed_is_the_same_experiment(tmp_path):
    """check_overwrite reads a setting a result lacks at the method's added_settings value:
    slda results from before shrinkage_estimator are "fixed" ones, not another experiment."""
    from ciosl.evaluation.experiment import check_overwrite

    old = {"dataset": "digits", "ordering": "iid", "method": "slda",
           "settings": {"shrinkage": 1e-4, "streaming_update": True}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(old))
    fixed = {**old, "settings": {**old["settings"], "shrinkage_estimator": "fixed"}}
    check_overwrite(path, fixed)
    with pytest.raises(ValueError, match='shrinkage_estimator: "fixed" there, "oas" here'):
        check_overwrite(path, {**old, "settings": {**old["settings"],
                                                   "shrinkage_estimator": "oas"}})


class _Holder:
    """Another process's claim on a run file, as a sweep sees it (an flock from another open
    file: two opens conflict even in one process), let go by ``action`` once the sweep has
    finished one of its own runs."""

    def __init__(self, path: Path, action: str, finished: Path):
        self.path, self.action, self.finished = path, action, finished
        self.stack = contextlib.ExitStack()
        self.stack.enter_context(claim(path, "pid 1, another sweep"))
        self.done_here: list[int] = []

    def update(self, status) -> None:
        pass

    def run_done(self, cell, seed, run, seconds) -> None:
        self.done_here.append(seed)
        if self.action == "writes its run":  # the holder finishes: its file, then its lock
            self.path.write_bytes(self.finished.read_bytes())
        self.stack.close()  # ended: with its file, or without it (crashed)

    def run_failed(self, cell, seed, error) -> None:
        raise AssertionError(error)

    def cell_done(self, cell, result) -> None:
        pass


@pytest.mark.parametrize("action, computed, elsewhere", [
    ("writes its run", [1], 1),  # taken from its file, not computed again
    ("ends without it", [1, 0], 0),  # a crashed holder: the sweep computes the run itself
])
def test_a_run_claimed_by_another_sweep_is_left_to_it(tmp_path, action, computed, elsewhere):
    text = (f'name = "one"\nout = "{tmp_path}/out"\ncache = "{tmp_path}/cache"\n'
            'datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["ncm"]\n'
            'seeds = [0, 1]\nlimit_per_class = 12\noffline_epochs = 1\n')
    alone = load_grid(write_grid(tmp_path, text.replace("/out", "/alone"), "alone.toml"))
    run_sweep(alone, workers=1)  # the same grid, one sweep alone: what the holder writes
    grid = load_grid(write_grid(tmp_path, text))
    path = run_file(grid.out, grid.cells[0], 0)
    path.parent.mkdir(parents=True)
    holder = _Holder(path, action, run_file(alone.out, alone.cells[0], 0))
    summary = run_sweep(grid, workers=1, monitor=holder)
    assert holder.done_here == computed  # seed 0 waited for its holder
    assert (summary.computed, summary.elsewhere, summary.failed) == (len(computed), elsewhere, [])
    assert (comparable(json.loads(result_file(grid.out, grid.cells[0]).read_text()))
            == comparable(json.loads(result_file(alone.out, alone.cells[0]).read_text())))
    assert not list(grid.out.rglob(".*.lock"))


def test_a_sweep_out_of_file_descriptors_runs_unclaimed(tmp_path, monkeypatch):
    """A driver that cannot open one more lock file (a Ray cluster of thousands of CPUs past
    ``ulimit -n``) runs its runs unclaimed, as sweeps did before claims, rather than failing."""
    import errno

    from ciosl.evaluation import sweep

    def no_descriptors(path, holder):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(sweep, "claim", no_descriptors)
    grid = load_grid(write_grid(tmp_path, (
        f'name = "one"\nout = "{tmp_path}/out"\ncache = "{tmp_path}/cache"\n'
        'datasets = ["digits"]\norderings = ["class_iid"]\nmethods = ["ncm"]\n'
        'seeds = [0, 1]\nlimit_per_class = 12\noffline_epochs = 1\n')))
    summary = run_sweep(grid, workers=1)
    assert (summary.computed, summary.elsewhere, summary.failed) == (2, 0, [])
