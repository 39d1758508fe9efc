"""1,000 learners in one server (width 64, 10 classes each), on loopback: a bounded soak of
requests spread over all of them, with at most 40 loaded at once. Every request is answered,
every learner keeps its own classes, the number loaded stays bounded, and the listing names all
1,000. (The folders are copies of one taught learner, made before the server starts: creating
1,000 over HTTP is measured by benchmarks/serve_many.py, not here.)"""

from __future__ import annotations

import shutil
import threading

import numpy as np
from server_helpers import Server

N, DIM, CLASSES, MAX_LOADED = 1000, 64, 10, 40


def test_a_thousand_learners_soak(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 3, size=(CLASSES, DIM)).astype(np.float32)
    template = tmp_path / "template"
    with Server(template, "--method", "ncm") as s, s.client() as c:
        c.learn_many(centres, list(range(CLASSES)))
        s.stop()  # a clean stop: the snapshot holds it all
    root = tmp_path / "root"
    for i in range(N):
        shutil.copytree(template, root / "learners" / f"m{i:04d}",
                        ignore=shutil.ignore_patterns(".lock", "token"))
    picks = rng.integers(0, N, size=600)
    errors: list[str] = []
    with Server(root, "--max-loaded", str(MAX_LOADED)) as s, s.http() as h:
        assert h.get("/v1/health").json()["learners"] == N

        def work(part):
            with s.http() as hh:
                for j, i in part:
                    name = f"m{int(i):04d}"
                    k = int(i) % CLASSES
                    if j % 3 == 0:  # one request in three teaches a learner its own class
                        r = hh.post(f"/v1/learners/{name}/learn",
                                    json={"x": [(centres[k] + 50).tolist()], "y": [100 + int(i)],
                                          "id": f"{name}-{j}"})
                    else:
                        r = hh.post(f"/v1/learners/{name}/predict",
                                    json={"x": [centres[k].tolist()]})
                        if r.status_code == 200 and r.json()["label"] != [k]:
                            errors.append(f"{name}: {r.json()['label']} for {k}")
                    if r.status_code != 200:
                        errors.append(f"{name}: {r.status_code} {r.text}")
                    loaded = hh.get("/v1/health").json()["loaded"]
                    if loaded > MAX_LOADED + 4:  # + the requests in flight (4 clients)
                        errors.append(f"{loaded} loaded")

        ops = list(enumerate(picks))
        threads = [threading.Thread(target=work, args=(ops[c::4],)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:5]
        rows = h.get("/v1/learners").json()["learners"]
        assert len(rows) == N and sum(r["loaded"] for r in rows) <= MAX_LOADED + 4
        taught = {f"m{int(i):04d}" for j, i in enumerate(picks) if j % 3 == 0}
        some = sorted(taught)[:5]
        for name in some:  # reloaded if need be: its own new class, and only its own
            classes = h.get(f"/v1/learners/{name}/classes").json()["classes"]
            assert classes[:CLASSES] == list(range(CLASSES))
            assert classes[CLASSES:] == [100 + int(name[1:])]


def test_the_many_learners_benchmark_runs_and_reports_its_figures():
    """benchmarks/serve_many.py at a tiny size (its figures are not asserted: the machine's
    load decides them; only that it still runs and reports each)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_many.py"
    out = subprocess.run([sys.executable, str(script), "--learners", "12", "--max-loaded", "4",
                          "--cold", "3", "--seconds", "0.3", "--repeats", "1", "--clients", "2"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["many"]["loaded"] <= 4 and result["many"]["cold_answer_ms"]["n"] == 3
    for key in ("one_learner", "ten_learners", "learns_one", "feedback_one"):
        assert result[key]["per_s"] > 0 and result[key]["predictions"] > 0
    assert result["ten_over_one"] > 0 and result["feedback_over_learns"] > 0
