"""Folder extraction against the same images fed from memory, through the same extractor.

Writes ``--images`` JPEG files of ``--side`` x ``--side`` pixels (random smooth colour fields,
10 class folders) into a temporary ``folder:`` dataset, then times, interleaved in one process
over ``--reps`` rounds:

- ``memory``: the images decoded beforehand (untimed) and held as one uint8 array
  (``ArrayImages``), embedded by efficientnet_lite0@``--size`` on ciosl's path
  (``features._embed_all`` with the runner ``ciosl features`` uses: ONNX Runtime workers, or
  torch with ``--backend torch``; torch on the GPU with ``--device cuda``);
- ``folder``: the same files read through ``folder:DIR`` (``FolderImages``: decoded in a pool,
  read ahead), by the same runner, extraction only;
- ``folder+verify``: the same, after the check every file gets before any work
  (``FolderImages.verify``), as ``ciosl features`` runs it.

Each round times the three paths in a rotated order (each one first in turn). It prints
images/s of each path (median over the rounds) and the ratios folder / memory; the
last line is ``folder/memory images/s ratio: X`` (extraction with the check; the issue's target:
at least 0.8).

    python benchmarks/folder_extraction.py                     # 512 images of 256x256, @64
    python benchmarks/folder_extraction.py --size 224 --images 128
    python benchmarks/folder_extraction.py --images 16 --reps 1  # a smoke run
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

from ciosl.data import efficientnet, features, runtime  # noqa: E402
from ciosl.data import folder as fo  # noqa: E402
from ciosl.data.types import ArrayImages  # noqa: E402


def write_images(root: Path, n: int, side: int) -> list[Path]:
    """``n`` JPEGs (quality 90) of smooth random colour fields in 10 class folders."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        im = Image.fromarray(small).resize((side, side), Image.BILINEAR)
        path = root / f"c{i % 10}" / f"{i:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        im.save(path, quality=90)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=512, help="images written (default 512)")
    p.add_argument("--side", type=int, default=256, help="their side in pixels (default 256)")
    p.add_argument("--size", type=int, default=features.EFFICIENTNET_RESOLUTION,
                   help="efficientnet_lite0's input side (default: ciosl's, 64)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--threads", type=int, default=None, help="extraction threads (default: "
                   "ciosl features' default)")
    p.add_argument("--backend", default=None, help="auto, onnxruntime or torch (default: auto)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    args = p.parse_args(argv)

    how = features.execution(args.device, args.backend, args.threads)
    model = efficientnet.load_efficientnet_lite0(None)
    size = args.size
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "folder"
        write_images(root, args.images, args.side)
        raw = fo.load_folder(root)
        paths = raw.train_x.paths + raw.test_x.paths
        in_memory = ArrayImages(np.stack([fo.decode(q) for q in paths]))  # (n, side, side, 3)
        if how.backend == "onnxruntime":
            runner = runtime.ort_runner(model, "efficientnet_lite0",
                                        efficientnet.weights_id(None), size,
                                        runtime.resolve_threads(how.threads, "onnxruntime"),
                                        Path(tmp))
        elif how.device == "cuda":
            runner = runtime.torch_runner(model, "cuda", features.EFFICIENTNET_BATCH,
                                          runtime.resolve_threads(how.threads, "torch"))
        else:
            torch.set_num_threads(runtime.resolve_threads(how.threads, "torch"))
            runner = runtime.torch_runner(model, "cpu", features.EFFICIENTNET_BATCH)

        def prepare(b):
            return features.efficientnet_input(b, size, how.device)

        def embed(src) -> np.ndarray:
            return features._embed_all("bench", runner, prepare, {"x": src}, False)["x"]

        embed(ArrayImages(in_memory.images[:runner.batch * 2]))  # warm up
        rates: dict[str, list[float]] = {"memory": [], "folder": [], "folder+verify": []}
        names = list(rates)
        for r in range(args.reps):
            for name in names[r % 3:] + names[:r % 3]:  # each path first in turn
                t0 = time.perf_counter()
                if name == "memory":
                    z = embed(in_memory)
                else:
                    src = fo.FolderImages(paths)
                    if name == "folder+verify":
                        src.verify()
                    z = embed(src)
                rates[name].append(len(paths) / (time.perf_counter() - t0))
                assert z.shape == (len(paths), efficientnet.EMBED_DIM)
        check = embed(fo.FolderImages(paths))
        ref = embed(in_memory)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{len(paths)} JPEGs of {args.side}x{args.side} -> efficientnet_lite0@{size} "
          f"({runner.backend} on {runner.device}, {runner.workers} worker(s), {fo.pool()._max_workers} decoding "
          f"threads, {runtime.available_cores()} cores); median of {args.reps} round(s)")
    for k, v in med.items():
        print(f"  {k:14s} {v:8.1f} images/s")
    print(f"  max |folder - memory| feature difference: {np.abs(check - ref).max():.2e}")
    print(f"folder (extraction only)/memory images/s ratio: {med['folder'] / med['memory']:.3f}")
    print(f"folder/memory images/s ratio: {med['folder+verify'] / med['memory']:.3f}")


if __name__ == "__main__":
    main()
