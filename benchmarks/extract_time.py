"""Feature extraction: ciosl's path against ONNX Runtime running the same network.

For each case (network, input side, threads) three paths embed the same random inputs
(already at the network's input scale, so that only the network is timed), interleaved in one
process, ``--reps`` rounds:

- ``torch``: the reference, the project's eager module (``model.embed``) in batches of 32 with
  that many torch threads (today's torch path; its features are the reference);
- ``onnxruntime``: ONNX Runtime's plain run, as a practitioner would set it up: the project's
  module exported with ``torch.onnx.export`` as it is, a default ``InferenceSession`` with
  ``intra_op_num_threads`` = threads, batches of 32;
- ``ciosl``: what ``ciosl features`` runs on the CPU (``ciosl.data.runtime``): the export
  specialised to the input size, ``ort_batch(size)`` images per call, threads single-threaded
  workers, no spin-waiting.

Per case it prints images/s and GFLOP/s of each path (FLOPs: 2 x the multiply-adds of every
convolution and linear layer at that input size), the max abs difference of each path's features
from the reference, and ciosl / onnxruntime. With ``--busy`` a busy loop
(``python -c 'while True: pass'``) runs beside every measurement, and a last case compares
ciosl's default (one worker per available core) with one thread at the same time. The last line
is ``extraction/onnxruntime images/s ratio: X``, the lowest over the cases.

    python benchmarks/extract_time.py                 # the issue's cases, 1 and 2 threads
    python benchmarks/extract_time.py --busy          # the same with a busy process beside
    python benchmarks/extract_time.py --cases efficientnet_lite0@32 --images 8 --reps 1
"""

from __future__ import annotations

import os

# torch's OpenMP threads otherwise spin after each call, taking the core the next path (timed
# right after, interleaved) needs: waiting threads sleep, as ciosl's ONNX Runtime workers do
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import copy  # noqa: E402
import io  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ciosl.data import efficientnet, runtime  # noqa: E402
from ciosl.data.mobilenet import MobileNetV2, frozen  # noqa: E402

CASES = ("efficientnet_lite0@64", "efficientnet_lite0@224", "mobilenet_v2@224")
PLAIN_BATCH = 32


def network(name: str, size: int) -> tuple[torch.nn.Module, str]:
    """The frozen module and its weights id: Lite0's ImageNet weights; MobileNetV2's random,
    with batch-norm statistics measured on random inputs (torchvision's init leaves the
    features ~1e-14, where a difference of 1e-4 would say nothing)."""
    if name == "efficientnet_lite0":
        return efficientnet.load_efficientnet_lite0(), efficientnet.weights_id()
    torch.manual_seed(0)
    model = MobileNetV2()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # a plain average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model.embed(torch.randn(8, 3, size, size))
    return (frozen(model, model.state_dict(), "random init", "a mobilenet_v2"),
            f"random-seed0-bn{size}")


def gflops(model: torch.nn.Module, size: int) -> float:
    """GFLOP per image of ``model.embed`` at (size, size): 2 x multiply-adds of convs/linears."""
    macs = [0]

    def hook(mod, args, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.kernel_size[0] * mod.kernel_size[1] * mod.in_channels // mod.groups
            macs[0] += out[0].numel() * k
    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d)]
    with torch.inference_mode():
        model.embed(torch.zeros(1, 3, size, size))
    for h in hooks:
        h.remove()
    return 2 * macs[0] / 1e9


