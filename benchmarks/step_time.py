"""Time of one CIOSL ``learn_one`` against the dense arithmetic it cannot avoid.

For feature widths 784 and 1280 and a full memory (default settings, buffer 1000), base init on
8 classes and a stream of 10 (the step of a class ordering: the two new classes arrive during the
warm-up, so every timed step replays N1' items and distils N2'), this measures in one process:

- step: the median wall time of one ``learn_one`` (single thread, after a warm-up);
- arithmetic: the median time of the step's dense matrix products run back to back with
  torch on the same shapes: the local-reparameterization forward of the head on the
  1 + N1' + N2' rows (a mean and a variance product per layer), its backward (the means'
  weight gradient per layer and the input gradients of layers 2..L, through the mean and the
  variance paths), the Fisher estimate on the 1 + N1' labelled rows (a squared-gradient
  product per layer and the propagation through layers 2..L), and the uncertainty passes (the
  k - 1 further draws of the 1 + N1' scored rows through layers 2..L; layer 1's moments are
  shared with the training pass).

The two are timed in alternating blocks of 20 calls (the machine's load drifts; this way it
falls on both alike). Prints both, then ``step/arithmetic ratio: X`` for the 1280-d case as the
last line.
Run: ``python benchmarks/step_time.py`` (``--breakdown``: the median time of each phase of
the step; ``--profile``: a torch profile; ``--ceiling``: the share of the passes over the
parameters, what fusing them could save at most; ``--floor``: the noise and the parameter passes
alone, against the products; ``--cold``: small operations alone and after the parameter
traffic). One thread by default (``--threads``): per-sample work is too small to gain from a
second one.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ciosl.learners import make_learner
from ciosl.learners.head import HIDDEN

N_CLASSES, N_BASE_CLASSES, N_BASE, N_STEPS, WARMUP = 10, 8, 1500, 400, 50


def median_time(fn, n: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def data(d: int, n: int, seed: int, n_classes: int = N_CLASSES) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(d).normal(0.0, 0.5, (N_CLASSES, d))  # same for every call
    y = rng.integers(n_classes, size=n)
    return (centers[y] + rng.normal(size=(n, d))).astype(np.float32), y


def timed(obj, name: str, times: dict[str, list[float]], label: str) -> None:
    """Wrap ``obj.name`` to record its wall times under ``label``."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        times.setdefault(label, []).append(time.perf_counter() - t)
        return out

    setattr(obj, name, wrapper)


