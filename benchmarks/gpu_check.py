"""Extraction on a CUDA device: ciosl's CUDA path against the same network with nothing around it.

Run on a machine with a GPU (the CPU-only machines of this project cannot run it). For each
input side it embeds the same random inputs (at the network's input scale) along four paths:

- ``reference``: the eager module on the CPU, float32, for 64 images (the features to match);
- ``ciosl cuda``: what ``ciosl features --device cuda`` runs (``runtime.torch_runner``): batches
  of ``CUDA_BATCH`` moved to the GPU, float32, features back to numpy;
- ``resident``: the same module and cuDNN settings (float32, no TF32) with the inputs already on
  the GPU and the features left there (no host transfers: the path with free transfers);
- ``resident fp16``: the same in channels-last layout under float16 autocast (a faster variant
  the project does not use: its features differ by the rounding it prints);
- ``ciosl cpu``: the ONNX Runtime path with one worker per core of that machine.

It prints images/s of each, ``ciosl cuda / resident``, ``ciosl cuda / ciosl cpu`` and each path's
max abs difference from the reference on the 64 images.

    python benchmarks/gpu_check.py                       # sides 64 and 224
    python benchmarks/gpu_check.py --sides 64 --images 2048
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract_time import gflops, network  # noqa: E402

from ciosl.data import runtime  # noqa: E402


def images_per_second(fn, X: np.ndarray, reps: int) -> tuple[float, np.ndarray]:
    out = fn(X)  # warm-up (and cuDNN's algorithm choice)
    t = time.perf_counter()
    for _ in range(reps):
        out = fn(X)
    return reps * len(X) / (time.perf_counter() - t), out


def in_batches(runner: runtime.Runner, X: np.ndarray) -> np.ndarray:
    out = np.empty((len(X), 1280), np.float32)
    for s, z in runtime.run_batches(runner, len(X),
                                    lambda s, e: (s, runner(torch.from_numpy(X[s:e])))):
        out[s:s + len(z)] = z
    return out


def resident(model: torch.nn.Module, fp16: bool):
    gpu = model.to("cuda")
    if fp16:
        gpu = gpu.to(memory_format=torch.channels_last)

    def call(X: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(X).to("cuda")
        if fp16:
            x = x.contiguous(memory_format=torch.channels_last)
        torch.cuda.synchronize()
        t = time.perf_counter()
        with (torch.inference_mode(), torch.autocast("cuda", torch.float16, enabled=fp16),
              torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                         allow_tf32=False)):
            z = torch.cat([gpu.embed(x[i:i + runtime.CUDA_BATCH])
                           for i in range(0, len(x), runtime.CUDA_BATCH)])
        torch.cuda.synchronize()
        call.seconds += time.perf_counter() - t
        return z.float().cpu().numpy()
    call.seconds = 0.0
    return call


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sides", default="64,224")
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here (torch.cuda.is_available() is False)")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{runtime.available_cores()} cores", flush=True)
    for side in (int(s) for s in a.sides.split(",")):
        model, wid = network("efficientnet_lite0", side)
        n = a.images if side <= 64 else a.images // 4
        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, 3, side, side), dtype=np.float32)
        torch.set_num_threads(runtime.available_cores())
        with torch.inference_mode():
            ref = model.embed(torch.from_numpy(X[:64])).numpy()
        cuda = runtime.torch_runner(model, "cuda", 32)
        cpu = runtime.ort_runner(model, "efficientnet_lite0", wid, side, runtime.available_cores())
        rows = {}
        rows["ciosl cuda"] = images_per_second(lambda X, r=cuda: in_batches(r, X), X, a.reps)
        for name, fp16 in (("resident", False), ("resident fp16", True)):
            call = resident(model, fp16)
            call(X)  # warm-up, untimed
            call.seconds = 0.0
            for _ in range(a.reps):
                out = call(X)
            rows[name] = (a.reps * n / call.seconds, out)
        torch.set_num_threads(1)
        rows["ciosl cpu"] = images_per_second(lambda X, r=cpu: in_batches(r, X), X[: n // 4], 1)
        g = gflops(network("efficientnet_lite0", side)[0], side)
        print(f"efficientnet_lite0@{side}: {n} images, {g:.3f} GFLOP/image", flush=True)
        for name, (ips, out) in rows.items():
            diff = float(np.abs(out[:64] - ref).max())
            print(f"  {name:14s} {ips:10.0f} images/s {ips * g / 1e3:8.2f} TFLOP/s  "
                  f"max |diff| {diff:.2e}", flush=True)
        print(f"  ciosl cuda / resident: {rows['ciosl cuda'][0] / rows['resident'][0]:.2f}; "
              f"ciosl cuda / ciosl cpu: {rows['ciosl cuda'][0] / rows['ciosl cpu'][0]:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
