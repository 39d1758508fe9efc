"""What taking CIOSL's step out of Python would buy (issue 14): a probe, not the product.

``compiled_step.cpp`` is ``BayesHead._step`` for CIOSL's default case (every labelled row scored
with k draws, one training draw, entropy uncertainty) written as the same ATen calls from C++:
the local-reparameterization forward with its k - 1 further draws, the scores, the Fisher label
draw, dL/dlogits, the hand-written backward, the Fisher EMA, the KL gradient, clipping and the
momentum SGD, with no Python between them. This script builds it with
``torch.utils.cpp_extension`` (needs a C++ compiler and ninja), gives two learners the same base
init, makes one of them step through the extension (its noise still drawn by the same Python
call, so both consume the same random numbers), and prints:

- how far the two learners are apart after the warm-up (float rounding only: same draws, same
  memory decisions);
- the median ``learn_one`` time of each, in alternating 20-step blocks of one process (the
  machine's drift cancels), and both against the dense products of ``step_time.py``.

Run: ``python benchmarks/compiled_step.py [--dims 784 1280]``. One thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import step_time as st  # noqa: E402

from ciosl.learners import make_learner  # noqa: E402


def build_extension():
    from torch.utils.cpp_extension import load
    out = Path.home() / ".cache" / "ciosl" / "compiled_step"
    out.mkdir(parents=True, exist_ok=True)
    return load("ciosl_compiled_step", [str(HERE / "compiled_step.cpp")],
                extra_cflags=["-O3"], build_directory=str(out))


def compiled(ext):
    """A ``_step`` for a CIOSL learner that runs the step's arithmetic in ``ext``."""

    def _step(self, X, Y, H=None, mask=None, *, n_scored=0, n_data, kl_scale=None,
              score_labels=None):
        net = self.net
        n, n_ce = X.shape[0], Y.shape[0]
        if not (n_scored == n_ce and self.train_draws == 1 and self.train_noise
                and self.uncertainty == "entropy" and not self.rescore_distilled):
            raise NotImplementedError("the probe covers CIOSL's default step only")
        k = self.mc_samples
        net.evidence = n_data / self.temperature
        noise = torch.randn(n + n_scored * (k - 1), sum(s[0] for s in net.shapes[1::2]),
                            generator=self.torch_rng)  # = _draw_noise's single call
        kl = self._kl_scale(n_data, n_ce) if kl_scale is None else kl_scale
        if H is None:
            H = mask = torch.empty(0, net.n_out)
        if self.opt.buffers[0] is None or self.opt.buffers[0].shape != net.mu.shape:
            self.opt.buffers[0] = torch.zeros_like(net.mu)
        out = ext.step(X, Y, H, mask.to(X.dtype), noise, net.mu, net.fisher, net.prec0,
                       net.prior_mu, net.prior_prec, self.opt.buffers[0], self._grad,
                       net._scratch, [list(s) for s in net.shapes], k, net._fisher_weight(),
                       net.fisher_decay, self.lambda2, kl, net._prior_prec_max, 1.0 / self.lr,
                       self.max_grad_norm, self.lr, self.momentum, self.weight_decay,
                       self.torch_rng)
        net.fisher_steps += 1
        return tuple(out)

    return _step


def compare(ext, d: int, blocks: int = 30, block: int = 20) -> None:
    def learner():
        out = make_learner("ciosl", seed=0)
        out.fit_base(*st.data(d, st.N_BASE, 0, st.N_BASE_CLASSES))
        return out

    ref, fast = learner(), learner()
    fast._step = types.MethodType(compiled(ext), fast)
    Z, y = st.data(d, st.N_CLASSES + st.WARMUP + blocks * block, 1)
    y[:st.N_CLASSES - st.N_BASE_CLASSES] = np.arange(st.N_BASE_CLASSES, st.N_CLASSES)
    stream = list(zip(Z, y.tolist(), strict=True))
    warm = st.N_CLASSES - st.N_BASE_CLASSES + st.WARMUP
    for z, label in stream[:warm]:
        ref.learn_one(z, label)
        fast.learn_one(z, label)
    gap = float((ref.net.mu - fast.net.mu).abs().max())
    times: dict[str, list[float]] = {"python": [], "compiled": []}
    i = warm
    for _ in range(blocks):
        for name, lr in (("python", ref), ("compiled", fast)):
            for z, label in stream[i:i + block]:
                t = time.perf_counter()
                lr.learn_one(z, label)
                times[name].append(time.perf_counter() - t)
        i += block
    py, cc = (statistics.median(times[k]) for k in ("python", "compiled"))
    arith = st.arithmetic_time(d)
    print(f"d={d}: after {warm} steps the means differ by at most {gap:.1e}; learn_one median: "
          f"python step {py * 1e3:.3f} ms, compiled step {cc * 1e3:.3f} ms ({1 - cc / py:.0%} "
          f"less); dense arithmetic {arith * 1e3:.3f} ms; ratios {py / arith:.2f} / "
          f"{cc / arith:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[784, 1280])
    args = parser.parse_args()
    torch.set_num_threads(1)
    ext = build_extension()
    for d in args.dims:
        compare(ext, d)


if __name__ == "__main__":
    main()
