"""The README's deployment example runs as written, in two processes (learn + save, restart +
load + continue)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_deployment_example_runs_across_a_restart(tmp_path):
    blocks = re.findall(r"```python\n(# process \d.*?)```", README.read_text(), re.S)
    assert len(blocks) == 2
    outputs = []
    for code in blocks:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip().splitlines())
    assert (tmp_path / "robot.ciosl").exists()
    # process 1 answers over every object seen so far, correctly at the end of each object
    assert outputs[0][-1] == "800 ['cup' 'ball' 'shoe' 'book']"
    # process 2 continued the loaded learner: it knows all five objects and recognizes them
    assert outputs[1] == ["['cup', 'ball', 'shoe', 'book', 'phone'] "
                          "['cup' 'ball' 'shoe' 'book' 'phone']"]
