"""A request applied to the learner, and the bounded staleness of a closed form's answers
(``ciosl serve --answer-every-ms T``).

ncm, slda, rp_lda and ranpac keep their answer between predictions and bring it current after a
learn when a prediction was asked since the previous one (docs/anytime.md): under a stream of
predictions, every learn pays that catch-up. With T > 0 the learner publishes a current answer
at most every T ms (``Learner._publish``: ``_answer_every``); in between, predictions read the
last published one, and their ``seq`` says which record it reflects (``_seq``, set by
``apply_request`` before each record and carried by the published twin). When learning pauses,
the writer brings the answer current within T ms (``refresh_answer``). T = 0, the default, is
the exact mode: every answer reflects every acknowledged learn before it."""

from __future__ import annotations

import numpy as np

from ciosl.learners.base import Learner, lock_of


def apply_request(learner: Learner, x: np.ndarray, y: list, seq: int | None = None) -> None:
    """One request's update: ``learn_one`` for one sample, ``learn_many`` for more (replay
    makes the same calls), always on an aligned, C-contiguous float32 array: the live path
    and recovery feed the learner the same layout, so they give the same bits. ``seq``: the
    record it becomes (what a state published during it reflects)."""
    x = np.require(x, np.float32, ["C_CONTIGUOUS", "ALIGNED"])
    if seq is not None:
        learner.__dict__["_seq"] = seq
    try:
        if len(y) == 1:
            learner.learn_one(x[0], y[0])
        else:
            learner.learn_many(x, y)
    except BaseException:
        if seq is not None:  # refused: the state is the previous record's
            learner.__dict__["_seq"] = seq - 1
        raise


def staleness(service) -> None:
    """At open: the learner publishes at most every ``--answer-every-ms``."""
    if service.options.answer_every_ms and service.learner.keeps_answer:
        service.learner._answer_every = service.options.answer_every_ms / 1000
        service.learner._seq = service.seq


def seq_of(service, view) -> int:
    """The last record the published state ``view`` reflects."""
    return view.__dict__.get("_seq", service.seq)


def idle_wait(service) -> tuple[float | None, bool]:
    """(how long the writer waits for a request, whether the published answer is stale)."""
    timeout = service.options.snapshot_seconds or None
    view = service.learner.published() if service.options.answer_every_ms else None
    stale = view is not None and seq_of(service, view) < service.seq
    if stale:
        timeout = min(timeout or 1e9, service.options.answer_every_ms / 1000)
    return timeout, stale


def refresh_answer(service) -> None:
    """Bring a stale published answer current (the writer, idle)."""
    from ciosl.serve.common import _one_line

    learner = service.learner
    with lock_of(learner):
        learner.__dict__["_pub_until"] = 0.0
        try:
            learner._publish()
        except Exception as e:  # the next prediction catches up under the lock instead
            learner.__dict__.pop("_pub", None)
            service.warn(f"ciosl serve: bringing the answer current failed ({_one_line(e)})")
