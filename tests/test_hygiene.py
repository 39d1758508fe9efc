"""Project hygiene: ruff passes on the whole repository (CI runs it too: .ci/run), the LICENSE
file is the license pyproject declares."""

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
