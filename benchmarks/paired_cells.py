"""Two methods' cells of a results folder side by side, paired by seed: Omega_all mean +- std of
each, the paired difference and its t, and the first method's Omega_all divided by the second's
offline references (the same events; offline references retrained on another run may differ by
float rounding or a test sample).

    python benchmarks/paired_cells.py docs/results/main-pretrained acil ranpac
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def omega(run: dict, offline: list | None = None) -> float:
    acc, off = np.asarray(run["accuracy"]), np.asarray(offline or run["accuracy_offline"])
    return float(np.mean(acc[1:] / off[1:]))  # the events after base init


def main() -> None:
    folder, a, b = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    print(f"| column | {a} | {b} | {a} - {b} (t, seeds ahead) | {a} on {b}'s offline "
          f"references | final accuracy {a} / {b} |")
    print("|---|---|---|---|---|---|")
    for fa in sorted(folder.glob(f"*_{a}.json")):
        fb = fa.with_name(fa.name.removesuffix(f"_{a}.json") + f"_{b}.json")
        if not fb.exists():
            continue
        ra, rb = json.loads(fa.read_text()), json.loads(fb.read_text())
        runs_b = {r["seed"]: r for r in rb["runs"]}
        pairs = [(r, runs_b[r["seed"]]) for r in ra["runs"] if r["seed"] in runs_b]
        oa = np.array([omega(x) for x, _ in pairs])
        ob = np.array([omega(y) for _, y in pairs])
        ox = np.array([omega(x, y["accuracy_offline"]) for x, y in pairs])
        d = oa - ob
        t = d.mean() / (d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 and d.std() > 0 else 0.0
        fin = [np.mean([p[k]["accuracy"][-1] for p in pairs]) * 100 for k in (0, 1)]
        col = fa.name.removesuffix(f"_{a}.json")
        print(f"| {col} | {oa.mean():.4f} +- {oa.std(ddof=1):.4f} | {ob.mean():.4f} +- "
              f"{ob.std(ddof=1):.4f} | {d.mean():+.4f} ({t:.1f}, {int((d > 0).sum())}/{len(d)}) "
              f"| {ox.mean():.4f} +- {ox.std(ddof=1):.4f} | {fin[0]:.1f} / {fin[1]:.1f} % |")


if __name__ == "__main__":
    main()
