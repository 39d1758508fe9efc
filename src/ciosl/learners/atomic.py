"""All-or-nothing learner calls: when ``fit_base``, ``learn_one`` or ``learn_many`` raises, the
learner is exactly as before, at a cost that does not grow with its state. ``AllOrNothing`` is
a part of ``ciosl.learners.base.Learner`` (a mixin): the learner's own ``_undo_record`` /
``_undo`` say what a step overwrites and how to put it back (see ``ciosl.learners.undo``)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, ClassVar

import numpy as np


def _hashable(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


_SCALARS = (int, str, np.integer, np.str_)  # a label that np.asarray leaves as one element


def _one(labels: Any) -> Any:
    """The label of a one-label list of a plain scalar (``learn_one``'s), else None: the
    answer of ``_indices_of`` without an object array (the same answer)."""
    if type(labels) is list and len(labels) == 1 and isinstance(labels[0], _SCALARS):
        return _hashable(labels[0])
    return None


class AllOrNothing:
    """The undo machinery of ``Learner`` (``_all_or_nothing`` and the hooks it calls)."""

    @contextlib.contextmanager
    def _all_or_nothing(self, labels: Any = None):
        """Leave the learner as it was if the block raises, at a cost that does not grow with
        the state: the learner's ``_undo_record`` of what learning ``labels`` may replace (by
        reference: a step never writes a published tensor in place, so the old references are
        the old state), taken before anything changes; ``_undo`` puts it back, and the classes
        added in the block are dropped by truncation. A state built in the block is dropped. A
        learner without ``_undo_record`` (one of the user's own) gets a copy of its whole
        state. Nested calls (``learn_many`` learning sample by sample) are covered by the
        outermost one."""
        if getattr(self, "_in_call", False):
            yield
            return
        # fresh copies; none for a learner whose steps draw no random number (NCM, SLDA)
        rng = (self.rng.bit_generator.state, self.torch_rng.get_state()) \
            if self._draws_random() else None
        k, dim, n_seen = len(self.classes_), self.dim_, self.n_seen_
        saved = record = None
        if dim is not None:
            if self._has_undo():
                record = self._undo_record(self._indices_of(labels))
            else:
                saved = copy.deepcopy(self.state_dict())
        # the flag is set inside the try and cleared on the try's own line in the finally (a
        # fault raised at a line, as a trace function or a signal handler does, lands inside
        # the try there, whose handler clears it again): no single fault leaves it set, which
        # would make every later call skip its record as if nested
        try:
            self._in_call = True
            yield
        except BaseException:
            if saved is not None:
                self.load_state_dict(saved, check=False)
            elif dim is None:  # the state was built in this call: back to none
                self.classes_, self._class_index, self.dim_ = [], {}, None
            else:
                self._undo(record, k)
                for lab in self.classes_[k:]:  # a fault may have come before its index entry
                    self._class_index.pop(lab, None)
                del self.classes_[k:]
            self.n_seen_ = n_seen
            if rng is not None:
                self.rng.bit_generator.state, _ = rng
                self.torch_rng.set_state(rng[1])
            raise
        else:  # the call is done: a fault while closing it leaves it done (the record ended,
            # the state published), as after a complete call; each part can be run again
            try: self._close_call(record)  # noqa: E701 (one line: see above)
            except BaseException:
                self._close_call(record)
                raise
        finally:
            try: self._in_call = False  # noqa: E701 (one line: see above)
            except BaseException:
                self._in_call = False
                raise

    def _close_call(self, record: Any) -> None:
        if record is not None:
            self._undo_done(record)
        self._publish()

    draws_random: ClassVar[bool] = True  # False: no step draws from self.rng / self.torch_rng

    @classmethod
    def _draws_random(cls) -> bool:
        """Whether a step may draw random numbers: True unless every step method (``_learn_one``,
        ``_learn_batch``, ``_fit_base``) is defined in a class that declares ``draws_random =
        False`` itself (a subclass overriding one of them may draw: its generators are saved)."""
        cached = cls.__dict__.get("_draws_random_cache")
        if cached is None:
            owners = [next(k for k in cls.__mro__ if n in k.__dict__)
                      for n in ("_learn_one", "_learn_batch", "_fit_base")]
            cached = not all(k.__dict__.get("draws_random") is False for k in owners)
            cls._draws_random_cache = cached
        return cached

    def _indices_of(self, labels: Any) -> np.ndarray:
        """The internal index each of ``labels`` has or would get (new labels: from
        len(classes_) on, in order of first appearance), without adding any."""
        index, out = self._class_index, []
        one = _one(labels)
        if one is not None:
            k = index.get(one)
            return np.array([len(self.classes_) if k is None else k], dtype=np.int64)
        new: dict = {}
        for v in np.asarray(labels, dtype=object).reshape(-1):
            v = _hashable(v)
            try:
                k = index.get(v)
                if k is None:
                    k = new.setdefault(v, len(self.classes_) + len(new))
            except TypeError:  # an unhashable label: refused by the checks later
                continue
            out.append(k)
        return np.asarray(out, dtype=np.int64)

    @classmethod
    def _has_undo(cls) -> bool:
        return cls._undo_record is not AllOrNothing._undo_record

    def _undo_record(self, yi: np.ndarray) -> Any:
        """What learning samples of classes ``yi`` (indices; those >= len(classes_) are new)
        may replace, enough for ``_undo`` to restore it: references (``undo.keep``) and the old
        values of the rows a row store overwrites, never a copy of the whole state. Not
        overridden: the whole state is copied instead."""
        raise NotImplementedError

    def _undo(self, record: Any, n_classes: int) -> None:
        """Restore what ``record`` holds and keep only the first ``n_classes`` classes."""
        raise NotImplementedError

    def _publish(self) -> None:
        """Make the state as it is now the one predictions from other threads read
        (``Learner.published``); nothing here."""

    def _undo_done(self, record: Any) -> None:
        """The call succeeded: ``record`` is dropped (a learner ends a journal here)."""
