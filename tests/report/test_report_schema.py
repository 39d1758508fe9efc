"""`ciosl report` believes no result file (``report.schema``): each is checked (ranges, lengths,
order, known values, nesting) and a bad one is skipped with one warning naming the file and the
field; names from results are escaped in every output, so no name fails the whole report.
Table-driven."""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path

import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment

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


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    """A real result (ncm, digits, 2 runs), the model of every bad one."""
    tmp = tmp_path_factory.mktemp("result")
    result = experiment.run_experiment(experiment.ExperimentSpec(
        dataset="digits", ordering="class_iid", method="ncm", seeds=[0, 1], out_dir=tmp / "out",
        cache_dir=tmp / "cache", limit_per_class=12, offline_epochs=2))
    return json.loads(Path(result["path"]).read_text())


def _set(data: dict, where: str, value) -> None:
    """``data`` at the dotted path ``where`` (``runs.0.accuracy.1``) set to ``value``."""
    *parents, last = where.split(".")
    for key in parents:
        data = data[int(key)] if isinstance(data, list) else data[key]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def _swap_events(data: dict) -> None:
    events = data["runs"][0]["events"]
    events[1], events[2] = events[2], events[1]


def _drop_last(key: str):
    def change(data: dict) -> None:
        data["runs"][1][key] = data["runs"][1][key][:-1]
    return change


def _drop_from_run_1(key: str):
    def change(data: dict) -> None:
        del data["runs"][1][key]
    return change


def _drop_std(key: str):
    def change(data: dict) -> None:
        del data[key]["std"]
    return change


def _one_run_three_times(data: dict) -> None:
    data["runs"] = [copy.deepcopy(data["runs"][0]) for _ in range(3)]
    data["seeds"] = [0, 0, 0]


PER_EVENT = ("events", "n_test", "accuracy", "accuracy_offline", "class_counts",
             "accuracy_matrix")


def _fewer_events_in_run_1(data: dict) -> None:
    """Run 1 cut to its first 4 testing events, consistently (its own lists agree)."""
    run = data["runs"][1]
    for key in PER_EVENT:
        run[key] = run[key][:4]
    run["n_base"] += run["n_stream"] - run["events"][-1]  # the stream ends at its last event
    run["n_stream"] = run["events"][-1]


