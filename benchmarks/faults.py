"""Fault injection: does a call that raises part-way leave the learner as it was?

For each learner and each public call (``learn_one`` on a known class, ``learn_one`` on a new
class, ``learn_many`` with a new class, ``fit_base`` on a fresh learner), the call is run once
under a torch function mode that counts its torch operations, then again once per injection
point k, raising ``RuntimeError`` (or ``KeyboardInterrupt`` with ``--interrupt``) at the k-th
operation. After each raise it checks:

- ``state``: the state digest equals the digest before the call;
- ``later``: the learner, fed the same next samples as a twin that never saw the fault, ends
  with the twin's digest (state held outside ``state_dict`` shows here).

It prints, per learner and call, the operations counted, the injections made (every point, or
``--points`` evenly spaced ones) and how many broke each promise. The issue on learner state
(one state rule) is measured by this.

    python benchmarks/faults.py                         # every learner, 12 points per call
    python benchmarks/faults.py --methods tinyer,ewc --points 0 --interrupt   # every point
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ciosl import available_methods, make_learner
from ciosl.serial import digest


class Injected(RuntimeError):
    pass


class Faults(TorchFunctionMode):
    """Counts torch operations; raises at the ``at``-th one (1-based) when ``at`` is set."""

    def __init__(self, at: int | None = None, exc: type[BaseException] = Injected):
        super().__init__()
        self.n, self.at, self.exc = 0, at, exc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        if self.at is not None and self.n == self.at:
            raise self.exc(f"injected at torch operation {self.n} ({func})")
        return func(*args, **(kwargs or {}))


def stream(d: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(8), 6)
    x = rng.normal(size=(len(y), d)).astype(np.float32) + 0.5 * y[:, None]
    return x, [int(v) for v in y]


def prepared(method: str):
    x, y = stream()
    learner = make_learner(method)
    learner.fit_base(x[:12], y[:12])  # classes 0, 1
    for i in range(12, 24):  # classes 2, 3
        learner.learn_one(x[i], y[i])
    return learner


CALLS = {
    "learn_one known": lambda L, x, y: L.learn_one(x[14], y[14]),
    "learn_one new": lambda L, x, y: L.learn_one(x[30], y[30]),
    "learn_many new": lambda L, x, y: L.learn_many(x[24:36], y[24:36]),
    "fit_base": None,  # on a fresh learner
}


def run_call(method: str, call: str, at: int | None, exc) -> tuple[object, int, bool]:
    """(learner, operations counted, raised)."""
    x, y = stream()
    if call == "fit_base":
        learner = make_learner(method)
        fn = lambda: learner.fit_base(x[:12], y[:12])  # noqa: E731
    else:
        learner = prepared(method)
        fn = lambda: CALLS[call](learner, x, y)  # noqa: E731
    mode = Faults(at, exc)
    raised = False
    try:
        with mode:
            fn()
    except (Injected, KeyboardInterrupt):
        raised = True
    finally:
        # a fault that hits torch's own grad-mode switch leaves it off for the process: that
        # is torch's global, not the learner's state, and must not spill into the next run
        torch.set_grad_enabled(True)
    return learner, mode.n, raised


def after(learner, method: str, call: str) -> str:
    """The digest after a few more samples."""
    x, y = stream(seed=1)
    if call == "fit_base" and learner.dim_ is None:
        learner.fit_base(x[:12], y[:12])
    for i in range(36, 42):
        learner.learn_one(x[i], y[i])
    return digest(learner.state_dict())


def measure(method: str, call: str, points: int, exc) -> tuple[int, int, int, int]:
    clean, n, _ = run_call(method, call, None, exc)
    if call == "fit_base":
        before_learner = make_learner(method)
    else:
        before_learner = prepared(method)
    before = digest(before_learner.state_dict())
    twin_later = after(before_learner, method, call)
    ks = range(1, n + 1) if points == 0 or points >= n else sorted(
        {int(round(v)) for v in np.linspace(1, n, points)})
    changed = later = tried = 0
    for k in ks:
        learner, _, raised = run_call(method, call, k, exc)
        if not raised:  # an operation the learner caught itself
            continue
        tried += 1
        if digest(learner.state_dict()) != before:
            changed += 1
        try:
            if after(learner, method, call) != twin_later:
                later += 1
        except Exception:  # noqa: BLE001 (a broken learner counts as different)
            later += 1
    del clean
    return n, tried, changed, later


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(sorted(available_methods())))
    p.add_argument("--points", type=int, default=12, help="injection points per call (0: all)")
    p.add_argument("--interrupt", action="store_true", help="raise KeyboardInterrupt")
    a = p.parse_args()
    torch.set_num_threads(1)
    exc = KeyboardInterrupt if a.interrupt else Injected
    print(f"{'method':13s} {'call':16s} {'ops':>6s} {'faults':>6s} {'state changed':>14s} "
          f"{'later differs':>14s}")
    totals = np.zeros(3, int)
    for method in a.methods.split(","):
        for call in CALLS:
            try:
                n, tried, changed, later = measure(method, call, a.points, exc)
            except Exception as e:  # noqa: BLE001 (e.g. a learner that needs fit_base)
                print(f"{method:13s} {call:16s} skipped: {type(e).__name__}: {e}"[:120])
                continue
            totals += (tried, changed, later)
            print(f"{method:13s} {call:16s} {n:6d} {tried:6d} {changed:14d} {later:14d}",
                  flush=True)
    print(f"{'total':13s} {'':16s} {'':6s} {totals[0]:6d} {totals[1]:14d} {totals[2]:14d}")


if __name__ == "__main__":
    main()
