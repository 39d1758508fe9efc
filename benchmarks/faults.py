"""Fault injection: does a call that raises part-way leave the learner as it was?

For each learner and each public call (``learn_one`` on a known class, ``learn_one`` on a new
class, ``learn_many`` with a new class among known ones, ``fit_base`` on a fresh learner), on
the data of the conformance suite's ``check_faults``, the call is run once to count its
injection points: its torch operations (a torch function mode) and, with ``--lines``, the lines
of ciosl's own code it executes (a ``sys.settrace`` trace function); the injectors are
``ciosl.conformance``'s. Then once per injection point k (every point with ``--points 0``, else
that many evenly spaced ones per kind of point, plus the first and last ``--ends``), raising
``RuntimeError`` and/or ``KeyboardInterrupt`` (``--exceptions``) there. After each raise it checks:

- ``state changed``: the state digest is neither the digest before the call nor the one after
  the complete call (a fault past the call's commit point may leave the call done);
- ``later differs``: the learner, fed 5 more samples (predicting after each), answers
  differently or ends with a different digest from a twin that never saw the fault (the twin of
  the state it was left in; state held outside ``state_dict``, as a kept answer, shows here),
  or raises. A fitted learner predicts once before the call, as a served one does.

It prints, per learner and call, the points counted, the injections made and how many broke
each promise; with ``--show N``, the first N failing injections of each row (where they hit).

    python benchmarks/faults.py                          # every learner, 12 torch points per call
    python benchmarks/faults.py --methods ncm --points 0 --lines --exceptions both  # exhaustive

docs/findings/faults.md has the table of every learner.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
import time

import numpy as np
import torch

from ciosl import available_methods
from ciosl.conformance import (
    INT_LABELS,
    InjectedFault,
    _LineFaults,
    _TorchFaults,
    case_id,
    cases,
    class_stream,
    learn,
)
from ciosl.serial import digest

EXCEPTIONS = {"runtime": (InjectedFault,), "interrupt": (KeyboardInterrupt,),
              "both": (InjectedFault, KeyboardInterrupt)}


class Setup:
    """The learner before each call, the calls, and the learning after them (check_faults')."""

    def __init__(self, cls, settings: dict):
        self.cls, self.settings = cls, settings
        self.Zb, yb, self.Zs, self.ys = class_stream()
        self.half = int(np.flatnonzero(self.ys == 3)[0])  # classes 3 and 4 still to come
        self.lab = [INT_LABELS[k] for k in self.ys]
        self.base_y = [INT_LABELS[k] for k in yb]
        self.Zt = np.concatenate([self.Zb[::7], self.Zs[::7]])  # rows of every class
        self.state = learn(cls(**settings).fit_base(self.Zb, self.base_y), self.Zs[:self.half],
                           self.ys[:self.half]).state_dict()
        Zs, lab, h = self.Zs, self.lab, self.half
        self.calls = {
            "learn_one known": (True, lambda L: L.learn_one(Zs[0], lab[0])),
            "learn_one new": (True, lambda L: L.learn_one(Zs[h], lab[h])),
            "learn_many new": (True, lambda L: L.learn_many(Zs[[0, h, 1]],
                                                            [lab[0], lab[h], lab[1]])),
            "fit_base": (False, lambda L: L.fit_base(self.Zb, self.base_y))}

    def fresh(self, fitted: bool):
        learner = self.cls(**self.settings)
        if fitted:
            learner.load_state_dict(copy.deepcopy(self.state))
            learner.predict_proba(self.Zt)  # an answer asked before the call (a kept answer)
        return learner

    def later(self, learner) -> str:
        """The state digest and every answer after each of 5 more learns."""
        if learner.dim_ is None:
            learner.fit_base(self.Zb, self.base_y)
        h, answers = self.half, hashlib.sha256()
        for i in range(h + 1, h + 6):
            learner.learn_one(self.Zs[i], self.lab[i])
            answers.update(np.ascontiguousarray(learner.predict_proba(self.Zt)).tobytes())
        return digest(learner.state_dict()) + answers.hexdigest()


def digest_of(learner) -> str | None:
    return None if learner.dim_ is None else digest(learner.state_dict())


def run(setup: Setup, call: str, injector) -> tuple[object, BaseException | None]:
    fitted, fn = setup.calls[call]
    learner = setup.fresh(fitted)
    grad = torch.is_grad_enabled()
    try:
        with injector:
            fn(learner)
    except (Exception, KeyboardInterrupt) as e:  # the fault, or an error made of it
        return learner, e
    finally:  # torch's global grad mode is the process's, not the learner's
        torch.set_grad_enabled(grad)
    return learner, None


def measure(setup: Setup, call: str, points: int, kinds, exceptions, show: int,
            ends: int = 0):
    """(points counted per kind, injections, state changed, later differs, failures)."""
    fitted, fn = setup.calls[call]
    before_learner, done_learner = setup.fresh(fitted), setup.fresh(fitted)
    fn(done_learner)
    before, done = digest_of(before_learner), digest_of(done_learner)
    outcomes = {before: setup.later(before_learner), done: setup.later(done_learner)}
    counted, tried, changed, later, failures = {}, 0, 0, 0, []
    for kind, injector in kinds:
        counter = injector(None, InjectedFault)
        run(setup, call, counter)
        n = counted[kind] = counter.n
        ks = range(1, n + 1) if points == 0 or points >= n else sorted(
            {int(round(v)) for v in np.linspace(1, n, points)}
            | set(range(1, min(ends, n) + 1)) | set(range(max(n - ends, 0) + 1, n + 1)))
        for k in ks:
            for exc in exceptions:
                learner, raised = run(setup, call, injector(k, exc))
                if raised is None:  # the learner caught the fault itself and went on
                    continue
                tried += 1
                now = digest_of(learner)
                bad = []
                if now not in outcomes:
                    changed += 1
                    bad.append("state changed")
                try:
                    different = setup.later(learner) != outcomes.get(now, outcomes[before])
                except Exception as e:  # noqa: BLE001 (a broken learner counts as different)
                    different = True
                    bad.append(f"then {type(e).__name__}: {e}"[:120])
                if different:
                    later += 1
                    bad.append("later differs")
                if bad and len(failures) < show:
                    failures.append(f"{exc.__name__} at {kind} {k}: {raised} -> "
                                    + ", ".join(bad))
    return counted, tried, changed, later, failures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default=",".join(sorted(available_methods())))
    p.add_argument("--calls", default=None,
                   help="comma-separated subset of: learn_one known, learn_one new, "
                        "learn_many new, fit_base")
    p.add_argument("--points", type=int, default=12,
                   help="injection points per call and kind of point (0: every point)")
    p.add_argument("--ends", type=int, default=0,
                   help="with --points N: also every one of the first and the last N points "
                        "(where a call opens and closes)")
    p.add_argument("--lines", action="store_true",
                   help="also inject at every executed line of ciosl's code (a trace function)")
    p.add_argument("--exceptions", choices=sorted(EXCEPTIONS), default="runtime",
                   help="what to raise at each point (both: each point twice)")
    p.add_argument("--interrupt", action="store_true",
                   help="raise KeyboardInterrupt (as --exceptions interrupt)")
    p.add_argument("--settings", choices=["default", "extra", "all"], default="default",
                   help="extra: each learner's conformance_settings; all: the default and "
                        "those (as check_faults runs)")
    p.add_argument("--show", type=int, default=0, help="print the first N failures of a row")
    a = p.parse_args()
    torch.set_num_threads(1)
    exceptions = EXCEPTIONS["interrupt" if a.interrupt else a.exceptions]
    kinds = [("torch operation", _TorchFaults)] + ([("line", _LineFaults)] if a.lines else [])
    calls = a.calls.split(",") if a.calls else ["learn_one known", "learn_one new",
                                                "learn_many new", "fit_base"]
    print(f"{'method':13s} {'call':16s} {'points':>6s} {'faults':>6s} {'state changed':>14s} "
          f"{'later differs':>14s}", flush=True)
    totals = np.zeros(3, int)
    start = time.perf_counter()
    methods = a.methods.split(",")
    want = {"default": (True,), "extra": (False,), "all": (True, False)}[a.settings]
    runs = [(cls, s) for cls, s in cases() if cls.name in methods and (not s) in want]
    runs.sort(key=lambda case: methods.index(case[0].name))
    for cls, settings in runs:
        setup, method = Setup(cls, settings), case_id((cls, settings))
        for call in calls:
            try:
                counted, tried, changed, later, failures = measure(
                    setup, call, a.points, kinds, exceptions, a.show, a.ends)
            except Exception as e:  # noqa: BLE001 (e.g. a learner that needs fit_base)
                print(f"{method:13s} {call:16s} skipped: {type(e).__name__}: {e}"[:120])
                continue
            totals += (tried, changed, later)
            print(f"{method:13s} {call:16s} {sum(counted.values()):6d} {tried:6d} "
                  f"{changed:14d} {later:14d}", flush=True)
            for f in failures:
                print(f"    {f}"[:300], flush=True)
    print(f"{'total':13s} {'':16s} {'':6s} {totals[0]:6d} {totals[1]:14d} {totals[2]:14d}")
    print(f"# {time.perf_counter() - start:.0f} s; points: torch operations"
          + (" and lines of ciosl's code" if a.lines else "")
          + f"; raised: {', '.join(e.__name__ for e in exceptions)}", file=sys.stderr)


if __name__ == "__main__":
    main()
