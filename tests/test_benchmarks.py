"""The benchmarks run and print their figures (at tiny sizes: timings are not asserted here,
only that each benchmark still works after the code it measures has changed)."""

from __future__ import annotations

import json
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
    # figures only: how they compare depends on the machine's load, not on the code
    assert all(isinstance(t, float) and 0 < t < float("inf") for t in (step, products))
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


def test_long_stream_reports_drift_and_a_resumed_run_is_the_run(tmp_path):
    """long_stream.py on its synthetic source: accuracy, time, state and the Bayesian head's
    diagnostics at each point; stopped at 1,000 and resumed from its checkpoint, it writes
    the same figures as the run straight through (the stream is a function of the seed and
    the position, and the learner's state is whole)."""
    common = ("--source", "synthetic", "--dim", "8", "--classes", "4", "--arrival", "300",
              "--report-at", "1000,2000")
    straight, resumed, ckpt = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "b.ckpt"
    lines = run("long_stream.py", *common, "--samples", "2000", "--out", str(straight),
                cache=tmp_path)
    rows = [line.split() for line in lines if line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1000", "2000"], lines
    assert "dead_l1" in lines[-2] and "data_share_l1" in lines[-2]
    run("long_stream.py", *common, "--samples", "1000", "--out", str(resumed), "--checkpoint",
        str(ckpt), cache=tmp_path)
    lines = run("long_stream.py", *common, "--samples", "2000", "--out", str(resumed),
                "--checkpoint", str(ckpt), "--resume", cache=tmp_path)
    assert lines[0] == "resumed at 1000 stream samples"
    a, b = (json.loads(p.read_text())["points"] for p in (straight, resumed))
    assert [r["samples"] for r in b] == [1000, 2000]
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            if key not in ("ms_per_sample", "state_mib"):
                assert ra[key] == rb[key], key


def test_long_stream_table_reads_each_run_where_it_stopped(tmp_path):
    """long_stream_table.py: one row per result, the accuracy at each point reached, the last
    point against 100k, and a run that stopped short of its length marked as such."""
    def write(name, samples, accs, settings):
        points = [{"samples": n, "accuracy": a, "ms_per_sample": 2.0, "state_mib": 1.0}
                  for n, a in accs]
        (tmp_path / name).write_text(json.dumps({
            "method": "ciosl", "source": "real", "seed": 0, "settings": settings,
            "samples": samples, "first_pass": 10, "dim": 8, "points": points}))

    write("a.json", 1_000_000, [(100_000, 0.80), (250_000, 0.75)], ["precision_floor=none"])
    write("b.json", 250_000, [(10_000, 0.5), (100_000, 0.80), (250_000, 0.81)], [])
    lines = run("long_stream_table.py", str(tmp_path), cache=tmp_path)
    assert len(lines) == 4, lines
    by = {line.split("|")[3].strip(): [c.strip() for c in line.split("|")] for line in lines[2:]}
    assert by["precision_floor=none"][10] == "250k (of 1M)"
    assert by["precision_floor=none"][11] == "-0.0500"
    assert by["defaults"][4] == "0.5000" and by["defaults"][10] == "250k"
    assert by["defaults"][11] == "+0.0100"


def test_metrics_time_times_the_per_event_metrics(tmp_path):
    (line,) = run("metrics_time.py", "--classes", "200", "--repeat", "2", cache=tmp_path)
    assert re.fullmatch(r"per-event metrics of 200 classes \(3 events, the accuracy matrix, "
                        r"40 class steps\): [\d.]+ s \(median of 2\)", line), line


def test_extract_time_compares_ciosl_with_onnxruntime(tmp_path):
    lines = run("extract_time.py", "--cases", "efficientnet_lite0@24,mobilenet_v2@24",
                "--images", "4", "--reps", "1", "--threads", "1", "--cache", str(tmp_path),
                cache=tmp_path)
    cases = [line for line in lines if " thread(s), " in line]
    assert [c.split()[0] for c in cases] == ["efficientnet_lite0@24", "mobilenet_v2@24"]
    for case in cases:  # each path's rate, GFLOP/s and distance from the torch reference
        diffs = [float(d) for d in re.findall(r"max \|diff\| ([0-9.e+-]+)", case)]
        scale = float(re.search(r"max \|feature\| ([0-9.e+-]+)", case).group(1))
        assert len(diffs) == 3 and diffs[0] == 0.0 and max(diffs) <= 1e-4 * max(1.0, scale)
        assert len(re.findall(r"[0-9.]+ images/s [0-9.]+ GFLOP/s", case)) == 3
    last = re.fullmatch(r"extraction/onnxruntime images/s ratio: ([0-9.]+)", lines[-1])
    assert last and float(last.group(1)) > 0
    assert list((tmp_path / "onnx").glob("*.onnx"))  # the export went to the given cache


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
    prof = run("scale.py", "--methods", "ewc", "--mlp-classes", "12", "--dim", "8", "--profile",
               cache=tmp_path)
    heads = [i for i, line in enumerate(prof) if line.startswith("=====")]
    assert [prof[i] for i in heads] == [
        "===== ewc, 60 known-class samples after 12 classes",
        "===== ewc, 60 new-class samples after 12 classes"], prof
    assert any("learners/ewc.py" in line for line in prof[heads[1]:]), prof
    sizes = run("scale.py", "--methods", "ncm,ewc", "--sizes", "3,9", "--dim", "8",
                cache=tmp_path)
    rows = {line.split()[0]: line for line in sizes if line.startswith(("ncm ", "ewc "))}
    assert set(rows) == {"ncm", "ewc"}, sizes
    assert all(re.search(r" 3: [\d.]+  9: [\d.]+$", line) for line in rows.values()), sizes
    path = tmp_path / "f.npz"
    run("scale.py", "--write-features", str(path), "--classes", "7", "--dim", "3", cache=tmp_path)
    from ciosl.data.datasets import load_features

    ds = load_features(path)
    assert ds.n_classes == 7 and ds.train_x.shape == (14, 3) and ds.test_x.shape == (7, 3)


def test_digests_compares_two_runs(tmp_path):
    """digests.py: the same code gives the same digests (deterministic), and --compare names
    the first call that differs when they do not."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        run("digests.py", str(path), "--methods", "ewc,ncm", "--samples", "70", cache=tmp_path)
    lines = run("digests.py", "--compare", str(a), str(b), cache=tmp_path)
    assert len(lines) == 12 and all(line.endswith(": equal") for line in lines), lines
    data = json.loads(b.read_text())
    key = next(k for k in data if k.startswith("ewc {'refresh_every': 1}"))
    data[key][3] = "0" * 64
    b.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, str(BENCH / "digests.py"), "--compare", str(a), str(b)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and f"{key}: differs from call 3" in out.stdout, out.stdout


def test_serve_load_prints_rates_latencies_and_recovery(tmp_path):
    lines = run("serve_load.py", "--methods", "ncm", "--dim", "8", "--classes", "3",
                "--batch", "4", "--seconds", "0.5", "--recover-samples", "40", cache=tmp_path)
    assert re.match(r"ncm +learn batch 4: served +\d+ samples/s, in process +\d+ -> ratio "
                    r"[\d.]+ \| predict 8 rows: idle .* p99 ratio [\d.]+ \| fsync [\d.]+ ms",
                    lines[0]), lines
    found = re.match(r"ncm +recovery of (\d+) samples \((\d+) records, d=8\): replay [\d.]+ s",
                     lines[1])
    assert found and int(found[1]) >= 40 and int(found[2]) == int(found[1]) // 4, lines


def test_faults_counts_injections_per_call(tmp_path):
    lines = run("faults.py", "--methods", "ncm,finetune", "--points", "3", cache=tmp_path)
    rows = {}
    for line in lines[1:-1]:
        m = re.fullmatch(r"(\w+) +(learn_one known|learn_one new|learn_many new|fit_base) +"
                         r"(\d+) +(\d+) +(\d+) +(\d+)", line)
        assert m, line
        rows[m[1], m[2]] = [int(v) for v in m.groups()[2:]]
    assert len(rows) == 8, lines
    for (method, call), (ops, tried, changed, later) in rows.items():
        assert tried <= min(ops, 3) and changed <= tried and later <= tried, (method, call)
    # a new-class step keeps an undo record: a fault anywhere in it changes nothing
    assert rows["finetune", "learn_one new"][1] == 3 and rows["finetune", "learn_one new"][2] == 0
    assert re.fullmatch(r"total +\d+ +\d+ +\d+", lines[-1])


def test_folder_extraction_compares_a_folder_with_memory(tmp_path):
    lines = run("folder_extraction.py", "--images", "12", "--side", "40", "--size", "32",
                "--reps", "1", "--threads", "1", cache=tmp_path)
    rates = [line for line in lines if line.strip().endswith("images/s")]
    assert [r.split()[0] for r in rates] == ["memory", "folder", "folder+verify"]
    assert "feature difference: 0.00e+00" in lines[-3]  # the same features either way
    last = re.fullmatch(r"folder/memory images/s ratio: ([0-9.]+)", lines[-1])
    assert last and float(last.group(1)) > 0


def test_onnx_check_times_the_export_its_hashes_and_the_probe(tmp_path):
    lines = run("onnx_check.py", "--cases", "efficientnet_lite0@24", "--reps", "1",
                cache=tmp_path)
    assert len(lines) == 1 and re.fullmatch(r"efficientnet_lite0@24: export [\d.]+ s, producer "
                                            r"[\d.]+ s, probe check [\d.]+ s", lines[0]), lines


def test_anytime_prints_prediction_times_and_drift(tmp_path):
    lines = run("anytime.py", "--dim", "16", "--samples", "60", "--classes", "3", "--rows", "5",
                "--rounds", "3", "--proj-dim", "32", cache=tmp_path)
    rows = [line for line in lines if line.startswith("| ") and "ms" in line]
    assert [r.split(" | ")[0] for r in rows] == ["| ncm", "| slda", "| rp_lda", "| ranpac",
                                              "| acil"]
    assert all(re.search(r"\| x[\d.]+ \|", r) for r in rows), rows
    lines = run("anytime.py", "--drift", "120", "--check-every", "50", "--dim", "32",
                "--classes", "3", "--methods", "slda", cache=tmp_path)
    checks = [line for line in lines if "corrections on the anchor" in line]
    assert len(checks) >= 1
    worst = re.fullmatch(r"slda: worst W relative error ([\d.e+-]+) over 120 samples \(d = 32, "
                         r"8 corrections at most\)", lines[-1])
    assert worst and float(worst[1]) < 1e-9, lines


def test_anytime_drift_compares_the_kept_answer_with_a_fresh_solve(tmp_path):
    lines = run("anytime_drift.py", "--source", "synthetic", "--dim", "48", "--samples", "2000",
                "--checks", "2", "--rows", "100", cache=tmp_path)
    rows = [line for line in lines if re.match(r"\| [\d,]+ \| 12 \|", line)]
    assert rows, lines
    worst = re.fullmatch(r"worst: predict_proba ([\d.e+-]+), precision action \(relative\) "
                         r"([\d.e+-]+), W \(relative\) ([\d.e+-]+); \d+ s", lines[-1])
    assert worst and max(float(v) for v in worst.groups()) < 1e-9, lines
