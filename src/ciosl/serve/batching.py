"""Dynamic batching of the images of concurrent requests (as Triton's and TorchServe's
batchers do), and the order in which learns reach their learner's writer.

``Batcher``: each request decodes and prepares its images in its own thread (Starlette's pool),
then hands the prepared tensor to one batching thread, which runs the network once per batch of
at most ``max_images`` images. It waits for more only while another request is still being
prepared (``arriving``), and at most ``wait_ms`` after the first image it holds: a lone client
never waits. A batch takes from every waiting request in turn (an equal share each, then the
room left in arrival order), so one client's 4,096 images run alongside the others' single
frames instead of ahead of them. A batch that fails in the network (out of GPU memory, for one)
fails the requests that had images in it, and only those.

``Turnstile``: learns of one learner reach its writer in the order their bodies arrived,
whatever order their parsing and extraction finish in."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

DEFAULT_WAIT_MS = 2.0
DEFAULT_IMAGES = {"cpu": 64, "cuda": 256}  # images per forward pass at most


class BatchFailed(RuntimeError):
    """The network failed on a batch: ``cause`` in one line."""


class _Job:
    __slots__ = ("x", "taken", "left", "out", "future")

    def __init__(self, x: torch.Tensor):
        self.x, self.taken, self.left = x, 0, len(x)
        self.out: np.ndarray | None = None
        self.future: Future = Future()


class Batcher:
    def __init__(self, forward: Callable[[torch.Tensor], np.ndarray], max_images: int = 64,
                 wait_ms: float = DEFAULT_WAIT_MS):
        if int(max_images) < 1:
            raise ValueError(f"--batch-images {max_images}: expected an integer >= 1")
        if not 0 <= float(wait_ms) <= 1000:
            raise ValueError(f"--batch-wait-ms {wait_ms}: expected 0..1000")
        self.forward, self.max_images, self.wait = forward, int(max_images), wait_ms / 1000
        self.queue: deque[_Job] = deque()
        self.cond = threading.Condition()
        self.arrivals = 0  # requests preparing images now: a batch may wait for them
        self.batches = 0  # forward passes run (the tests count them)
        self.images = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="ciosl-batcher", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def arriving(self):
        """Around a request's decoding and preparation: batches wait (``wait_ms`` at most)
        for the requests inside."""
        with self.cond:
            self.arrivals += 1
        try:
            yield
        finally:
            with self.cond:
                self.arrivals -= 1
                if self.arrivals == 0:  # else the next run() wakes the batcher anyway
                    self.cond.notify_all()

    def run(self, x: torch.Tensor) -> np.ndarray:
        """(n, d) features of the prepared images ``x``, extracted in the batches they join;
        ``BatchFailed`` when the network fails on one of them."""
        job = _Job(x)
        with self.cond:
            if self._stop:
                raise BatchFailed("the server is stopping")
            self.queue.append(job)
            self.cond.notify_all()
        return job.future.result()

    def close(self) -> None:
        with self.cond:
            self._stop = True
            self.cond.notify_all()
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ the batching thread
    def _take(self) -> list[tuple[_Job, int, int]]:
        """Spans (job, start, stop) of the next batch: an equal share of every waiting job,
        then the room left in arrival order. Under ``cond``."""
        room, spans = self.max_images, []
        share = max(1, room // max(1, len(self.queue)))
        for job in self.queue:
            k = min(share, job.x.shape[0] - job.taken, room)
            if k > 0:
                spans.append([job, job.taken, job.taken + k])
                job.taken += k
                room -= k
        for span in spans:
            job = span[0]
            k = min(job.x.shape[0] - job.taken, room)
            if k > 0 and span[2] == job.taken:
                span[2] += k
                job.taken += k
                room -= k
        self.queue = deque(j for j in self.queue if j.taken < j.x.shape[0])
        return [tuple(s) for s in spans]

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self._stop:
                    self.cond.wait()
                if self._stop and not self.queue:
                    return
                deadline = time.monotonic() + self.wait
                while (self.arrivals > 0 and not self._stop
                       and sum(j.x.shape[0] - j.taken for j in self.queue) < self.max_images):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                spans = self._take()
            self._run(spans)

    def _run(self, spans: list[tuple[_Job, int, int]]) -> None:
        try:
            parts = [job.x[a:b] for job, a, b in spans]
            x = parts[0] if len(parts) == 1 else torch.cat(parts)
            z = self.forward(x)
            if z.shape[0] != x.shape[0]:
                raise RuntimeError(f"{z.shape[0]} feature rows for {x.shape[0]} images")
        except BaseException as e:  # every job with images here fails, and only those
            text = str(e).strip().splitlines()
            err = BatchFailed(f"{type(e).__name__}: {text[0][:200]}" if text and text[0]
                              else type(e).__name__)
            with self.cond:
                failed = {id(job): job for job, _, _ in spans}
                self.queue = deque(j for j in self.queue if id(j) not in failed)
            for job in failed.values():  # the batching thread goes on, whatever it was
                if not job.future.done():
                    job.future.set_exception(err)
            return
        self.batches += 1
        self.images += x.shape[0]
        at = 0
        for job, a, b in spans:
            if job.future.done():  # failed in an earlier batch
                at += b - a
                continue
            if job.out is None:
                job.out = np.empty((job.x.shape[0], z.shape[1]), np.float32)
            job.out[a:b] = z[at:at + b - a]
            at += b - a
            job.left -= b - a
            if job.left == 0:
                job.future.set_result(job.out)


class Turnstile:
    """Tickets in arrival order; ``turn(t)`` waits until every earlier ticket is done.
    Used on the event loop's thread only."""

    def __init__(self):
        self.next = 0  # the next ticket given
        self.done_upto = 0  # tickets below are done
        self._done: set[int] = set()
        self._waiters: dict[int, asyncio.Future] = {}

    def take(self) -> int:
        t, self.next = self.next, self.next + 1
        return t

    async def turn(self, t: int) -> None:
        if t > self.done_upto:
            fut = asyncio.get_running_loop().create_future()
            self._waiters[t] = fut
            try:
                await fut
            finally:
                self._waiters.pop(t, None)

    def done(self, t: int) -> None:
        self._done.add(t)
        while self.done_upto in self._done:
            self._done.discard(self.done_upto)
            self.done_upto += 1
        fut = self._waiters.get(self.done_upto)
        if fut is not None and not fut.done():
            fut.set_result(None)
