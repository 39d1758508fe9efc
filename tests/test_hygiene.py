"""Project hygiene: ruff passes on the whole repository (CI runs it too: .ci/run), the LICENSE
file is the license pyproject declares, no source file or README grows past its size, and every
test file runs alone."""

import ast
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes_on_the_whole_repository():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make lint" in (ROOT / ".ci" / "run").read_text()


def test_license_file_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "MIT"}
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    extras = project["optional-dependencies"]["dev"]
    assert any(d.startswith("ruff") for d in extras) and any(d.startswith("river") for d in extras)


def test_the_demo_installs_no_extras_and_dev_keeps_the_onnx_extra():
    """`make demo` installs torch and the package alone (README's first command; issue 48: its
    install is most of its time); onnx/onnxruntime (the [onnx] extra) and the tests' tools stay
    out of it, and `make test` (.ci/run) still gets them through [dev]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert extras["onnx"] == ["onnx>=1.15", "onnxruntime>=1.17"]
    assert set(extras["onnx"]) <= set(extras["dev"])
    for extra in ("onnx", "dev"):
        for d in extras[extra]:
            assert re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].lower() not in names, d
    recipes = {}
    target = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if re.match(r"^[\w-]+:", line):
            target = line.split(":")[0]
            recipes[target] = [line]
        elif target and line.startswith("\t"):
            recipes[target].append(line.strip())
    demo, todo = [], ["install-demo"]  # its recipe and its prerequisites'
    while todo:
        head, *lines = recipes[todo.pop()]
        demo += lines
        todo += [t for t in head.split(":", 1)[1].split() if t in recipes]
    demo_installs = [line for line in demo if " install " in line]
    assert any(re.search(r"\$\(PIP\) install .*\$\(TORCH\)$", line) for line in demo_installs)
    assert any(re.search(r"\$\(PIP\) install .*-e \.(\s|$)", line) for line in demo_installs)
    assert not any("[" in line for line in demo_installs), demo_installs  # no extras
    assert "install-demo" in recipes["demo"][0] and "install " in recipes["test"][0] + " "
    assert any('-e ".[dev]"' in line for line in recipes["install"])
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^TORCH = torch==2\.13\.0$", (ROOT / "Makefile").read_text(), re.M)


# ------------------------------------------------------------------ sizes (issues 28, 37, 60)

MAX_SOURCE_LINES = 600  # a source file past this is split by what its parts do
MAX_README_LINES = 350  # the README is a user guide; detail lives in docs/


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def test_no_source_file_is_over_600_lines():
    """Every file under src/, none exempt (issue 60: four had slipped to 614-806 lines with no
    test to say so)."""
    files = [p for p in (ROOT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 50 and _lines(ROOT / "src" / "ciosl" / "learners" / "base.py") > 100
    over = {str(p.relative_to(ROOT)): n for p in files if (n := _lines(p)) > MAX_SOURCE_LINES}
    assert over == {}, f"over {MAX_SOURCE_LINES} lines: {over}"


def test_the_readme_is_at_most_350_lines():
    assert 100 < _lines(ROOT / "README.md") <= MAX_README_LINES, _lines(ROOT / "README.md")


# ------------------------------------------------------------------ every test file runs alone


def _local_imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports anywhere in ``path`` (in functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


def test_no_test_file_imports_another_test_module():
    """A test file runs alone (`python -m pytest tests/test_naming.py`): it imports no test
    module (issue 60: test_naming.py imported test_datasets, found only when tests/data had
    been collected first), and a helper module only from tests/ (on pytest's pythonpath) or
    from its own folder (put there on sys.path when the file is collected)."""
    tests = ROOT / "tests"
    modules = {p.stem: p.parent for p in tests.rglob("*.py") if "__pycache__" not in p.parts}
    assert {"helpers", "test_naming", "server_helpers"} <= set(modules)
    wrong = []
    for path in sorted(tests.rglob("*.py")):
        for name in sorted(_local_imports(path) & set(modules)):
            if name.startswith("test_") or modules[name] not in (tests, path.parent):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert wrong == [], wrong


def test_test_file_names_are_unique_across_folders():
    """pytest imports test files by their basename (no packages under tests/): two files of one
    name in two folders stop the whole suite at collection ("import file mismatch"), which a
    run of one folder does not show (tests/serve/test_learners.py beside
    tests/learners/test_learners.py did)."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "__pycache__" not in path.parts and path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
