"""``ciosl report``'s output files: a report never replaces a file that is no report (a result, a
grid, a FIFO or a device), and replaces an earlier report, of this version or an older one; a
folder whose only results were run with ``--no-offline`` gets a report of what they have."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import (
    cli,
    make_fifo,
    one_line_error,
    run_args,
)

# ---------------------------------------------------------------------------- the report's --out


@pytest.fixture
def results(tmp_path, capsys) -> Path:
    assert cli(capsys, run_args(tmp_path))[0] == 0
    return tmp_path / "out"


def test_a_report_never_replaces_a_file_that_is_no_report(results, tmp_path, capsys):
    (result,) = results.glob("*.json")
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n')
    for target, fmt in ((result, "html"), (grid, "md")):
        before = target.read_bytes()
        line = one_line_error(*cli(capsys, ["report", str(results), "--format", fmt, "--out",
                                            str(target)]))
        assert line == (f"error: --out {target}: holds a file that is not a ciosl report: "
                        "refused to replace it; choose another --out, or delete it first")
        assert target.read_bytes() == before


def test_a_report_replaces_an_earlier_report(results, tmp_path, capsys):
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        assert cli(capsys, ["report", str(results), "--format", fmt, "--out", str(out)])[0] == 0
        out.write_text(out.read_text() + "\nan old line\n")
        assert cli(capsys, ["report", str(results), "--format", fmt, "--out", str(out)])[0] == 0
        assert "an old line" not in out.read_text()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_report_onto_a_fifo_or_a_device_is_refused_before_drawing(results, tmp_path, capsys,
                                                                   kind):
    target = make_fifo(tmp_path, "f") if kind == "fifo" else Path("/dev/null")
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    line = one_line_error(*cli(capsys, ["report", str(results), "--out", str(target)]))
    assert line == f"error: --out {target}: not a regular file ({what}): refused to replace it"
    assert not (tmp_path / "figures").exists()
    assert kind == "device" or target.is_fifo()


def test_a_report_of_an_earlier_version_is_still_replaced(results, tmp_path, capsys):
    """A demo folder's report.html from before the generator tag: `make demo` rewrites it."""
    out = tmp_path / "old.html"
    assert cli(capsys, ["report", str(results), "--format", "html", "--out", str(out)])[0] == 0
    out.write_text(out.read_text().replace('<meta name="generator" content="ciosl report">', ""))
    assert cli(capsys, ["report", str(results), "--format", "html", "--out", str(out)])[0] == 0
    assert '<meta name="generator" content="ciosl report">' in out.read_text()


# ---------------------------------------------------------------------------- --no-offline only

NO_OFFLINE_CASES = [  # (format, methods run with --no-offline into one folder)
    ("md-one-method", "md", ["ncm"]),
    ("html-two-methods", "html", ["ncm", "slda"]),
]


@pytest.mark.parametrize(("fmt", "methods"), [c[1:] for c in NO_OFFLINE_CASES],
                         ids=[c[0] for c in NO_OFFLINE_CASES])
def test_a_folder_of_no_offline_results_gets_a_report_of_what_they_have(fmt, methods, tmp_path,
                                                                        capsys):
    import html
    import json
    import re

    from ciosl.cli import main

    for method in methods:
        argv = ["run", "--dataset", "digits", "--limit-per-class", "12", "--quiet", "--runs", "2",
                "--no-offline", "--method", method, "--cache", str(tmp_path / "cache"),
                "--out", str(tmp_path / "out")]
        assert main(argv) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "out"), "--format", fmt]) == 0
    out, err = capsys.readouterr()
    text = html.unescape((tmp_path / "out" / f"report.{fmt}").read_text())
    n = len(methods)
    line = (f"Omega_all needs the offline reference: {n} result{'s' * (n > 1)} here "
            f"{'were' if n > 1 else 'was'} run with --no-offline")
    assert line in text and line in err and "Traceback" not in err
    assert "Results without the offline reference" in text and "skipped" not in err
    for path in sorted((tmp_path / "out").glob("*.json")):
        result = json.loads(path.read_text())
        final, forgetting = result["final_accuracy"], result["forgetting"]
        row = f"| 2 | {final['mean']:.4f} ± {final['std']:.4f} | {forgetting['mean']:.4f} ± "
        assert row in out  # the table on the console
        assert f"Accuracy matrix: {'NCM' if 'ncm' in path.name else 'Deep SLDA'}" in text
        last = [f"{a:.4f}" for a in result["accuracy_matrix"][-1]]
        assert re.search(r"\D+".join(map(re.escape, last)), text)  # its last row, in order
    assert f"{n} result{'s' * (n > 1)}, {n + 1} tables" in out  # the summary, one matrix each
