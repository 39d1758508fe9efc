"""Dynamic batching of images (``ciosl.serve.batching``, issue 56): requests that wait together
run in one forward pass, a large request does not hold back small ones, a failed batch fails
only its own requests, learns reach the writer in arrival order; and the CUDA paths (run only
where torch sees a GPU)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from ciosl.serve.batching import Batcher, BatchFailed, Turnstile

GUARD = 60  # seconds: a hang guard only


class Gate:
    """A forward pass (row sums) that holds its first batch until released, so that the
    requests sent meanwhile are all waiting when the next batch is taken."""

    def __init__(self, fail_on: float | None = None):
        self.release, self.entered = threading.Event(), threading.Event()
        self.sizes: list[int] = []
        self.firsts: list[list[float]] = []  # each pass's rows, by their first value
        self.fail_on = fail_on

    def __call__(self, x: torch.Tensor) -> np.ndarray:
        self.sizes.append(len(x))
        self.firsts.append(x[:, 0].tolist())
        if len(self.sizes) == 1:
            self.entered.set()
            assert self.release.wait(GUARD)
        if self.fail_on is not None and bool((x[:, 0] == self.fail_on).any()):
            raise RuntimeError("CUDA out of memory (simulated)\nsecond line")
        return x.sum(dim=1, keepdim=True).numpy().astype(np.float32)


def _rows(n, start=0):
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, 3)


def test_requests_waiting_together_run_in_one_forward_pass():
    gate = Gate()
    b = Batcher(gate, max_images=64, wait_ms=0)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(b.run, _rows(1))
        assert gate.entered.wait(GUARD)
        rest = [pool.submit(b.run, _rows(1, 10 * i)) for i in range(1, 9)]
        while len(b.queue) < 8:  # all eight queued behind the running batch
            threading.Event().wait(0.01)
        gate.release.set()
        out = [f.result(GUARD) for f in rest]
    assert first.result(GUARD).tolist() == [[0.0]]
    assert [o.tolist() for o in out] == [[[30.0 * i]] for i in range(1, 9)]
    assert gate.sizes == [1, 8] and b.batches == 2  # one pass for the eight
    b.close()


def test_a_large_request_does_not_hold_back_small_ones():
    gate = Gate()
    b = Batcher(gate, max_images=64, wait_ms=0)
    done: list[str] = []
    with ThreadPoolExecutor(5) as pool:
        pool.submit(b.run, _rows(1))
        assert gate.entered.wait(GUARD)
        big = pool.submit(lambda: b.run(_rows(4096)) is not None and done.append("big"))
        while len(b.queue) < 1:
            threading.Event().wait(0.01)
        small = [pool.submit(lambda i=i: b.run(_rows(1, 5000 + i)) is not None
                             and done.append(f"small{i}")) for i in range(3)]
        while len(b.queue) < 4:
            threading.Event().wait(0.01)
        gate.release.set()
        for f in (big, *small):
            f.result(GUARD)
    # the small ones ran in the second pass, the big one's last rows in the last (counted by
    # the passes, not by when each waiting thread got the CPU back to say it was done)
    assert {5000.0, 5001.0, 5002.0} <= set(gate.firsts[1]) and 4095.0 in gate.firsts[-1]
    assert sorted(done) == ["big", "small0", "small1", "small2"]
    assert gate.sizes[1] == 64  # the second batch: 16 of the big one's, then the room left
    assert sum(gate.sizes) == 1 + 4096 + 3 and max(gate.sizes) == 64
    b.close()


def test_a_failed_batch_fails_only_its_requests_in_one_line():
    gate = Gate(fail_on=777.0)
    b = Batcher(gate, max_images=1, wait_ms=0)  # one image per pass: batches hold one job
    with ThreadPoolExecutor(4) as pool:
        pool.submit(b.run, _rows(1))
        assert gate.entered.wait(GUARD)
        bad = pool.submit(b.run, _rows(3, 776))  # 776, 777 (fails), 778: never run
        while len(b.queue) < 1:
            threading.Event().wait(0.01)
        good = pool.submit(b.run, _rows(2, 0))
        while len(b.queue) < 2:
            threading.Event().wait(0.01)
        gate.release.set()
        with pytest.raises(BatchFailed) as e:
            bad.result(GUARD)
        assert good.result(GUARD).tolist() == [[0.0], [3.0]]
    assert str(e.value) == "RuntimeError: CUDA out of memory (simulated)"
    assert gate.sizes == [1, 1, 1, 1, 1]  # 0; 776; 777 (failed; 778 never runs); good x 2
    assert b.run(_rows(1, 5)).tolist() == [[15.0]]  # the batcher goes on
    b.close()


def test_the_batcher_outlives_a_network_that_ends_the_program():
    calls = []

    def forward(x):
        calls.append(len(x))
        if len(calls) == 1:
            raise SystemExit(3)  # a user's module calling sys.exit
        return x.sum(dim=1, keepdim=True).numpy()

    b = Batcher(forward, max_images=8, wait_ms=0)
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(BatchFailed, match="^SystemExit: 3$"):
            pool.submit(b.run, _rows(1)).result(GUARD)
        assert pool.submit(b.run, _rows(1, 2)).result(GUARD).tolist() == [[6.0]]
    b.close()


def test_learns_take_their_turn_in_arrival_order():
    async def main():
        gate, order = Turnstile(), []
        tickets = [gate.take() for _ in range(4)]

        async def learn(t, delay):
            await asyncio.sleep(delay)  # parsing / extraction finishing in any order
            await gate.turn(t)
            order.append(t)
            gate.done(t)

        await asyncio.wait_for(asyncio.gather(*(learn(t, d) for t, d in zip(
            tickets, (0.03, 0.0, 0.02, 0.01), strict=True))), GUARD)
        return order

    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_a_refused_learn_lets_the_next_take_its_turn():
    async def main():
        gate = Turnstile()
        a, b = gate.take(), gate.take()
        gate.done(a)  # refused before its turn: done all the same (app.learn's finally)
        await asyncio.wait_for(gate.turn(b), GUARD)
        return True

    assert asyncio.run(main())


# ---------------------------------------------------------------------------- CUDA (a GPU only)


@pytest.mark.cuda
def test_extraction_on_cuda_equals_the_cpus():
    from ciosl.data.extraction import open_extractor
    from ciosl.data.features import execution

    frames = np.random.default_rng(0).integers(0, 256, (40, 28, 28, 3), np.uint8)
    cpu = open_extractor("efficientnet_lite0@64", how=execution("cpu", "torch"))(frames)
    cuda = open_extractor("efficientnet_lite0@64", how=execution("cuda"))
    assert (cuda.device, cuda.backend) == ("cuda", "torch")
    z = cuda(frames)
    scale = float(np.abs(cpu).max())
    assert np.abs(z - cpu).max() <= 1e-3 * max(1.0, scale)


@pytest.mark.cuda
def test_the_served_embedder_runs_on_cuda_and_batches_there():
    from ciosl.serve.images import open_embedder

    emb = open_embedder("efficientnet_lite0@64", device="cuda")
    assert emb.extractor.pin()["device"] == "cuda" and emb.batcher.max_images == 256
    frames = np.random.default_rng(1).integers(0, 256, (16, 28, 28, 3), np.uint8)
    with ThreadPoolExecutor(16) as pool:
        z = np.concatenate(list(pool.map(lambda i: emb.frames(frames[i:i + 1]), range(16))))
    ref = emb.extractor(frames)
    assert z.shape == (16, 1280) and np.abs(z - ref).max() <= 1e-3 * max(
        1.0, float(np.abs(ref).max()))
    assert emb.batcher.batches <= 16
    emb.close()
