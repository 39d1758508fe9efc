"""How varied is CIOSL's replay set? One stream, counting which memory items each step replays.

For every window of ``--window`` stream steps it prints, for the first half of the replayed
items (uapn / lapn: the most uncertain / highest-loss) and the second half (the least
uncertain / lowest-loss), the number of distinct items replayed and how many steps of the
window the most-replayed item was in. An item is a memory slot between two writes, so an
item that is replaced and its successor count as two. Uniform selection has no halves; its
two columns are just the first and second half of the draw.

Run: ``python benchmarks/replay_set.py --dataset digits-video --ordering class_iid
[--set candidates=48]`` (seed 0, the protocol's defaults for the ordering; ``--set`` as in
``ciosl run``).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import torch

from ciosl.evaluation.experiment import (
    ExperimentSpec,
    load_features,
    parse_assignments,
    stream_ordering,
    validate,
)


def instrument(memory) -> list[list[tuple[int, int]]]:
    """Wrap ``memory``'s writes and selections; returns the list that collects, per step, the
    (slot, write count) of every replayed item."""
    writes = np.zeros(memory.capacity, np.int64)
    log: list[list[tuple[int, int]]] = []
    write, select = memory._write, memory.select

    def counted_write(slot, *args, **kwargs):
        writes[slot] += 1
        return write(slot, *args, **kwargs)

    def logged_select(*args, **kwargs):
        slots = select(*args, **kwargs)
        log.append([(int(s), int(writes[s])) for s in slots])
        return slots

    memory._write, memory.select = counted_write, logged_select
    return log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits-video")
    ap.add_argument("--ordering", default="class_iid")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=400)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    torch.set_num_threads(1)
    exp = ExperimentSpec(dataset=args.dataset, ordering=args.ordering, method="ciosl",
                         settings=parse_assignments(args.set))
    spec, cls, settings = validate(exp)  # as `ciosl run` resolves them
    fs = load_features(exp, spec)
    order = stream_ordering(exp, spec, fs, args.seed)
    learner = cls(**settings, seed=args.seed)
    learner.fit_base(fs.train_z[order.base], fs.train_y[order.base])
    log = instrument(learner.memory)
    for i in order.stream:
        learner.learn_one(fs.train_z[i], fs.train_y[i])
    print(f"ciosl on {args.dataset} / {args.ordering}, seed {args.seed}: selection "
          f"{learner.selection}, candidates {learner.candidates}, replacement "
          f"{learner.replacement}, buffer {learner.buffer}, {learner.n_replay} replayed per step")
    half = learner.n_replay // 2
    print(f"{'steps':>11}  {'first half: distinct':>20} {'max':>4}  {'second half: distinct':>21} "
          f"{'max':>4}")
    for s in range(0, len(log), args.window):
        block = log[s:s + args.window]
        first = Counter(x for b in block for x in b[:half])
        second = Counter(x for b in block for x in b[half:])
        print(f"{s:5d}-{s + len(block):5d}  {len(first):20d} {max(first.values(), default=0):4d}"
              f"  {len(second):21d} {max(second.values(), default=0):4d}")
    print(f"test accuracy after the stream: {100 * learner.score(fs.test_z, fs.test_y):.2f} %")


if __name__ == "__main__":
    main()