# (kind, change made to a copy of the good result: {dotted path: value} or a function, the
# warning's fragment after "malformed result: ")
BAD_RESULTS = [
    ("accuracy-above-1", {"runs.0.accuracy.1": 7.5},
     "runs[0].accuracy[1] must be a number in [0, 1], got 7.5"),
    ("accuracy-negative", {"runs.1.accuracy.0": -3},
     "runs[1].accuracy[0] must be a number in [0, 1], got -3"),
    ("offline-zero", {"runs.0.accuracy_offline.2": 0},
     "runs[0].accuracy_offline[2] must be a number in (0, 1], got 0"),
    ("offline-above-1", {"runs.0.accuracy_offline.0": 1.5},
     "runs[0].accuracy_offline[0] must be a number in (0, 1], got 1.5"),
    ("accuracy-shorter-than-events", _drop_last("accuracy"),
     "runs[1].accuracy must have one value per testing event"),
    ("offline-shorter-than-events", _drop_last("accuracy_offline"),
     "runs[1].accuracy_offline must have one value per testing event"),
    ("events-out-of-order", _swap_events, "runs[0].events must be in increasing order"),
    ("events-not-positions", {"runs.0.events.1": "soon"},
     "runs[0].events must be a list of stream positions"),
    ("unknown-omega-events", {"omega_all.events": "sometimes"},
     "omega_all.events must be one of after_base, all, got 'sometimes'"),
    ("negative-omega", {"omega_all.mean": -0.5}, "omega_all.mean must be >= 0, got -0.5"),
    ("run-omega-negative", {"runs.0.omega_all": -1},
     "runs[0].omega_all must be >= 0, got -1"),
    ("final-accuracy-above-1", {"final_accuracy.mean": 7.5},
     "final_accuracy.mean must be a number in [0, 1], got 7.5"),
    ("forgetting-out-of-range", {"forgetting.mean": 3.0},
     "forgetting.mean must be a number in [-1, 1], got 3.0"),
    ("class-accuracy-above-1", {"runs.0.final_class_accuracy.3": 2.0},
     "runs[0].final_class_accuracy['3'] must be a number in [0, 1], got 2.0"),
    ("matrix-above-1", {"accuracy_matrix.0.0": 1.5},
     "accuracy_matrix[0][0] must be a number in [0, 1], got 1.5"),
    ("unknown-ordering", {"ordering": "sideways"},
     "ordering must be one of iid, class_iid, instance, class_instance, ni, nc, nic, got 'sideways'"),
    ("empty-method", {"method": " "}, "method must not be empty, got ' '"),
    ("negative-limit", {"limit_per_class": -1},
     "limit_per_class must be an integer >= 0, got -1"),
    ("negative-speed", {"runs.0.samples_per_second": -5.0},
     "runs[0].samples_per_second must be a finite number >= 0, got -5.0"),
    ("settings-not-object", {"settings": [1, 2]}, "settings has the wrong type, got [1, 2]"),
    ("nested-deep", {"settings": _nested(100)},
     "settings" + ".x" * 15 + " is nested more than 16 levels deep"),
    # shapes: every list of lists is rectangular, with the shape the events imply
    ("ragged-matrix", {"accuracy_matrix": [[0.1], [0.2, 0.3, 0.4]]},
     "accuracy_matrix must have one row per testing event (5), has 2"),
    ("ragged-matrix-row", {"accuracy_matrix.1": [0.2, 0.3]},
     "accuracy_matrix[1] must have one value per matrix column (5), has 2"),
    ("ragged-run-matrix", {"runs.0.accuracy_matrix.2": [0.5]},
     "runs[0].accuracy_matrix[2] must have one value per matrix column (5), has 1"),
    ("class-counts-not-counts", {"runs.0.class_counts.0.1": [40, 36]},
     "runs[0].class_counts[0]['1'] must be [correct, n], 0 <= correct <= n, n >= 1, "
     "got [40, 36]"),
    ("empty-run", {"runs.1": {}},
     "runs[1] has no omega_all, nor accuracy and accuracy_offline to give it"),
    ("run-missing-a-field", _drop_from_run_1("accuracy"),
     "runs[1] does not record 'accuracy', runs[0] does"),
    ("matrix-without-the-runs-matrices", _drop_from_run_1("accuracy_matrix"),
     "accuracy_matrix is [[0.9442488262910798, None"),
    ("forgetting-without-the-runs-forgetting", _drop_from_run_1("forgetting"),
     "forgetting.mean is 0.06381777905 but the runs' forgetting give None"),
    ("runs-with-different-events", _fewer_events_in_run_1,
     "runs[1] has 4 testing events, runs[0] has 5"),
    ("run-ends-before-its-stream", {"runs.1.events": [0, 1, 2, 3, 4]},
     "runs[1].events must end at the end of the stream (n_stream = 96), got 4"),
    ("runs-with-different-classes", {"runs.1.final_class_accuracy.10": 0.5},
     "runs[1].final_class_accuracy has class '10', runs[0]'s has no class '10'"),
    ("class-names-not-a-list", {"class_names": "0123456789"},
     "class_names must be a non-empty list of strings, got '0123456789'"),
    ("class-names-not-strings", {"class_names.3": 3},
     "class_names must be a non-empty list of strings, got ['0', '1', '2', 3"),
    ("class-names-too-few", {"class_names": ["a", "b"]},
     "runs[0].final_class_accuracy has class '2', which the 2 class_names do not name"),
    ("events-null", {"runs.0.events": None},
     "runs[0].events must be a list of stream positions"),
    # stored summaries are recomputed from the runs: a contradiction names both values
    ("omega-mean-contradicts-runs", {"omega_all.mean": 0.99},
     "omega_all.mean is 0.99 but the runs' omega_all give 1.686948313"),
    ("omega-std-contradicts-runs", {"omega_all.std": 0.5},
     "omega_all.std is 0.5 but the runs' omega_all give 0.07162853649"),
    ("omega-absurd", {"omega_all.mean": 1e300},
     "omega_all.mean must be <= 100 (a mean of accuracy / offline accuracy), got 1e+300"),
    ("run-omega-absurd", {"runs.1.omega_all": 1e300},
     "runs[1].omega_all must be <= 100 (a mean of accuracy / offline accuracy), got 1e+300"),
    ("std-missing-but-runs-differ", _drop_std("omega_all"),
     "omega_all.std is 0 but the runs' omega_all give 0.07162853649"),
    ("run-omega-contradicts-accuracies", {"runs.0.omega_all": 0.2},
     "runs[0].omega_all is 0.2 but its accuracy / accuracy_offline (after_base events) give "
     "1.636299289"),
    ("run-omega-over-other-events", {"runs.0.omega_events": "all"},
     "runs[0].omega_events is 'all' but omega_all.events is 'after_base'"),
    ("final-accuracy-contradicts-runs", {"final_accuracy.mean": 0.99},
     "final_accuracy.mean is 0.99 but the runs' accuracy[-1] give 0.8444444444"),
    ("final-std-contradicts-runs", {"final_accuracy.std": 0.3},
     "final_accuracy.std is 0.3 but the runs' accuracy[-1] give 0"),
    ("last-accuracy-contradicts-class-counts", {"runs.0.accuracy.4": 0.25},
     "runs[0].accuracy[4] is 0.25 but its class_counts give 0.8444444444"),
    ("forgetting-contradicts-runs", {"forgetting.mean": 0.5},
     "forgetting.mean is 0.5 but the runs' forgetting give 0.06381777905"),
    ("run-forgetting-contradicts-matrix", {"runs.0.forgetting": 0.5},
     "runs[0].forgetting is 0.5 but its accuracy_matrix gives 0.04513888889"),
    ("matrix-contradicts-runs", {"accuracy_matrix.0.0": 0.5},
     "accuracy_matrix[0][0] is 0.5 but the runs' accuracy_matrix give 0.9442488263"),
    ("run-matrix-contradicts-class-counts", {"runs.0.accuracy_matrix.0.0": 0.5},
     "runs[0].accuracy_matrix[0][0] is 0.5 but its class_counts give 0.9166666667"),
    ("class-accuracy-contradicts-class-counts", {"runs.0.final_class_accuracy.3": 0.5},
     "runs[0].final_class_accuracy['3'] is 0.5 but its class_counts give 0.7567567568"),
    ("n-test-contradicts-class-counts", {"runs.0.n_test.0": 70},
     "runs[0].n_test[0] is 70 but its class_counts give 72"),
    ("peak-memory-contradicts-runs", {"peak_memory_bytes": 1},
     "peak_memory_bytes is 1 but the runs' peak_memory_bytes give "),
    # seeds: distinct integers, one per run, each run's own
    ("seeds-repeated", _one_run_three_times,
     "seeds lists seed 0 more than once (a repeated seed repeats the same run)"),
    ("seeds-not-a-list", {"seeds": "xyz"},
     "seeds must be a list of integers >= 0, got 'xyz'"),
    ("seed-not-an-integer", {"seeds.1": "a"},
     "seeds must be a list of integers >= 0, got [0, 'a']"),
    ("seeds-fewer-than-runs", {"seeds": [0]}, "seeds must have one seed per run (2), has 1"),
    ("seeds-not-the-runs-seeds", {"seeds": [0, 5]}, "runs[1].seed is 1 but seeds[1] is 5"),
    # types and ranges of every field the report reads
    ("negative-n-train", {"n_train": -5}, "n_train must be an integer >= 1, got -5"),
    ("negative-n-test", {"n_test": -1}, "n_test must be an integer >= 1, got -1"),
    ("feature-dim-text", {"feature_dim": "abc"},
     "feature_dim must be an integer >= 1, got 'abc'"),
    ("run-n-test-text", {"runs.0.n_test": ["a", "b"]},
     "runs[0].n_test[0] must be an integer >= 1, got 'a'"),
    ("run-n-test-negative", {"runs.0.n_test": [-1, -2]},
     "runs[0].n_test[0] must be an integer >= 1, got -1"),
    ("run-n-test-above-n-test", {"runs.0.n_test.0": 361},
     "runs[0].n_test[0] must be <= n_test (360), got 361"),
    ("unknown-regime", {"regime": "sideways"},
     "regime must be one of batch, online, streaming, got 'sideways'"),
    ("regime-name-number", {"regime": {"name": 123}},
     "regime.name must be one of batch, online, streaming, got 123"),
    ("regime-batch-size-zero", {"regime.batch_size": 0},
     "regime.batch_size must be an integer >= 1, got 0"),
    ("batch-regime-single-pass", {"regime.name": "batch"},
     "violates_single_pass is false but the batch regime breaks single pass"),
    ("single-pass-method-violates", {"violates_single_pass": True},
     "violates_single_pass is true but method 'ncm' keeps single pass"),
    ("setting-an-object", {"settings.temperature": {"x": 1}},
     "settings.temperature must be a string, a finite number, true, false, null or a list of "
     "them, got {'x': 1}"),
    ("setting-beyond-64-bits", {"settings.temperature": 10 ** 30},
     "settings.temperature must be a string, a finite number, true, false, null or a list of "
     "them, got 1000000000000000000000000000000"),
    ("sweep-set-pairs", {"sweep": {"variant": "default", "set": [["a", 1]]}},
     "sweep.set must be an object, got [['a', 1]]"),
    ("sweep-set-text", {"sweep": {"variant": "default", "set": "abc"}},
     "sweep.set must be an object, got 'abc'"),
]


