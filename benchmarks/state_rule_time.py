"""Two versions of ciosl in one process, in alternating blocks of learn_one calls: the median
known-class step of each, the new-class step against the known one, and the ratio of the two
versions' known-class steps (issue 48: the state rule against the code before it).

The other version is a copy of an older checkout's src/ciosl renamed ciosl_old:

    git worktree add /tmp/before b8bab14
    mkdir -p /tmp/oldpkg && cp -r /tmp/before/src/ciosl /tmp/oldpkg/ciosl_old
    grep -rl "ciosl\\." /tmp/oldpkg/ciosl_old | xargs sed -i \
        's/\\bfrom ciosl\\./from ciosl_old./g; s/\\bimport ciosl\\./import ciosl_old./g; s/\\bfrom ciosl import/from ciosl_old import/g'
    python benchmarks/state_rule_time.py ciosl 1280 --old /tmp/oldpkg
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("method", nargs="?", default="ciosl")
ap.add_argument("dim", nargs="?", type=int, default=1280)
ap.add_argument("--old", default="/tmp/oldpkg", help="folder holding the package ciosl_old")
a = ap.parse_args()
sys.path.insert(0, a.old)
torch.set_num_threads(1)
import ciosl_old.learners as OL  # noqa: E402

import ciosl.learners as NL  # noqa: E402

method, d = a.method, a.dim
rng = np.random.default_rng(0)
n_cls = 10
Z = rng.normal(size=(4000, d)).astype(np.float32)
y = rng.integers(0, n_cls, 4000)
Zb, yb = Z[:400], y[:400] % 8
learners = {}
for tag, mod in (("old", OL), ("new", NL)):
    learner = mod.make_learner(method, base_epochs=1)
    learner.fit_base(Zb, yb.tolist())
    for i in range(400, 1500):
        learner.learn_one(Z[i], int(y[i]))
    learners[tag] = learner
times: dict = {(v, k): [] for v in ("old", "new") for k in ("known", "new")}
i = 1500
for block in range(12):  # alternating blocks: the machine's drift falls on both alike
    for tag in (("old", "new") if block % 2 == 0 else ("new", "old")):
        learner = learners[tag]
        for j in range(20):
            t = time.perf_counter()
            learner.learn_one(Z[i + j], int(y[i + j]))
            times[(tag, "known")].append(time.perf_counter() - t)
        t = time.perf_counter()
        learner.learn_one(Z[i], 1000 + i)  # a new class
        times[(tag, "new")].append(time.perf_counter() - t)
    i += 20
med = {k: statistics.median(v) for k, v in times.items()}
for (tag, kind), v in med.items():
    print(f"{method} d={d} {tag} code, {kind}-class learn_one: median {v * 1e3:.3f} ms")
for tag in ("old", "new"):
    print(f"{method} d={d} {tag} code: new-class / known-class step "
          f"{med[(tag, 'new')] / med[(tag, 'known')]:.2f}")
print(f"{method} d={d} known-class step, new code / old code: "
      f"{med[('new', 'known')] / med[('old', 'known')]:.3f}")
