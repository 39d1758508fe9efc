"""``ciosl report``'s output files: a report never replaces a file that is no report (a result, a
grid, a FIFO or a device), and replaces an earlier report, of this version or an older one."""

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