def _bad(good: dict, change) -> dict:
    data = copy.deepcopy(good)
    if callable(change):
        change(data)
    else:
        for where, value in change.items():
            _set(data, where, value)
    return data


def _write(folder: Path, name: str, data) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _report(folder: Path, capsys, *extra: str) -> tuple[int, str, str]:
    rc = main(["report", str(folder), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("change", "fragment"), [c[1:] for c in BAD_RESULTS],
                         ids=[c[0] for c in BAD_RESULTS])
def test_a_bad_result_is_skipped_with_a_warning_naming_the_file_and_the_field(
        change, fragment, good, tmp_path, capsys):
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    _write(folder, "bad.json", _bad(good, change))
    rc, out, err = _report(folder, capsys)
    assert rc == 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    expected = f"warning: skipped {folder}/bad.json: malformed result: {fragment}"
    assert len(lines) == 1 and lines[0].startswith(expected), lines
    report = (folder / "report.md").read_text()
    assert "1 results from" in report  # the good one, alone
    assert "Left out: bad.json: malformed result" in report


def test_a_result_that_fails_in_a_way_no_check_foresaw_is_skipped_by_name(
        good, tmp_path, capsys, monkeypatch):
    """The safety net: any exception while a result is read or classified skips that file
    with a warning naming it; the report goes on with the rest."""
    from ciosl.report import results

    real = results.make_entry

    def make_entry(data, path, *args):
        if path.name == "bad.json":
            raise RuntimeError("nobody saw this coming")
        return real(data, path, *args)

    monkeypatch.setattr(results, "make_entry", make_entry)
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    _write(folder, "bad.json", good)
    rc, out, err = _report(folder, capsys)
    assert rc == 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"warning: skipped {folder}/bad.json: malformed result (RuntimeError: "
                     "nobody saw this coming)"], lines
    assert "1 results from" in (folder / "report.md").read_text()