def plain_onnx(model: torch.nn.Module, size: int) -> bytes:
    """The module exported as it is (a copy: the exporter folds batch norms in place)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(runtime._Embed(copy.deepcopy(model)), (torch.zeros(2, 3, size, size),),
                          buf, dynamo=False, input_names=["x"], output_names=["z"],
                          dynamic_axes={"x": {0: "b"}, "z": {0: "b"}})
    return buf.getvalue()


def paths(model, wid, name, size, threads, cache) -> dict:
    """name -> f(X) giving (n, d) features, for the three paths at ``threads``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    plain = ort.InferenceSession(plain_onnx(model, size), so, providers=["CPUExecutionProvider"])
    mine = runtime.ort_runner(model, name, wid, size, threads, cache)

    def torch_path(X):
        torch.set_num_threads(threads)
        with torch.inference_mode():
            return np.concatenate([model.embed(torch.from_numpy(X[i:i + PLAIN_BATCH])).numpy()
                                   for i in range(0, len(X), PLAIN_BATCH)])

    def ort_path(X):
        return np.concatenate([plain.run(None, {"x": X[i:i + PLAIN_BATCH]})[0]
                               for i in range(0, len(X), PLAIN_BATCH)])

    def ciosl_path(X, runner=mine):
        torch.set_num_threads(1)
        out = np.empty((len(X), 1280), np.float32)
        for s, z in runtime.run_batches(runner, len(X),
                                        lambda s, e: (s, runner(torch.from_numpy(X[s:e])))):
            out[s:s + len(z)] = z
        return out

    return {"torch": torch_path, "onnxruntime": ort_path, "ciosl": ciosl_path}


def timed(fns: dict, X: np.ndarray, reps: int) -> tuple[dict, dict]:
    """Interleaved: every round runs each path once over X; images/s over all rounds."""
    out = {k: f(X) for k, f in fns.items()}  # warm-up, and the features
    secs = dict.fromkeys(fns, 0.0)
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f(X)
            secs[k] += time.perf_counter() - t
    return {k: reps * len(X) / secs[k] for k in fns}, out


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES), help="network@side, comma-separated")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--images", type=int, default=0,
                   help="images per round (default: 256 at side <= 96, else 64)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    p.add_argument("--busy", action="store_true", help="a busy loop runs beside the timing")
    p.add_argument("--cache", default=None, help="cache root for the ONNX export "
                   "(default: $CIOSL_CACHE)")
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    busy = (subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy
            else None)
    try:
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores, "
              f"{runtime.available_cores()} available; busy loop beside: {bool(busy)}")
        lowest = float("inf")
        for case in args.cases.split(","):
            name, _, side = case.partition("@")
            size = int(side)
            model, wid = network(name, size)
            flop = gflops(model, size)
            n = args.images or (256 if size <= 96 else 64)
            X = np.random.default_rng(0).normal(size=(n, 3, size, size)).astype(np.float32)
            for t in threads:
                rate, feats = timed(paths(model, wid, name, size, t, args.cache), X, args.reps)
                ratio = rate["ciosl"] / rate["onnxruntime"]
                lowest = min(lowest, ratio)
                diff = {k: float(np.abs(feats[k] - feats["torch"]).max()) for k in feats}
                scale = float(np.abs(feats["torch"]).max())
                print(f"{case} {t} thread(s), {flop:.3f} GFLOP/image: " + ", ".join(
                    f"{k} {rate[k]:.1f} images/s {rate[k] * flop:.1f} GFLOP/s "
                    f"(max |diff| {diff[k]:.1e})" for k in rate) + f"; ciosl/onnxruntime "
                    f"{ratio:.2f}; max |feature| {scale:.2g}")
            if busy is not None and case == args.cases.split(",")[0]:
                cores = runtime.available_cores()
                fns = {"one thread": paths(model, wid, name, size, 1, args.cache)["ciosl"],
                       f"default ({cores} workers)":
                       paths(model, wid, name, size, cores, args.cache)["ciosl"]}
                rate, _ = timed(fns, X, args.reps)
                one, default = rate.values()
                print(f"{case} with a busy process beside: ciosl one thread {one:.1f} images/s, "
                      f"default {default:.1f} images/s; default/one thread {default / one:.2f}")
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
        print(f"extraction/onnxruntime images/s ratio: {lowest:.2f}")
        return lowest
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


if __name__ == "__main__":
    main()