def step_time(d: int, mode: str = "time", products=None, block: int = 20):
    """Median ``learn_one`` time; mode "profile" prints a torch profile instead, "breakdown"
    the median time of each phase of the step. With ``products`` (``products_fn``): the
    medians of both, timed in alternating blocks of ``block`` calls, so that the machine's
    drift falls on both alike."""
    learner = make_learner("ciosl", seed=0)
    learner.fit_base(*data(d, N_BASE, 0, N_BASE_CLASSES))  # fills the memory (1000 items)
    assert learner.memory_size() == learner.buffer
    Z, y = data(d, N_CLASSES + WARMUP + N_STEPS, 1)
    y[:N_CLASSES - N_BASE_CLASSES] = np.arange(N_BASE_CLASSES, N_CLASSES)  # the new classes
    it = iter(zip(Z, y.tolist(), strict=True))

    def one() -> None:
        learner.learn_one(*next(it))

    if mode == "profile":
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as tprofile
        for _ in range(WARMUP):
            one()
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                one()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return float("nan")
    for _ in range(N_CLASSES - N_BASE_CLASSES):  # the new classes: distillation from now on
        one()
    assert learner._distilling() and len(learner.classes_) == N_CLASSES
    if mode == "breakdown":
        times: dict[str, list[float]] = {}
        for name in ("forward_local", "backward", "accumulate_fisher", "add_kl_grad"):
            timed(learner.net, name, times, f"step: {name}")
        timed(learner.opt, "step", times, "step: SGD")
        timed(learner, "_draw_noise", times, "step: noise")
        timed(learner, "_step", times, "step (all of it)")
        for name in ("select", "sample_uniform", "distill_targets", "batch", "update", "offer"):
            timed(learner.memory, name, times, f"memory.{name}")
        total = median_time(one, N_STEPS, WARMUP)
        for label, ts in times.items():
            print(f"  {label:24s} {statistics.median(ts[-N_STEPS:]) * 1e3:7.3f} ms")
        print(f"  {'learn_one (instrumented)':24s} {total * 1e3:7.3f} ms")
        return total
    if products is None:
        return median_time(one, N_STEPS, WARMUP)
    for _ in range(WARMUP):
        one()
        products()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(N_STEPS // block):
        for fn, ts in ((one, times[0]), (products, times[1])):
            for _ in range(block):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def parameter_pass_ceiling(d: int = 1280, blocks: int = 40, block: int = 25) -> None:
    """What fusing the passes over the parameters could save at most: the median ``learn_one``
    with them (the posterior variances, the KL gradient, clipping, the SGD update) against the
    same step with all of them skipped (a broken step, for timing only), in alternating blocks
    of one process, so that the machine's drift cancels."""
    import math

    from ciosl.learners import bayes_head, bnn

    skip = [False]
    orig = (bnn.BayesMLP.precision, bnn.BayesMLP.add_kl_grad, bayes_head.FlatSGD.step,
            bayes_head.clip_grad_norm_)

    def precision(self, out=None):
        return out if skip[0] and out is not None else orig[0](self, out)

    def add_kl_grad(self, grad, scale, max_curvature=math.inf):
        return None if skip[0] else orig[1](self, grad, scale, max_curvature)

    def sgd_step(self, params):
        if not skip[0]:
            return orig[2](self, params)
        params[0].grad = None

    def clip(grads, max_norm):
        return 0.0 if skip[0] else orig[3](grads, max_norm)

    bnn.BayesMLP.precision, bnn.BayesMLP.add_kl_grad = precision, add_kl_grad
    bayes_head.FlatSGD.step, bayes_head.clip_grad_norm_ = sgd_step, clip
    try:
        learner = make_learner("ciosl", seed=0)
        learner.fit_base(*data(d, N_BASE, 0, N_BASE_CLASSES))
        Z, y = data(d, WARMUP + blocks * block * 2, 1)
        y[:N_CLASSES - N_BASE_CLASSES] = np.arange(N_BASE_CLASSES, N_CLASSES)
        it = iter(zip(Z, y.tolist(), strict=True))
        for _ in range(WARMUP):
            learner.learn_one(*next(it))
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(blocks):
            for flag in (False, True):
                skip[0] = flag
                for _ in range(block):
                    t = time.perf_counter()
                    learner.learn_one(*next(it))
                    times[flag].append(time.perf_counter() - t)
    finally:
        bnn.BayesMLP.precision, bnn.BayesMLP.add_kl_grad = orig[:2]
        bayes_head.FlatSGD.step, bayes_head.clip_grad_norm_ = orig[2:]
    full, without = (statistics.median(times[f]) for f in (False, True))
    print(f"d={d}: learn_one median {full * 1e3:.3f} ms, without the parameter passes "
          f"{without * 1e3:.3f} ms: their share {1 - without / full:.1%}")


def arithmetic_time(d: int, n_replay: int = 16, n_distill: int = 16, k: int = 5) -> float:
    """Median time of ``products_fn``'s products."""
    return median_time(products_fn(d, n_replay, n_distill, k), 400)


def products_fn(d: int, n_replay: int = 16, n_distill: int = 16, k: int = 5):
    """The step's dense matrix products (module docstring) at width d, as one call."""
    gen = torch.Generator().manual_seed(0)
    sizes = [d, *HIDDEN, N_CLASSES]
    n, n_scored = 1 + n_replay + n_distill, 1 + n_replay
    extra = n_scored * (k - 1)
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        rows = n if i == 0 else n + extra
        layers.append(dict(
            W=torch.randn(fan_out, fan_in, generator=gen), V=torch.rand(fan_out, fan_in),
            b=torch.randn(fan_out), H=torch.randn(rows, fan_in, generator=gen),
            H2=torch.rand(rows, fan_in), G=torch.randn(n, fan_out, generator=gen)))

    def products() -> None:
        for lay in layers:  # forward: mean and variance of the pre-activations
            torch.addmm(lay["b"], lay["H"], lay["W"].t())
            torch.addmm(lay["b"], lay["H2"], lay["V"].t())
        for i, lay in enumerate(reversed(layers)):  # backward on the n training rows
            G, H = lay["G"], lay["H"][:n]
            torch.mm(G.t(), H)  # the means' gradient
            if i < len(layers) - 1:  # input gradient through the mean and the variance paths
                G.mm(lay["W"])
                G.mm(lay["V"])
        for i, lay in enumerate(reversed(layers)):  # Fisher on the n_scored labelled rows
            G, H2 = lay["G"][:n_scored], lay["H2"][:n_scored]
            torch.mm(G.t(), H2)  # squared per-row gradients
            if i < len(layers) - 1:
                G.mm(lay["W"])

    return products


def floor_time(d: int, n_replay: int = 16, n_distill: int = 16, k: int = 5) -> dict[str, float]:
    """Median times of what a step must do beyond its products, alone at the step's sizes: one
    draw of the step's noise, the variances 1 / (pi_0 + E Fbar), the KL gradient, the gradient's
    norm and the fused momentum SGD (each a pass over the P parameters)."""
    P = sum(a * b + b for a, b in zip([d, *HIDDEN], [*HIDDEN, N_CLASSES], strict=True))
    gen = torch.Generator().manual_seed(0)
    a, b, c, e = (torch.rand(P, generator=gen) + 0.1 for _ in range(4))
    out = torch.empty(P)
    rows = 1 + n_replay + n_distill + (1 + n_replay) * (k - 1)
    width = sum(HIDDEN) + N_CLASSES

    def sgd() -> None:
        torch._fused_sgd_([a], [c], [e], weight_decay=1e-5, momentum=0.9, lr=0.01,
                          dampening=0.0, nesterov=False, maximize=False, is_first_step=False)

    parts = {"noise": lambda: torch.randn(rows, width, generator=gen),
             "variances": lambda: torch.add(a, b, alpha=3.0, out=out).reciprocal_(),
             "KL gradient": lambda: c.addcmul_(torch.sub(a, b, out=out), e, value=1e-3),
             "norm": lambda: c.norm(), "SGD": sgd}
    return {name: median_time(fn, 400) for name, fn in parts.items()}


def cold_time(d: int = 1280, arrays: int = 9, reps: int = 300) -> None:
    """Why a step's small operations cost more inside a step than alone: a few of them timed
    alone (caches warm) and right after the step's passes over its parameters (``arrays`` (P,)
    float32 arrays streamed, as a step streams the means, variances, Fisher, prior, gradient and
    momentum through the core's caches)."""
    P = sum(a * b + b for a, b in zip([d, *HIDDEN], [*HIDDEN, N_CLASSES], strict=True))
    big = torch.rand(arrays * P)
    logits, z, idx = torch.randn(17, N_CLASSES), torch.randn(1000, d), torch.randint(1000, (32,))
    score, rng = np.random.default_rng(0).random(1000), np.random.default_rng(0)
    ops = {"softmax (17, 10)": lambda: logits.softmax(1),
           "index_select 32 rows": lambda: z.index_select(0, idx),
           "np.partition of 1000": lambda: np.partition(score, 8),
           "rng.choice(1000, 16)": lambda: rng.choice(1000, size=16, replace=False)}
    for name, fn in ops.items():
        warm, cold = [], []
        for _ in range(reps):
            fn()
            t = time.perf_counter()
            fn()
            warm.append(time.perf_counter() - t)
            big.mul_(1.0)
            t = time.perf_counter()
            fn()
            cold.append(time.perf_counter() - t)
        w, c = statistics.median(warm), statistics.median(cold)
        print(f"{name:24s} alone {w * 1e6:6.1f} us, after {arrays} x {P * 4 / 2**20:.2f} MiB "
              f"streamed {c * 1e6:6.1f} us ({c / w:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="torch profile of the step")
    parser.add_argument("--breakdown", action="store_true", help="median time per phase")
    parser.add_argument("--floor", action="store_true", help="what a step must do beyond its "
                        "products (noise, passes over the parameters), against the products")
    parser.add_argument("--ceiling", action="store_true", help="share of the step spent in "
                        "passes over the parameters (what fusing them could save at most)")
    parser.add_argument("--cold", action="store_true", help="small operations alone and "
                        "after a step's parameter traffic (why they cost more inside a step)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.cold:
        cold_time()
        return
    if args.ceiling:
        parameter_pass_ceiling()
        return
    if args.floor:
        for d in (784, 1280):
            parts, arith = floor_time(d), arithmetic_time(d)
            total = sum(parts.values())
            print(f"d={d}: dense arithmetic {arith * 1e3:.3f} ms; beyond it: "
                  + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in parts.items())
                  + f" ms; together {total * 1e3:.3f} ms = {total / arith:.2f} of the arithmetic")
        return
    if args.profile or args.breakdown:
        print(f"d=1280, one learn_one, {'profile' if args.profile else 'breakdown'}:")
        step_time(1280, "profile" if args.profile else "breakdown")
        return
    ratio = float("nan")
    for d in (784, 1280):
        step, arith = step_time(d, products=products_fn(d))
        ratio = step / arith
        print(f"d={d}: learn_one median {step * 1e3:.3f} ms, dense arithmetic "
              f"{arith * 1e3:.3f} ms, ratio {ratio:.2f} "
              f"(60,000 such steps: {60_000 * step / 60:.1f} min; benchmarks/stream_time.py "
              "times a real stream)")
    print(f"step/arithmetic ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()
