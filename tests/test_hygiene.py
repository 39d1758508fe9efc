"""Project hygiene: ruff passes on the whole repository (CI runs it too: .ci/run), the LICENSE
file is the license pyproject declares."""

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
