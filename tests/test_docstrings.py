"""A module docstring says what the module is and the rule it follows, in at most 30 lines
(issue 48): measurements, history and long rationale go to docs/findings/ or docs/design.md."""

from __future__ import annotations

import ast
from pathlib import Path

import ciosl

ROOT = Path(ciosl.__file__).parent
MAX_LINES = 30


def _docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return len(doc.splitlines()) if doc else 0


def test_every_module_docstring_is_at_most_30_lines():
    modules = sorted(ROOT.rglob("*.py"))
    assert len(modules) > 50  # the walk finds the package
    long = {str(p.relative_to(ROOT)): n for p in modules
            if (n := _docstring_lines(p)) > MAX_LINES}
    assert not long, f"module docstrings over {MAX_LINES} lines: {long}"


def test_the_count_is_of_the_docstring_lines(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""' + "\n".join(f"line {i}" for i in range(31)) + '"""\n\nX = 1\n')
    assert _docstring_lines(path) == 31
    path.write_text("X = 1\n")
    assert _docstring_lines(path) == 0
