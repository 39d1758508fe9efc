"""``ciosl run --max-events N`` and ``--no-offline``: the options that let a stream of many
classes (issue 34: 100,000) run end to end, on a 300-class features file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.data.orderings import make_ordering
from ciosl.report.build import write_report
from ciosl.report.results import load_entries


def features(tmp_path, n_classes=300, per_class=2, dim=8):
    rng = np.random.default_rng(5)
    centres = rng.normal(0, 1, (n_classes, dim)).astype(np.float32)
    ytr, yte = np.repeat(np.arange(n_classes), per_class), np.arange(n_classes)
    noise = 0.1 * rng.normal(size=(len(ytr) + len(yte), dim)).astype(np.float32)
    path = tmp_path / "f300.npz"
    np.savez(path, train_z=centres[ytr] + noise[:len(ytr)], train_y=ytr,
             test_z=centres[yte] + noise[len(ytr):], test_y=yte)
    return path


def run(tmp_path, capsys, *extra, method="ncm"):
    code = main(["run", "--dataset", f"features:{features(tmp_path)}", "--method", method,
                 "--seeds", "0", "--quiet", "--out", str(tmp_path / "out"),
                 "--cache", str(tmp_path / "c"), *extra])
    return code, capsys.readouterr()


@pytest.mark.parametrize("kind", ["class_iid", "iid"])
def test_bounded_events_are_evenly_spaced_and_the_stream_is_unchanged(kind):
    y = np.repeat(np.arange(300), 2)
    full = make_ordering(kind, y, seed=3, base_fraction=0.02, classes_per_step=2)
    few = make_ordering(kind, y, seed=3, base_fraction=0.02, classes_per_step=2, max_events=7)
    assert np.array_equal(full.stream, few.stream) and np.array_equal(full.base, few.base)
    assert len(full.events) == 150 and len(few.events) == 7
    assert few.events[0] == 0 and few.events[-1] == len(few.stream)
    if kind == "class_iid":  # every class step is 4 samples: the kept steps 0, 25, ..., 149
        kept = np.linspace(0, 149, 7).round().astype(int)
        assert np.array_equal(few.events, full.events[kept])
        assert few.event_classes == tuple(full.event_classes[t] for t in kept)
    else:
        gaps = np.diff(few.events)
        assert gaps.max() - gaps.min() <= 1  # evenly spaced positions
    same = make_ordering(kind, y, seed=3, base_fraction=0.02, classes_per_step=2,
                         max_events=1000)
    assert np.array_equal(same.events, full.events) and same.event_classes == full.event_classes


def test_no_offline_result_has_no_omega_and_the_report_names_it_apart(tmp_path, capsys):
    code, out = run(tmp_path, capsys, "--max-events", "5", "--no-offline")
    assert code == 0, out.err
    assert "Omega_all      = none" in out.out
    (path,) = (tmp_path / "out").glob("*.json")
    assert "max_events=5+offline=none" in path.name
    result = json.loads(path.read_text())
    assert result["omega_all"] is None and result["protocol"]["offline_reference"] is False
    assert result["protocol"]["max_events"] == 5
    (r,) = result["runs"]
    assert r["omega_all"] is None and "accuracy_offline" not in r
    assert len(r["accuracy"]) == 5 and r["events"][-1] == r["n_stream"]
    assert r["n_test"] == [2, 76, 150, 226, 300]  # the classes seen at 5 kept steps
    assert result["final_accuracy"]["mean"] == r["accuracy"][-1] > 0.9
    # with one Omega result beside it, the report shows that one and names this one apart
    assert run(tmp_path, capsys, "--max-events", "5", "--offline-epochs", "40",
               method="slda")[0] == 0
    report = write_report(tmp_path / "out")
    assert [e.method for e in report.entries] == ["slda"]
    (left,) = report.left_out
    assert left[0] == path and "--no-offline" in left[1] and "no Omega_all" in left[1]
    text = report.path.read_text()
    assert "Left out: " + path.name in text and "max_events=5" in text


def test_a_no_offline_result_whose_omega_was_filled_in_is_malformed(tmp_path, capsys):
    assert run(tmp_path, capsys, "--max-events", "3", "--no-offline")[0] == 0
    (path,) = (tmp_path / "out").glob("*.json")
    result = json.loads(path.read_text())
    result["runs"][0]["accuracy_offline"] = [1.0, 1.0, 1.0]
    path.write_text(json.dumps(result))
    skipped = []
    assert load_entries(tmp_path / "out", left_out=skipped) == []
    ((where, why),) = skipped
    assert where == path and why.startswith("malformed result: runs[0] records an Omega_all or "
                                            "offline accuracies")


@pytest.mark.parametrize("extra, message", [
    (["--max-events", "1"], "error: --max-events must be >= 2, got 1"),
    (["--max-events", "2000000"], "error: --max-events must be <= 1000000, got 2000000"),
    (["--no-offline", "--offline-epochs", "3"],
     "error: --offline-epochs 3 and --no-offline: without an offline reference"),
])
def test_bad_values_are_refused_in_one_line_naming_the_flag(tmp_path, capsys, extra, message):
    code, out = run(tmp_path, capsys, *extra)
    assert code == 2 and out.err.startswith(message) and out.err.count("\n") == 1
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))
