"""The conformance suite's checks of the project's rules on a learner's state and settings, and
what each check's failure means to fix (``FIXES``):

- ``check_keyword_only``: every constructor argument is a keyword-only setting;
- ``check_private_randomness``: no step or answer draws from the global generators;
- ``check_published_twin``: a published state (``published_parts``) stays fixed while its
  learner learns;
- ``check_state_snapshot``: an earlier ``state_dict`` does not change after later learns;
- ``check_revisit_round_trip``: a state round trip, then a stream that revisits old classes;
- ``check_bad_settings``: a setting outside its declared range is refused by the constructor,
  and an integer setting of 0 or -1 is refused there or learns without a crash;
- ``check_undo_record`` (built-ins only, ``check_learner(..., builtin=True)``): the learner
  keeps an undo record (``_undo_record`` / ``_undo``) instead of a copy of its state per call.
"""

from __future__ import annotations

import inspect
import math
import random

import numpy as np
import torch

from ciosl.conformance_data import INT_LABELS, class_stream, held_out, learn, revisit_stream
from ciosl.errors import EXPECTED, LearnerError


def check_keyword_only(cls, settings) -> None:
    """(1a) Every constructor argument is a keyword-only setting (after ``*``): the settings
    are the constructor's keyword-only arguments, and nothing else is listed or saved."""
    init = inspect.signature(cls.__init__).parameters.values()
    bad = [p.name for p in init if p.name != "self" and p.kind is not p.KEYWORD_ONLY
           and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert not bad, (f"setting(s) {', '.join(bad)} of {cls.__qualname__}.__init__ are not "
                     "keyword-only, so they are no settings (not listed, checked, saved or "
                     f"cloned): write `def __init__(self, *, {bad[0]}=...)`")


def _global_rng() -> tuple:
    return (random.getstate(), np.random.get_state()[1].tobytes(),
            torch.random.get_rng_state().clone())


def _same_rng(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def check_private_randomness(cls, settings) -> None:
    """(5a) Steps and answers draw random numbers from the learner's own generators
    (``self.rng``, ``self.torch_rng``: saved, restored on a failed call, part of the state),
    never from Python's, NumPy's or torch's global ones."""
    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    before = _global_rng()
    learner = cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb])
    learn(learner, Zs[:8], ys[:8])
    learner.predict_proba(Zt)
    assert _same_rng(before, _global_rng()), (
        "the global random generators moved (random, np.random or torch's default "
        "generator): draw from self.rng / self.torch_rng (pass generator=self.torch_rng to "
        "torch), never from the global ones")


def check_published_twin(cls, settings) -> None:
    """(6d) A published state (``published()``, for a learner with ``published_parts``)
    answers the same, with the same classes, after its learner learns known and new classes:
    the parts it shares are never written in place."""
    Zb, yb, Zs, ys = class_stream()
    Zt, _ = held_out()
    half = int(np.flatnonzero(ys == 3)[0])
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    twin = learner.published()
    if twin is None:
        return
    P, classes = twin.predict_proba(Zt), list(twin.classes_)
    learn(learner, Zs[:3], ys[:3])  # known classes first: a new one may replace the tensors
    same = np.array_equal(twin.predict_proba(Zt), P) and list(twin.classes_) == classes
    learn(learner, Zs[half:], ys[half:])
    same = same and np.array_equal(twin.predict_proba(Zt), P) and list(twin.classes_) == classes
    assert same, (
        "the published state changed while the learner learned: a tensor it shares with the "
        f"learner (its attributes and published_parts {cls.published_parts}) is written in place (the state rule: a step computes new "
        "tensors and assigns them), or drop published_parts so that predictions take the lock")


def check_state_snapshot(cls, settings) -> None:
    """(6e) A ``state_dict`` is a snapshot: it is the same after the learner learns on (known
    and new classes)."""
    from ciosl.serial import digest

    Zb, yb, Zs, ys = class_stream()
    half = int(np.flatnonzero(ys == 3)[0])
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    sd = learner.state_dict()
    before = digest(sd)
    learn(learner, Zs[:3], ys[:3])  # known classes first: a new one may replace the tensors
    learn(learner, Zs[half:], ys[half:])
    assert digest(sd) == before, (
        "an earlier state_dict changed when the learner learned on: _state returns live "
        "views of tensors a step writes in place; return copies (t.clone()), or write no "
        "tensor of the state in place")


def check_revisit_round_trip(cls, settings) -> None:
    """(6f) A state round trip in the middle of a stream that revisits old classes: the
    restored learner answers and learns on exactly as the original."""
    Zb, yb, Zs, ys = revisit_stream()
    Zt, _ = held_out()
    half = len(ys) // 2
    learner = learn(cls(**settings).fit_base(Zb, [INT_LABELS[k] for k in yb]), Zs[:half],
                    ys[:half])
    restored = learner.clone().load_state_dict(learner.state_dict())
    for z in (learner, restored):
        learn(z, Zs[half:], ys[half:])
    same = (restored.classes_ == learner.classes_
            and np.array_equal(restored.predict_proba(Zt), learner.predict_proba(Zt)))
    assert same, (
        "after a state round trip the learner learns old classes differently from the "
        "original: something that changes what it learns (a count, a memory, a cache per "
        "class) is kept outside _state; put it in _state and _load_state")


