"""The guard around every public call of a learner: one call at a time (``lock_of``), reads
from the published state without the lock, ``sys.exit`` turned into ``LearnerError``, and an
exception raised in a method's own code (a learner of the user's own) reported as that method's
error, naming the method and its hook, not as a bug in ciosl (``user_error``)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ciosl.errors import EXPECTED, LearnerError, _describe, describe_learner

_CIOSL = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@contextlib.contextmanager
def single_thread():
    """Run torch single-threaded inside the block (restored afterwards).

    A one-sample step is a handful of small matrix products: torch's thread pool only adds
    synchronization to it, and on a loaded machine the waiting threads make it many times slower
    (a 800-sample ``learn_one`` loop of ``ciosl`` took 63 s with 2 threads vs 2.9 s with 1 on
    this 2-core machine under load). Switching costs well under a microsecond.
    """
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


# the protocol's entry points: a subclass that overrides one is wrapped too (see
# Learner.__init_subclass__), so that a learner calling sys.exit raises LearnerError instead of
# ending the program without a result (and with status 0)
GUARDED = ("fit_base", "learn_one", "learn_many", "predict_proba", "predict", "save",
           "predict_proba_one", "predict_one", "novelty_score", "state_dict", "load_state_dict",
           "memory_bytes", "score", "clone")


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # learner -> its RLock


def lock_of(learner: Any) -> threading.RLock:
    """The lock that serialises ``learner``'s public calls (made on first use; kept outside the
    learner, so that copies, pickles and state dicts never hold one)."""
    lock = _LOCKS.get(learner)
    if lock is None:  # one atomic dict.setdefault: no lock of locks, which a fault at the exit
        # of its ``with`` (a trace function's, as check_faults raises) left held for good
        lock = _LOCKS.setdefault(learner, threading.RLock())
    return lock


# the calls that only read: with a published state (``Learner.published``) they answer from
# it, without the lock, so a prediction never waits for a learn step
READS = frozenset({"predict_proba", "predict", "predict_proba_one", "predict_one",
                   "novelty_score", "score"})
# what a published state refuses: it shares the learner's replay memory and optimizer, which
# the learner writes
WRITES = frozenset({"fit_base", "learn_one", "learn_many", "save", "state_dict",
                    "load_state_dict"})


def _no_exit(fn: Callable) -> Callable:
    """``fn`` under the learner's lock (``lock_of``: one public call at a time, from any
    thread), with ``SystemExit`` turned into ``LearnerError`` naming the method. A reading call
    (``READS``) of a learner with a published state runs on that state, without the lock."""
    if getattr(fn, "_ciosl_no_exit", False):
        return fn
    reads, writes = fn.__name__ in READS, fn.__name__ in WRITES

    @functools.wraps(fn)
    def guarded(self, *args, **kwargs):
        try:
            if writes and self.__dict__.get("_frozen"):
                raise TypeError(f"{self.name}: {fn.__name__} on a published state (a read-only "
                                "twin: Learner.published); call it on the learner")
            if reads:
                state = self.__dict__
                asked = state.get("_asked")
                if asked is not None:  # a prediction was asked since the last learn
                    asked[0] = True
                if state.get("_frozen"):  # a published state: nobody writes it
                    return fn(self, *args, **kwargs)
                pub = state.get("_pub")
                if pub is not None:
                    return fn(pub, *args, **kwargs)
                return _locked(self, lambda: _read_and_publish(self, fn, args, kwargs))
            return _locked(self, lambda: fn(self, *args, **kwargs))
        except SystemExit as e:
            raise LearnerError(f"{describe_learner(self)}: {fn.__name__} called "
                               f"sys.exit({e.code!r}); a learner must raise an exception, "
                               "not end the program") from None
        except Exception as e:
            error = user_error(self, e)
            if error is None:
                raise
            raise error from e

    guarded._ciosl_no_exit = True  # type: ignore[attr-defined]
    return guarded


def _read_and_publish(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
    out = fn(self, *args, **kwargs)
    if self.keeps_answer:  # its answer is current now: later reads need no lock
        self._publish(reading=True)
    return out


def _locked(learner: Any, call: Callable[[], Any]) -> Any:
    """``call()`` holding ``learner``'s lock, released whatever is raised
    wherever: a ``with`` block leaves the lock held when a KeyboardInterrupt (or a trace
    function's fault) comes at its exit, and every other thread then waits for good. The lock
    is taken on one line (``held`` is set with it) and released in a one-line ``try`` whose
    handler releases it if the fault came before the release. Torch's grad mode (the
    thread's) is put back as it was the same way."""
    lock, grad = lock_of(learner), torch.is_grad_enabled()
    held = False
    try:
        held = lock.acquire()
        return call()
    finally:  # torch's grad mode as it was, too: a fault at the exit of a learner's
        # ``torch.no_grad()`` block left it off for the thread, and its next step failed
        try: torch.set_grad_enabled(grad); held = held and lock.release()  # noqa: E701, E702
        except BaseException:
            torch.set_grad_enabled(grad)
            if held:
                lock.release()
            raise


def _own_files(cls: type) -> set[str]:
    """The source files of ``cls`` and of its bases defined outside ciosl."""
    import inspect

    out = set()
    for k in cls.__mro__:
        if k.__module__.startswith("ciosl.") or k.__module__ in ("builtins", "abc"):
            continue
        try:
            out.add(os.path.abspath(inspect.getfile(k)))
        except (TypeError, OSError):
            continue
    return out


# expected errors a method of the user's own may raise on purpose (a refusal, a non-finite
# loss): kept as their type, their message prefixed with the method and its hook
_NAMED = (ValueError, RuntimeError, FloatingPointError)


def user_error(learner: Any, e: BaseException) -> BaseException | None:
    """The error to raise for ``e``, raised in the code of a learner of the user's own (a
    plugin), naming the method and the hook (``_init_state``, ``_learn_one``...) where it was
    raised: for an exception that is no expected error (a ``ZeroDivisionError``, an
    ``IndexError``), a ``LearnerError`` saying it is a bug of that method, not of ciosl; for an
    expected one (a ``ValueError`` the method raised on purpose), the same type with its message
    prefixed by the method and hook. None for a built-in learner, an error raised in ciosl's own
    code, or one whose message names the method already."""
    files = _own_files(type(learner))
    if not files:
        return None
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if os.path.abspath(f.filename) in files]
    if not own:
        return None
    if isinstance(e, EXPECTED):
        return _named(learner, e, own[-1].name)
    if isinstance(e, TypeError):  # ciosl's refusals of bad arguments are TypeErrors too
        last = [f for f in frames if os.path.abspath(f.filename) in files
                or os.path.abspath(f.filename).startswith(_CIOSL)][-1]
        if os.path.abspath(last.filename) not in files:
            return None
    f = own[-1]
    return LearnerError(f"{describe_learner(learner)}: {f.name} raised {_describe(e)} "
                        f"({os.path.basename(f.filename)}, line {f.lineno}): an error in the "
                        "method's own code, not in ciosl")


def _named(learner: Any, e: BaseException, hook: str) -> BaseException | None:
    """``e`` again, its type kept, its first line prefixed with ``method 'x' (mod:Cls): hook:``;
    None where that cannot be done faithfully (an ``OSError``'s fields, a type whose
    constructor takes more than a message, or a message that names the method already)."""
    who = describe_learner(learner)
    text = str(e).strip()
    if not any(type(e).__init__ is k.__init__ for k in _NAMED if isinstance(e, k)):
        return None  # a constructor of its own (or OSError's fields): keep the original
    if text.startswith(who) or text.startswith(f"{getattr(learner, 'name', '')}:"):
        return None
    try:
        out = type(e)(f"{who}: {hook}: {text or type(e).__name__}")
    except Exception:  # noqa: BLE001 (a constructor of its own: keep the original)
        return None
    return out
