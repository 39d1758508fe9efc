"""`ciosl report` believes no result file: each is checked (ranges, lengths, order, known
values, nesting) and a bad one is skipped with one warning naming the file and the field; names
from result files are escaped in every output (Markdown, HTML, the terminal, matplotlib, file
names), so no name fails the whole report. Table-driven, in the style of test_red_team.py."""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path

import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment


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
     "runs[0].omega_all must be a finite number >= 0"),
    ("final-accuracy-above-1", {"final_accuracy.mean": 7.5},
     "final_accuracy.mean must be a number in [0, 1], got 7.5"),
    ("forgetting-out-of-range", {"forgetting.mean": 3.0},
     "forgetting.mean must be a number in [-1, 1], got 3.0"),
    ("class-accuracy-above-1", {"runs.0.final_class_accuracy.3": 2.0},
     "runs[0].final_class_accuracy['3'] must be a number in [0, 1], got 2.0"),
    ("matrix-above-1", {"accuracy_matrix.0.0": 1.5},
     "accuracy_matrix[0][0] must be a number in [0, 1], got 1.5"),
    ("unknown-ordering", {"ordering": "sideways"},
     "ordering must be one of iid, class_iid, instance, class_instance, got 'sideways'"),
    ("empty-method", {"method": " "}, "method must not be empty, got ' '"),
    ("negative-limit", {"limit_per_class": -1},
     "limit_per_class must be an integer >= 0, got -1"),
    ("negative-speed", {"runs.0.samples_per_second": -5.0},
     "runs[0].samples_per_second must be a finite number >= 0, got -5.0"),
    ("settings-not-object", {"settings": [1, 2]}, "settings has the wrong type, got [1, 2]"),
    ("nested-deep", {"settings": _nested(100)},
     "settings" + ".x" * 15 + " is nested more than 16 levels deep"),
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
    signal.alarm(60)
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