def _outside(r) -> list:
    out = []
    if not math.isinf(r.low):
        out.append(r.low if r.low_open else (r.low - 1 if r.low >= 1 else r.low - 0.5))
    if not math.isinf(r.high):
        out.append(r.high if r.high_open else r.high * 2 + 1)
    return out


def check_bad_settings(cls, settings) -> None:
    """(1b) Bad settings are refused by the constructor, before any data: a number outside
    its declared range (``ranges``) with ``ValueError`` naming the setting; an integer setting
    of 0 or -1 either refused there, or accepted and then learned without a crash (an
    exception that is no clean refusal)."""
    Zb, yb, Zs, ys = class_stream()
    for s in cls.settings():
        if s.name in settings or s.name == "seed" or s.type not in (int, float):
            continue
        r = cls.range_of(s.name)
        for v in _outside(r) if r is not None else []:
            v = int(v) if s.type is int and v == int(v) else v
            if s.type is int and v != int(v):
                continue
            try:
                cls(**{**settings, s.name: v})
            except (ValueError, TypeError) as e:
                assert s.name in str(e), f"{s.name}={v!r} is refused without naming it: {e}"
                continue
            raise AssertionError(f"{s.name}={v!r} is outside its range {r} but the constructor "
                                 "accepts it: check the ranges in __init__'s wrapper (do not "
                                 "override _check_ranges)")
        if s.type is not int or r is not None:
            continue
        for v in (0, -1):
            try:
                learner = cls(**{**settings, s.name: v})
            except (ValueError, TypeError):
                continue
            try:
                learner.fit_base(Zb, [INT_LABELS[k] for k in yb])
                learn(learner, Zs[:3], ys[:3])
            except LearnerError as e:
                raise AssertionError(
                    f"{s.name}={v} passes the constructor, then: {e}; declare its range "
                    f"(ranges = {{{s.name!r}: (low, high)}}) so that it is refused at "
                    "construction") from None
            except EXPECTED:
                continue
            except Exception as e:
                raise AssertionError(
                    f"{s.name}={v} passes the constructor, then learning raises "
                    f"{type(e).__name__}: {e}; declare its range (ranges = {{{s.name!r}: "
                    "(low, high)}) so that it is refused at construction") from None


def check_undo_record(cls, settings) -> None:
    """(9a, built-ins) The learner keeps an undo record (``_undo_record`` / ``_undo``): a
    call's rollback puts back references, at a cost that does not grow with the state."""
    assert cls._has_undo(), (
        "a built-in learner keeps an undo record: define _undo_record(yi) (references: "
        "keep(obj), memory.begin()) and _undo(record, n_classes) (restore(...), "
        "memory.rollback(...)); without one every call copies the whole state")


# what to fix when a check fails, by check name (the failure's rule is the check's docstring)
FIXES = {
    "check_constructor": "store the settings in __init__ and nothing else; build the state in "
                         "_init_state(dim)",
    "check_emerging_classes": "grow the output in _add_class() and answer one column per class",
    "check_probabilities": "answer finite probabilities in [0, 1] whose rows sum to 1",
    "check_predict_is_argmax": "leave predict to Learner.predict (argmax of predict_proba)",
    "check_predict_one": "leave predict_proba_one / predict_one to Learner",
    "check_same_seed": "draw only from self.rng / self.torch_rng",
    "check_memory_layout": "read features as given (np.ascontiguousarray if a kernel needs it)",
    "check_state_round_trip": "put everything that changes what the learner does in _state, as "
                              "copies, and restore it in _load_state",
    "check_novelty_score": "answer one finite score per row; read the state only",
    "check_save_load": "a state holds numbers, strings, lists, tables and tensors",
    "check_copies": "keep nothing outside _state that a copy would lose",
    "check_memory_capacity": "never hold more than buffer items; answer memory_size()",
    "check_above_chance": "learn: the learner stays near chance on separable blobs",
    "check_bad_input": "leave input checks to Learner (do not override learn_one / predict_proba)",
    "check_failure_rolls_back": "record by reference in _undo_record what a call may replace, "
                                "and write no recorded tensor in place",
    "check_nonfinite_step_rolls_back": "check the loss before assigning the new tensors",
    "check_faults": "record everything a call may change in _undo_record (old rows included), "
                    "and keep nothing outside _state",
    "check_threads": "answer from the published state; write no shared tensor in place",
    "check_metadata": "give name, description and one help line per setting",
    "check_bad_settings": "declare each number setting's range (ranges = {name: (low, high)})",
    "check_private_randomness": "draw only from self.rng / self.torch_rng",
    "check_published_twin": "replace published tensors (new tensors, assigned), never write "
                            "them in place; or drop published_parts",
    "check_state_snapshot": "return copies from _state (t.clone()), not live views",
    "check_revisit_round_trip": "put every count, memory and per-class cache in _state",
    "check_undo_record": "define _undo_record / _undo (ciosl.learners.undo: keep, restore)",
}
