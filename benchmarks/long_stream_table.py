"""The table of held-out accuracy against stream length, from ``long_stream.py``'s JSONs.

    python benchmarks/long_stream_table.py docs/results/long-stream

One row per result file (learner, source, settings): the accuracy at the usual points, the
last point reached, its difference from the accuracy at 100k (issue 39's target: within one
point, 0.01) and the time per sample over the last window. A run that has not reached its
``samples`` yet is marked with the point it stopped at.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = (10_000, 50_000, 100_000, 250_000, 500_000, 1_000_000)


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def rows(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        points = {int(p["samples"]): p for p in data.get("points", [])}
        if not points:
            continue
        last = max(points)
        settings = ", ".join(data.get("settings") or []) or "defaults"
        out.append({
            "file": path.name, "method": data["method"], "source": data["source"],
            "dim": data.get("dim"), "settings": settings, "samples": data["samples"],
            "acc": {n: points[n]["accuracy"] for n in COLUMNS if n in points},
            "last": last, "acc_last": points[last]["accuracy"],
            "delta": (points[last]["accuracy"] - points[100_000]["accuracy"]
                      if 100_000 in points and last > 100_000 else None),
            "ms": points[last]["ms_per_sample"], "complete": last >= data["samples"],
        })
    return out


def markdown(table: list[dict]) -> str:
    head = ["learner", "stream", "settings", *(_label(n) for n in COLUMNS), "last",
            "last - 100k", "ms/sample"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for r in sorted(table, key=lambda r: (r["source"], r["method"], r["settings"])):
        cells = [f"{r['acc'][n]:.4f}" if n in r["acc"] else "" for n in COLUMNS]
        last = _label(r["last"]) if r["last"] % 1000 == 0 else str(r["last"])
        last += "" if r["complete"] else f" (of {_label(r['samples'])})"
        delta = "" if r["delta"] is None else f"{r['delta']:+.4f}"
        lines.append("| " + " | ".join([r["method"], f"{r['source']} d={r['dim']}",
                                        r["settings"], *cells, last, delta,
                                        f"{r['ms']:.3f}"]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, nargs="?", default=Path("docs/results/long-stream"))
    args = p.parse_args(argv)
    print(markdown(rows(args.folder)))


if __name__ == "__main__":
    main()