def test_a_method_name_in_a_result_never_imports_a_module(good, tmp_path, capsys, monkeypatch):
    """``module:Class`` is how ``ciosl run --method`` loads a learner; read from a result file
    it is only a name (importing it would run code the results folder chose)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "planted_module.py").write_text(
        "import pathlib\npathlib.Path('imported').write_text('yes')\n")
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    _write(folder, "named.json", {**good, "method": "planted_module:Learner"})
    rc, out, err = _report(folder, capsys)
    assert rc == 0 and not (tmp_path / "imported").exists()
    assert "2 results from" in (folder / "report.md").read_text()


def test_every_shipped_result_validates():
    """The checks refuse no result ``ciosl run`` / ``ciosl sweep`` wrote (docs/results)."""
    from ciosl.report.results import looks_like_result, result_problem

    docs = Path(__file__).resolve().parents[2] / "docs" / "results"
    checked = 0
    for path in sorted(docs.rglob("*.json")):
        data = json.loads(path.read_text())
        if looks_like_result(data):
            assert result_problem(data) is None, path
            checked += 1
    assert checked >= 100


def test_a_real_result_validates(good):
    """The model of every bad result is itself good, and so are the same result written over
    every event (``--omega-events all``) and cut to a single run."""
    from ciosl.evaluation.metrics import mean_std, omega_all
    from ciosl.report.results import result_problem

    assert result_problem(good) is None
    every = copy.deepcopy(good)
    for run in every["runs"]:
        run["omega_all"] = omega_all(run["accuracy"], run["accuracy_offline"], events="all")
        run["omega_events"] = "all"
    mean, std = mean_std([run["omega_all"] for run in every["runs"]])
    every["omega_all"] = {"mean": mean, "std": std, "events": "all"}
    assert result_problem(every) is None
    single = copy.deepcopy(good)
    del single["runs"][1:], single["seeds"][1:]
    run = single["runs"][0]
    single["omega_all"].update(mean=run["omega_all"], std=0.0)
    single["final_accuracy"] = {"mean": run["accuracy"][-1], "std": 0.0}
    for key in ("forgetting", "backward_transfer"):
        single[key] = {"mean": run[key], "std": 0.0}
    single.update(accuracy_matrix=run["accuracy_matrix"],
                  peak_memory_bytes=run["peak_memory_bytes"],
                  samples_per_second=run["samples_per_second"])
    assert result_problem(single) is None


# (kind, content of x.json next to a good result, the warning's fragment)
UNREADABLE = [
    ("nested-beyond-the-parser", "[" * 100_000 + "]" * 100_000,
     "not valid JSON (nested too deeply)"),
    ("fifo", None, "unreadable (not a regular file (a FIFO (named pipe)))"),
]


def _alarm(signum, frame):
    raise TimeoutError("ciosl report blocked on a file")


@pytest.mark.parametrize(("content", "fragment"), [c[1:] for c in UNREADABLE],
                         ids=[c[0] for c in UNREADABLE])
def test_a_file_that_cannot_be_read_is_skipped_without_a_crash_or_a_hang(
        content, fragment, good, tmp_path, capsys):
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    if content is None:
        os.mkfifo(folder / "x.json")
    else:
        _write(folder, "x.json", content)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(300)  # a hang guard (a FIFO read blocks forever), not a speed check
    try:
        rc, out, err = _report(folder, capsys)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert rc == 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"warning: skipped {folder}/x.json: {fragment}"], lines


def test_a_folder_of_only_unreadable_results_says_why_in_its_one_line(good, tmp_path, capsys):
    """No result could be read: the error names the first file skipped and the reason."""
    folder = tmp_path / "results"
    _write(folder, "a.json", {**good, "runs": 3})
    os.mkfifo(folder / "b.json")
    rc, out, err = _report(folder, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: no result JSONs (from `ciosl run` or `ciosl sweep`) "
                               f"under {folder}; skipped a.json: malformed result: "), lines
    assert lines[0].endswith(" (and 1 more)"), lines


LONG = "m" * 20_000


# (kind, result fields, text that must not appear raw in any output, text that shows the
# result was used, escaped, in report.md)
NAMES = [
    ("script-method", {"method": "<script>alert(1)</script>"}, "<script>",
     r"\<script\>alert(1)\</script\>"),
    ("img-onerror-dataset", {"dataset": "<img src=x onerror=alert(1)>"},
     "<img src=x onerror=alert(1)>",
     r"\<img src=x onerror=alert(1)\>"),
    ("markdown-link-method", {"method": "[click](javascript:alert(1))"}, "[click](",
     r"\[click\](javascript:alert(1))"),
    ("pipe-method", {"method": "a|b"}, "| a|b |", r"a\|b"),
    ("escape-sequence-method", {"method": "evil\x1b[2J\x1b[31mred"}, "\x1b", "x1b"),
    ("newline-method", {"method": "two\nlines"}, "two\nlines", r"two\\nlines"),
    ("mathtext-method", {"method": "$\\undefined$"}, "| $", r"\$\\undefined\$"),
    ("mathtext-dataset", {"dataset": "$x^{$"}, "· $x", r"\$x^{\$"),
    ("20000-character-method", {"method": LONG}, LONG, "m" * 59 + "…"),
    ("20000-character-dataset", {"dataset": LONG}, LONG, "m" * 39 + "…"),
]


MARKDOWN_ONLY = {"pipe-method"}  # a pipe is plain text in HTML


NAME_CASES = [(fmt, *c[1:]) for c in NAMES for fmt in ("md", "html")
              if fmt == "md" or c[0] not in MARKDOWN_ONLY]


@pytest.mark.parametrize(("fmt", "fields", "raw", "shown"), NAME_CASES,
                         ids=[f"{fmt}-{c[0]}" for c in NAMES for fmt in ("md", "html")
                              if fmt == "md" or c[0] not in MARKDOWN_ONLY])
def test_a_name_from_a_result_is_escaped_in_every_output_and_never_fails_the_report(
        fmt, fields, raw, shown, good, tmp_path, capsys):
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    _write(folder, "named.json", {**good, **fields})
    rc, out, err = _report(folder, capsys, "--format", fmt)
    assert rc == 0 and "Traceback" not in err and "error" not in err, err
    assert raw not in out and raw not in err  # the terminal
    assert "\x1b" not in out + err
    text = (folder / f"report.{fmt}").read_text()
    assert "2 results from" in text  # the named result is used, not dropped
    assert "\x1b" not in text and LONG not in text
    if fmt == "md":
        assert raw not in text and shown in text
        assert all(len(p.name) < 255 for p in (folder / "figures").iterdir())
    else:  # HTML escapes markup; $, | and [ are plain text there
        assert "<script>alert" not in text and "<img src=x" not in text


def test_a_result_nested_deeply_but_within_the_parser_renders_in_html(good, tmp_path, capsys):
    """Nesting the parser accepts but the HTML's settings dump would recurse on: refused as a
    result, named, before any output is made."""
    folder = tmp_path / "results"
    _write(folder, "good.json", good)
    _write(folder, "deep.json", {**good, "sweep": _nested(600)})
    rc, out, err = _report(folder, capsys, "--format", "html")
    assert rc == 0 and "Traceback" not in err
    assert err.startswith(f"warning: skipped {folder}/deep.json: malformed result: sweep.x.x")
    assert "is nested more than 16 levels deep" in err


WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "<b>nine|x</b>"]


def test_a_result_records_its_class_names(good):
    assert good["class_names"] == [str(k) for k in range(10)]  # digits: label k is named "k"


def test_the_class_table_names_each_class_where_the_results_agree(good, tmp_path, capsys):
    """Per-class columns say which class they are (``class_names``), escaped like every name
    from a result; a result written before ciosl recorded the names keeps the labels."""
    folder = tmp_path / "named"
    _write(folder, "a.json", {**good, "class_names": WORDS})
    rc, out, err = _report(folder, capsys)
    assert rc == 0 and not err.strip(), err
    md = (folder / "report.md").read_text()
    assert "| class · 3 three |" in md and r"class · 9 \<b\>nine\|x\</b\>" in md
    rc, out, err = _report(folder, capsys, "--format", "html")
    html = (folder / "report.html").read_text()
    assert rc == 0 and "<th>3 three</th>" in html and "<b>nine" not in html
    assert "&lt;b&gt;nine|x&lt;/b&gt;" in html
    _write(folder, "a.json", {k: v for k, v in good.items() if k != "class_names"})
    rc, out, err = _report(folder, capsys)
    md = (folder / "report.md").read_text()
    assert rc == 0 and "| class · 3 |" in md and "three" not in md


def test_class_names_are_used_only_where_every_result_of_the_column_agrees(good, tmp_path):
    from ciosl.report.results import make_entry
    from ciosl.report.tables import _class_label, _class_names

    def entry(names: list[str] | None):
        path = _write(tmp_path, "r.json", good)
        data = {k: v for k, v in good.items() if k != "class_names"}
        return make_entry(data if names is None else {**data, "class_names": names}, path)

    same = entry(WORDS)
    assert _class_names([same, None, entry(WORDS)]) == WORDS
    assert _class_names([same, entry(WORDS[::-1])]) is None  # they disagree
    assert _class_names([same, entry(None)]) is None  # an older result names none
    assert _class_names([None]) is None
    assert _class_label("3", WORDS) == "3 three" and _class_label("3", None) == "3"
    assert _class_label("3", [str(k) for k in range(10)]) == "3"  # the name says nothing more
    assert _class_label("12", WORDS) == "12" and _class_label("x", WORDS) == "x"
