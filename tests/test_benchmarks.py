"""The benchmarks run and print their figures (at tiny sizes: timings are not asserted here,
only that each benchmark still works after the code it measures has changed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *args: str, cache: Path) -> list[str]:
    """The benchmark's printed lines (its feature cache: ``cache``, not the user's)."""
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                         text=True, timeout=600, env={**os.environ, "CIOSL_CACHE": str(cache)})
    assert out.returncode == 0, out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def step_time():
    sys.path.insert(0, str(BENCH))
    try:
        import step_time as module
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_step_time_times_a_step_against_its_products(step_time):
    step, products = step_time.step_time(16, products=step_time.products_fn(16), block=10)
    assert 0 < products < step < 1.0  # seconds; a step does more than its products
    assert set(step_time.floor_time(16)) == {"noise", "variances", "KL gradient", "norm", "SGD"}


def test_stream_time_times_a_whole_stream(tmp_path):
    lines = run("stream_time.py", "--dataset", "digits", "--limit", "30", cache=tmp_path)
    first = re.fullmatch(r"ciosl on digits class_iid \(seed 0, d = 64\): base init of (\d+) "
                         r"samples [\d.]+ s; 30 of (\d+) stream samples learned in [\d.]+ s, "
                         r"median [\d.]+ ms per sample", lines[0])
    assert first, lines
    from ciosl.data.datasets import load_digits

    n_stream = int(first[2])
    assert int(first[1]) + n_stream == len(load_digits().train_y)  # base + stream: the split
    assert re.fullmatch(rf"stream of {n_stream} samples: [\d.]+ min \(extrapolated from the "
                        r"samples learned\)", lines[-1]), lines


def test_soak_reports_memory_and_load_corrected_time(tmp_path):
    lines = run("soak.py", "--samples", "2000", "--dim", "8", "--classes", "4", "--arrival",
                "400", "--report-at", "1000,2000", "--window", "500", cache=tmp_path)
    rows = [line.split() for line in lines if line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1000", "2000"] and all(len(r) == 7 for r in rows)
    assert all(float(r[1]) > 0 and 0 <= float(r[6]) <= 1 for r in rows)  # RSS, accuracy
    assert re.fullmatch(r"load-corrected time per sample, last report / first report: [\d.]+",
                        lines[-1])


def test_scale_times_new_and_known_classes(tmp_path):
    lines = run("scale.py", "--methods", "ncm,slda,finetune", "--classes", "40",
                "--mlp-classes", "20", "--dim", "8", cache=tmp_path)
    rows = {line.split()[0]: line for line in lines if " classes: new " in line}
    assert set(rows) == {"ncm", "slda", "finetune"}, lines
    assert re.search(r"^ncm +40 classes: new +[\d.]+ ms -> +[\d.]+ ms \(growth x[\d.]+\); known "
                     r"+[\d.]+ ms; new/known [\d.]+", rows["ncm"])
    assert "arithmetic" in rows["finetune"] and "arithmetic" not in rows["slda"]
    many = [line for line in lines if "learn_many(10) / 10 x learn_one" in line]
    assert len(many) == 3 and all(re.search(r"per sample: [\d.]+$", m) for m in many)
    path = tmp_path / "f.npz"
    run("scale.py", "--write-features", str(path), "--classes", "7", "--dim", "3", cache=tmp_path)
    from ciosl.data.datasets import load_features

    ds = load_features(path)
    assert ds.n_classes == 7 and ds.train_x.shape == (14, 3) and ds.test_x.shape == (7, 3)
