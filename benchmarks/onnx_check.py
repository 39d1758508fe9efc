"""What trusting the ONNX cache costs: per network and input side, the export, the hashes that
name its cache entry (``runtime.producer``) and the probe check against the torch module
(``runtime.probe_check``), each timed once in this process (medians of ``--reps``).

    python benchmarks/onnx_check.py                          # efficientnet_lite0@64, mobilenet_v2@224
    python benchmarks/onnx_check.py --cases efficientnet_lite0@24 --reps 1

MobileNetV2 runs with random weights (no download; the cost does not depend on the values).
Prints one line per case: ``NET@SIDE: export X s, producer Y s, probe check Z s``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ciosl.data import efficientnet, runtime
from ciosl.data.mobilenet import MobileNetV2, frozen


def network(name: str) -> torch.nn.Module:
    if name == "efficientnet_lite0":
        return efficientnet.load_efficientnet_lite0()
    torch.manual_seed(0)
    model = MobileNetV2()
    return frozen(model, model.state_dict(), "random", "a mobilenet_v2")


def case(name: str, size: int, reps: int) -> tuple[float, float, float]:
    model = network(name)
    times: dict[str, list[float]] = {"export": [], "producer": [], "probe": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        data = runtime.export_onnx(model, size)
        t1 = time.perf_counter()
        runtime.producer(model, name, "bench", size)
        t2 = time.perf_counter()
        runtime._VERIFIED.clear()  # as in a new process
        runtime.probe_check(model, data, size, f"{name}@{size}")
        t3 = time.perf_counter()
        for key, t in zip(times, (t1 - t0, t2 - t1, t3 - t2), strict=True):
            times[key].append(t)
    return tuple(statistics.median(v) for v in times.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="efficientnet_lite0@64,mobilenet_v2@224")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    for spec in args.cases.split(","):
        name, _, side = spec.partition("@")
        export, producer, probe = case(name, int(side), args.reps)
        print(f"{name}@{side}: export {export:.2f} s, producer {producer:.2f} s, probe check "
              f"{probe:.2f} s", flush=True)


if __name__ == "__main__":
    main()
