"""The learner protocol (``Learner``) and its input checks; the method registry, the settings and
the file checksums are in ``registry``, ``settings`` and ``ciosl.serial`` (re-exported here).

A learner (river / scikit-learn conventions):

- keyword-only constructor that only stores its settings; state is built lazily on the
  first sample, since the feature width and the classes are not known in advance;
- ``fit_base(Z, y)`` once (offline base initialization), then ``learn_one(z, y)`` per sample;
  a label never seen before is accepted at any time and the output grows;
- ``predict_proba(Z) -> (n, n_seen_classes)`` with columns in ``classes_`` order (order of
  first appearance), ``predict(Z)`` the argmax label; ``predict_proba_one(z) -> {label: p}``
  and ``predict_one(z)`` for one sample (river's names);
- ``state_dict()`` / ``load_state_dict()``, ``clone()`` an untrained twin.

Subclasses implement ``_init_state(dim)``, ``_add_class()``, ``_fit_base(Z, yi)``,
``_learn_one(z, yi)``, ``_predict_proba(Z)``, ``_state()`` / ``_load_state(state)`` and work with
internal class indices ``yi`` in [0, n_seen). This class maps labels, validates input and keeps
the random generators, so every method rejects bad input the same way.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.checks import MAX_FEATURE, as_values, bad_feature  # noqa: F401 (MAX_FEATURE: public here too)
from ciosl.errors import LearnerError, describe_learner, echo
from ciosl.learners.atomic import AllOrNothing
from ciosl.learners.persistence import FILE_VERSION, Persistent  # noqa: F401 (re-exported)

# the registry, the settings and the checksums live in their own modules; the names other
# modules import from here are re-exported (noqa: F401), no others
from ciosl.learners.registry import (  # noqa: F401
    available_methods,
    get_method,
    load_method,
    make_learner,
    register,
)
from ciosl.learners.settings import (  # noqa: F401 (MAX_INT_DIGITS, parse_value re-exported)
    FLOAT_RANGE,
    MAX_INT_DIGITS,
    SETTING_RANGES,
    Range,
    Setting,
    check_bound,
    check_finite,
    check_range,
    check_type,
    parse_value,
    plain,
)
from ciosl.serial import digest  # noqa: F401 (re-exported)

SMALL_BATCH = 256  # predict_proba on fewer rows runs single-threaded too
NOVELTY_DEFAULT = "1 - max probability"


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


def plain_label(label: Any, *, where: str) -> int | str:
    """``label`` as a plain ``int`` or ``str``, else ``TypeError`` naming it (shortened).
    NumPy scalars give their Python value; a subclass of int or str (an ``IntEnum``,
    ``class MyInt(int)``) gives the plain value it holds: ``int.__int__`` and ``str.__str__``
    read the value itself, whatever the subclass's own ``__int__`` / ``__str__`` say."""
    if isinstance(label, np.generic):
        label = label.item()
    if isinstance(label, bool) or not isinstance(label, int | str):
        raise TypeError(f"{where}: labels must be integers or strings, got "
                        f"{type(label).__name__} {echo(label)}")
    if type(label) is int or type(label) is str:
        return label
    return int.__int__(label) if isinstance(label, int) else str.__str__(label)


def label_array(labels: list) -> np.ndarray:
    """``labels`` (plain ints, or plain strs) as an array holding exactly those values:
    int64 when every integer fits it, else an object array of Python ints; strings as a NumPy
    string array."""
    try:
        arr = np.asarray(labels)
    except OverflowError:
        arr = None
    if arr is not None and arr.dtype.kind in "iU":  # NumPy's own choice holds them exactly
        return arr
    out = np.empty(len(labels), dtype=object)  # it would make 2**64 - 1 a float
    out[:] = labels
    return out


PROBA_TOLERANCE = 1e-3  # how far a row of probabilities may sum from 1


def proba_problem(P: Any, n: int, k: int) -> str | None:
    """What is wrong with ``P`` as the probabilities of ``n`` samples over ``k`` classes (the
    conformance suite's check (3)), or None."""
    try:
        P = np.asarray(P, dtype=np.float64)
    except (TypeError, ValueError) as e:
        return f"is not an array of numbers ({type(e).__name__}: {e})"
    if P.shape != (n, k):
        return (f"has shape {P.shape} for {n} sample(s) and {k} class(es) seen (expected "
                f"({n}, {k}): one row per sample, one column per class in classes_)")
    # each row's extremes (NaN propagates through both): two reductions, no (n, k) temporary
    low, high = (P.min(axis=1), P.max(axis=1)) if k else (np.zeros(n), np.zeros(n))
    finite = np.isfinite(low) & np.isfinite(high)
    if not finite.all():
        return f"holds NaN or infinite probabilities (row {int(np.argmin(finite))})"
    outside = (low < -PROBA_TOLERANCE) | (high > 1 + PROBA_TOLERANCE)
    if outside.any():
        return f"holds probabilities outside [0, 1] (row {int(np.argmax(outside))})"
    sums = P.sum(axis=1)
    off = np.abs(sums - 1) > PROBA_TOLERANCE
    if off.any():
        row = int(np.argmax(off))
        return f"has a row that sums to {sums[row]:.6g}, not 1 (row {row})"
    return None


def checked_proba(learner: Any, P: Any, n: int) -> np.ndarray:
    """``P`` as float64 if it is a valid answer of ``learner`` for ``n`` samples, else
    ``LearnerError`` naming the method and the problem."""
    problem = proba_problem(P, n, len(learner.classes_))
    if problem is not None:
        raise LearnerError(f"{describe_learner(learner)}: predict_proba {problem}")
    return np.asarray(P, dtype=np.float64)


# the protocol's entry points: a subclass that overrides one is wrapped too (see
# Learner.__init_subclass__), so that a learner calling sys.exit raises LearnerError instead of
# ending the program without a result (and with status 0)
GUARDED = ("fit_base", "learn_one", "learn_many", "predict_proba", "predict", "save",
           "predict_proba_one", "predict_one", "novelty_score", "state_dict", "load_state_dict",
           "memory_bytes", "score", "clone")


_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # learner -> its RLock
_LOCKS_LOCK = threading.Lock()


def lock_of(learner: Any) -> threading.RLock:
    """The lock that serialises ``learner``'s public calls (made on first use; kept outside the
    learner, so that copies, pickles and state dicts never hold one)."""
    lock = _LOCKS.get(learner)
    if lock is None:
        with _LOCKS_LOCK:
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
                with lock_of(self):
                    out = fn(self, *args, **kwargs)
                    if self.keeps_answer:  # its answer is current now: later reads need no lock
                        self._publish(reading=True)
                    return out
            with lock_of(self):
                return fn(self, *args, **kwargs)
        except SystemExit as e:
            raise LearnerError(f"{describe_learner(self)}: {fn.__name__} called "
                               f"sys.exit({e.code!r}); a learner must raise an exception, "
                               "not end the program") from None

    guarded._ciosl_no_exit = True  # type: ignore[attr-defined]
    return guarded


class Learner(AllOrNothing, Persistent):
    """Base class of every streaming learner. See the module docstring for the protocol. Its
    undo machinery is ``AllOrNothing`` (atomic.py), its state and files ``Persistent``
    (persistence.py)."""

    name: ClassVar[str] = ""
    violates_single_pass: ClassVar[bool] = False  # retrains / fine-tunes before inference
    description: ClassVar[str] = ""
    choices: ClassVar[dict[str, tuple]] = {}  # allowed values of string settings
    help: ClassVar[dict[str, str]] = {}  # one line per setting, for `ciosl methods`
    # regimes the method's definition allows (see evaluation.protocol.Regime), and why not
    # the others
    regimes: ClassVar[tuple[str, ...]] = ("streaming", "online", "batch")
    regime_note: ClassVar[str] = ""
    # settings whose default here is not the paper's, with the paper's value (e.g. gradient
    # clipping, which the paper's plain SGD does not have): reports label the results that
    # use another value, and results written before the setting existed ran at this value
    paper_values: ClassVar[dict[str, Any]] = {}

    # the sane range of each number setting, by name (``SETTING_RANGES``; a float setting not
    # listed: ``FLOAT_RANGE``); a learner extends it: ``ranges = {**Learner.ranges, ...}``
    ranges: ClassVar[dict[str, Range]] = SETTING_RANGES

    # what ``novelty_score`` measures, in words (result files and reports name it); a learner
    # with a score of its own (a distance, a predictive uncertainty) says so here
    novelty: ClassVar[str] = NOVELTY_DEFAULT

    # the attributes (objects) a prediction reads besides the learner's own: a learner whose
    # predictions read only tensors that a step replaces (the state rule) names them, and its
    # predictions from any thread answer from the last published state without waiting for a
    # learn step (``published``). None: predictions take the learner's lock.
    published_parts: ClassVar[tuple[str, ...] | None] = None
    # a learner that keeps its last answer between predictions (the closed forms: ``_answer``,
    # not part of the state) and brings it current in ``_answer_now``: a learn call after which
    # a prediction was asked brings it current before it returns and publishes it, so the next
    # prediction costs a plain one; a learn nobody asked about leaves it to the next answer
    keeps_answer: ClassVar[bool] = False

    # settings added after results began recording every setting, with the value the results
    # written before them ran at: reports read a result that lacks one at that value, not at
    # today's default (which may differ)
    added_settings: ClassVar[dict[str, Any]] = {}

    @classmethod
    def paper_values_for(cls, ordering: str) -> dict[str, Any]:
        """``paper_values`` on one ordering: a subclass adds the paper's choices that depend on
        the ordering (CIOSL's replay selection)."""
        return dict(cls.paper_values)

    # ------------------------------------------------------------------ settings
    @classmethod
    def settings(cls) -> list[Setting]:
        """The constructor's keyword arguments with their defaults (the method's settings)."""
        out = []
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.kind is not p.KEYWORD_ONLY:
                continue
            default = p.default
            t = type(default) if default is not None else type(None)
            if isinstance(default, tuple | list):
                t = tuple
            out.append(
                Setting(p.name, default, t, cls.help.get(p.name, ""), cls.choices.get(p.name))
            )
        return out

    BASE_RECIPE: ClassVar[tuple[str, ...]] = ("base_epochs", "base_batch_size")

    @classmethod
    def protocol_defaults(cls, *, ordering: str, spec: Any = None) -> dict[str, Any]:
        """Settings the benchmark protocol gives this method for a dataset and ordering
        (``experiment.resolve_settings`` applies them over the constructor's defaults, and the
        user's ``--set`` over them).

        Here: the dataset's base-initialisation recipe, ``base_epochs`` / ``base_batch_size``
        from its ``DatasetSpec``, for every method that has those settings, so that every
        learner that trains its head on the base set does it the same way. A subclass that
        adds its own defaults must merge these: ``return {**super().protocol_defaults(
        ordering=ordering, spec=spec), ...}``."""
        if spec is None:
            return {}
        names = {s.name for s in cls.settings()}
        return {name: getattr(spec, name) for name in cls.BASE_RECIPE if name in names}

    @classmethod
    def range_of(cls, name: str) -> Range | None:
        """The sane range of setting ``name``: its entry in ``ranges``, ``FLOAT_RANGE`` for a
        float setting without one, else None (an integer without one still has
        ``check_bound``'s bound; a string or a flag has none)."""
        setting = next((s for s in cls.settings() if s.name == name), None)
        return None if setting is None else cls._range(setting)

    @classmethod
    def _range(cls, setting: Setting) -> Range | None:
        return cls.ranges.get(setting.name, FLOAT_RANGE if setting.type is float else None)

    def get_params(self) -> dict[str, Any]:
        return {s.name: getattr(self, s.name) for s in self.settings()}

    def _check_settings(self) -> None:
        for s in self.settings():
            v = getattr(self, s.name)
            check_type(s, v, f"{self.name}: ")
            check_finite(s, v, f"{self.name}: ")
            check_bound(s, v, f"{self.name}: ")
            if s.choices is not None and v not in s.choices:
                raise ValueError(
                    f"{self.name}: {s.name}={echo(v)} is not valid; valid choices: "
                    f"{', '.join(map(str, s.choices))}"
                )
        if hasattr(self, "buffer") and hasattr(self, "n_replay"):
            if self.buffer <= 0:
                raise ValueError(f"{self.name}: buffer must be positive, got {self.buffer}")
            if self.buffer < self.n_replay:
                raise ValueError(
                    f"{self.name}: buffer ({self.buffer}) is smaller than n_replay ({self.n_replay})"
                )

    def _check_ranges(self) -> None:
        """Every number setting within its sane range (``range_of``), checked last: after the
        method's own checks, so that their messages stay."""
        for s in self.settings():
            check_range(s, getattr(self, s.name), self._range(s), f"{self.name}: ")

    def __init__(self, *, seed: int = 0):
        self.seed = seed

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        # subclass constructors only store their arguments; wrap them to validate choices and
        # reset the fitted state, so no subclass can forget it.
        init = cls.__dict__.get("__init__")

        def wrapped(self, *args, __init=init, **kwargs):
            if args:
                raise TypeError(f"{cls.__name__} takes keyword arguments only")
            known = {s.name for s in type(self).settings()}
            unknown = set(kwargs) - known
            if unknown:
                raise TypeError(
                    f"{type(self).name}: unknown setting(s) {', '.join(sorted(unknown))}; "
                    f"valid settings: {', '.join(sorted(known))}"
                )
            try:
                __init(self, **{k: plain(v) for k, v in kwargs.items()})
            except SystemExit as e:
                raise LearnerError(f"{describe_learner(self)}: its constructor called "
                                   f"sys.exit({e.code!r}); a learner must raise an exception, "
                                   "not end the program") from None
            if type(self).__init__ is wrapped:  # outermost constructor only
                self._check_settings()
                self._check_ranges()
                self._reset()

        for name in GUARDED:
            if name in cls.__dict__ and callable(cls.__dict__[name]):
                setattr(cls, name, _no_exit(cls.__dict__[name]))
        if init is None:
            return
        wrapped.__signature__ = inspect.signature(init)  # type: ignore[attr-defined]
        wrapped.__doc__ = init.__doc__
        cls.__init__ = wrapped  # type: ignore[method-assign]

    def _reset(self) -> None:
        self.classes_: list = []
        self._class_index: dict = {}
        self.dim_: int | None = None
        self.n_seen_: int = 0
        self.rng = np.random.default_rng(self.seed)
        self.torch_rng = torch.Generator().manual_seed(int(self.seed))
        self._asked = [False]  # shared with the published twins: a prediction since a learn

    def _answer_now(self) -> None:
        """Bring the kept answer current (``keeps_answer``)."""

    def _publish(self, reading: bool = False) -> None:
        """The state as it is now becomes the one predictions read (``published``): a shallow
        twin of the learner and of its ``published_parts`` (references to tensors no step
        writes), with its own copy of ``classes_``. O(attributes + classes). A learner that
        ``keeps_answer`` first brings its answer current, at the end of a learn only if a
        prediction was asked since the previous one (else nothing is published and the next
        prediction catches up under the lock); ``reading``: after a prediction did."""
        parts = type(self).published_parts
        if parts is None or self.dim_ is None or self.violates_single_pass:
            self.__dict__.pop("_pub", None)
            return
        if self.keeps_answer:
            asked = self._asked
            if not reading:
                if not asked[0]:
                    self.__dict__.pop("_pub", None)
                    return
                asked[0] = False
            self._answer_now()  # nothing to do after a prediction
        state = dict(self.__dict__)
        state.pop("_pub", None)
        state["classes_"] = list(self.classes_)
        for name in parts:
            part = state[name]
            twin = object.__new__(type(part))
            twin.__dict__.update(part.__dict__)
            state[name] = twin
        state["_frozen"] = True
        pub = object.__new__(type(self))
        pub.__dict__.update(state)
        self._pub = pub

    def published(self) -> Learner | None:
        """The last published state: a read-only twin that answers ``predict_proba``,
        ``predict``, ``novelty_score``... as this learner did at the end of its last call, and
        that no later call changes (None for a learner whose predictions take the lock). Its
        ``classes_`` are the columns of its answers."""
        return self.__dict__.get("_pub")

    def clone(self) -> Learner:
        """An untrained learner with the same settings."""
        return type(self)(**self.get_params())

    def __reduce__(self):
        """Copies (``copy.deepcopy``, ``pickle``) go through ``state_dict``, as files do: the
        copy learns exactly as the original from then on (a tensor viewing another, or a
        library object such as a faiss index, would not survive a copy of the attributes)."""
        return (_rebuilt, (type(self), self.get_params(), self.state_dict()))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------ input checks
    def _check_Z(self, Z: Any, *, where: str, first: int = 0) -> np.ndarray:
        Z = np.asarray(as_values(Z, where))  # a torch tensor's values; a masked value refused
        if Z.ndim == 1:
            Z = Z[None, :]
        if Z.ndim != 2:
            raise ValueError(f"{where}: features must be 2-d (n, d), got shape {Z.shape}")
        if Z.dtype.kind not in "iuf":  # not timedelta64 ("m"), which numpy counts as a number
            hint = ("; durations and dates are no features: convert them to numbers first, "
                    "e.g. Z / np.timedelta64(1, 's')") if Z.dtype.kind in "mM" else ""
            raise ValueError(f"{where}: features must be real numbers, got dtype "
                             f"{Z.dtype}{hint}")
        if Z.shape[0] == 0:
            raise ValueError(f"{where}: empty input (0 samples)")
        if Z.shape[1] == 0:
            raise ValueError(f"{where}: features of width 0 (each sample has no feature); a "
                             "sample needs at least one")
        found = bad_feature(Z)  # on the values given, before float32 turns 1e39 into inf
        if found is not None:
            raise ValueError(f"{where}: sample at position {first + found[0]} {found[1]}")
        Z = np.ascontiguousarray(Z, dtype=np.float32)  # torch.from_numpy takes no negative stride
        if self.dim_ is not None and Z.shape[1] != self.dim_:
            raise ValueError(
                f"{where}: feature width {Z.shape[1]} differs from the width seen first "
                f"({self.dim_})"
            )
        return Z

    @staticmethod
    def _check_label(label: Any, *, where: str) -> Any:
        """``label`` as a plain ``int`` or ``str``: NumPy scalars and subclasses (an
        ``IntEnum``, ``class MyInt(int)``, ``class MyStr(str)``) become the plain value they
        hold, so that what is learned can always be saved (a learner file holds only plain
        values) and compares equal to the label it was given."""
        return plain_label(label, where=where)

    def _check_label_kind(self, labels: list, where: str) -> None:
        """Integers and strings never mix in one learner (1 and "1" would be two classes that
        print alike, and ``score`` would count a right answer as wrong)."""
        first = self.classes_[0] if self.classes_ else (labels[0] if labels else None)
        for lab in labels:
            if isinstance(lab, int) is not isinstance(first, int):
                raise TypeError(
                    f"{where}: label {echo(lab)} is "
                    f"{'an integer' if isinstance(lab, int) else 'a string'}"
                    f" but this learner's labels are {'integers' if isinstance(first, int) else 'strings'}"
                    f" (first: {echo(first)}); integers and strings cannot be mixed")

    def _encode_new(self, labels: list) -> np.ndarray:
        """Internal indices of ``labels``, adding unseen labels (in order of appearance)."""
        out = np.empty(len(labels), dtype=np.int64)
        for i, lab in enumerate(labels):
            k = self._class_index.get(lab)
            if k is None:
                k = len(self.classes_)
                self.classes_.append(lab)  # first: a fault between the two leaves no index
                self._class_index[lab] = k  # entry without its class (rollback drops both)
                self._add_class()
            out[i] = k
        return out

    def _prepare(self, Z, y, where: str, *, checked: bool = False) -> tuple[np.ndarray, list]:
        """Checked features (``checked``: ``Z`` is already ``_check_Z``'s answer) and labels;
        the state is built on the first call."""
        if not checked:
            Z = self._check_Z(Z, where=where)
        y = list(np.asarray(as_values(y, where, "labels")).reshape(-1)) \
            if not isinstance(y, list) else y
        if len(y) != Z.shape[0]:
            raise ValueError(f"{where}: {Z.shape[0]} samples but {len(y)} labels")
        y = [self._check_label(v, where=where) for v in y]
        self._check_label_kind(y, where)
        if self.dim_ is None:
            self.dim_ = int(Z.shape[1])
            self._init_state(self.dim_)
        return Z, y

    # ------------------------------------------------------------------ public protocol
    def fit_base(self, Z, y) -> Learner:
        """Offline base initialization on (Z, y); the learner is unchanged if it raises."""
        y = as_values(y, "fit_base", "labels")  # a tensor's values; a masked label refused
        with self._all_or_nothing(labels=y):
            Z, y = self._prepare(Z, y, "fit_base")
            yi = self._encode_new(y)
            self._fit_base(Z, yi)
            self.n_seen_ += len(yi)
        return self

    def learn_one(self, z, y) -> None:
        """One streaming update with a single sample (z of shape (d,) or (1, d)); the learner
        is unchanged if it raises."""
        Z = self._check_Z(z, where="learn_one")
        if Z.shape[0] != 1:  # checked before _prepare may fix the feature width
            raise ValueError(f"learn_one: expects one sample, got {Z.shape[0]}")
        labels = [y] if not isinstance(y, (list, np.ndarray)) else y  # noqa: UP038 (faster)
        with self._all_or_nothing(labels=labels):
            Z, (lab,) = self._prepare(Z, labels, "learn_one", checked=True)
            (yi,) = self._encode_new([lab])
            with single_thread():
                self._learn_one(Z[0], int(yi))
            self.n_seen_ += 1

    def learn_many(self, Z, y) -> None:
        """A mini-batch (the online and batch regimes). Methods with a mini-batch update
        implement ``_learn_batch(Z, yi)``; the others learn the samples one at a time, in
        order. The whole batch is checked before anything is learned, and the learner is
        unchanged if it raises."""
        y = as_values(y, "learn_many", "labels")
        with self._all_or_nothing(labels=y):
            Z, y = self._prepare(Z, y, "learn_many")
            if not self._has_batch_update():
                if type(self).learn_one is not Learner.learn_one:  # a learn_one of its own
                    for i in range(Z.shape[0]):
                        self.learn_one(Z[i], y[i])
                    return
                with single_thread():  # learn_one's update, the rows and labels checked
                    for i in range(Z.shape[0]):
                        (yi,) = self._encode_new([y[i]])
                        self._learn_one(Z[i], int(yi))
                        self.n_seen_ += 1
                return
            yi = self._encode_new(y)
            with single_thread() if len(Z) < SMALL_BATCH else contextlib.nullcontext():
                self._learn_batch(Z, yi)
            self.n_seen_ += len(yi)

    @classmethod
    def _has_batch_update(cls) -> bool:
        """True if ``_learn_batch`` is defined at or below the class defining ``_learn_one``
        (a subclass that changes ``_learn_one`` must not inherit its parent's batch update)."""
        def owner(name: str) -> type:
            return next(k for k in cls.__mro__ if name in k.__dict__)

        return owner("_learn_batch") is not Learner and issubclass(
            owner("_learn_batch"), owner("_learn_one"))

    def predict_proba(self, Z) -> np.ndarray:
        """(n, len(classes_)) probabilities, checked: a model answering NaN, or with the wrong
        number of rows or columns, raises ``LearnerError`` instead of being scored."""
        if not self.classes_:
            raise RuntimeError(f"{self.name}: predict before any sample was learned")
        Z = self._check_Z(Z, where="predict_proba")
        with single_thread() if len(Z) < SMALL_BATCH else contextlib.nullcontext():
            return checked_proba(self, self._predict_proba(Z), len(Z))

    def novelty_score(self, Z) -> np.ndarray:
        """(n,) float64: how novel each row looks, higher meaning more likely a class never
        learned (the open-set protocol's score; ``novelty`` says what it measures). The default
        for every learner is 1 - max probability (Hendrycks & Gimpel's baseline); NCM and SLDA
        answer a distance to the nearest class mean, the Bayesian heads their predictive
        uncertainty. Reads the state only: never learns, never draws from the learner's
        generators."""
        if not self.classes_:
            raise RuntimeError(f"{self.name}: novelty_score before any sample was learned")
        Z = self._check_Z(Z, where="novelty_score")
        with single_thread() if len(Z) < SMALL_BATCH else contextlib.nullcontext():
            s = np.asarray(self._novelty_score(Z), dtype=np.float64)
        if s.shape != (len(Z),) or not np.isfinite(s).all():
            raise LearnerError(f"{describe_learner(self)}: novelty_score answered "
                               f"{'non-finite values' if s.shape == (len(Z),) else s.shape} "
                               f"for {len(Z)} samples; one finite score per sample expected")
        return s

    def _novelty_score(self, Z: np.ndarray) -> np.ndarray:
        """1 - max probability, from ``predict_proba`` (checked): a learner of the user's own
        that answers only ``predict_proba`` gets it too."""
        P = checked_proba(self, self.predict_proba(Z), len(Z))
        return 1.0 - P.max(axis=1)

    def predict(self, Z) -> np.ndarray:
        P = self.predict_proba(Z)  # checked again: a subclass may answer it its own way
        return self._labels_of(checked_proba(self, P, 1 if np.ndim(Z) == 1 else len(Z)))

    def _labels_of(self, P: np.ndarray) -> np.ndarray:
        """The label of each row's most probable class (``predict``'s answer from ``P``):
        exactly the labels learned, as ``predict_one`` answers them: int64 for integers that
        fit it, an object array of Python ints for those that do not (2**64 - 1 never becomes
        the float 1.8446744073709552e+19), strings as NumPy strings."""
        return label_array(self.classes_)[P.argmax(axis=1)]

    def predict_proba_one(self, z) -> dict:
        """Probabilities for one sample (z of shape (d,) or (1, d)) as ``{label: p}``, labels in
        ``classes_`` order (river's convention)."""
        Z = self._check_Z(z, where="predict_proba_one")
        if Z.shape[0] != 1:
            raise ValueError(f"predict_proba_one: expects one sample, got {Z.shape[0]}")
        P = self.predict_proba(Z)[0]
        return {label: float(p) for label, p in zip(self.classes_, P, strict=True)}

    def predict_one(self, z) -> Any:
        """The most probable label for one sample (z of shape (d,) or (1, d))."""
        proba = self.predict_proba_one(z)
        return max(proba, key=proba.__getitem__)

    def score(self, Z, y) -> float:
        """Accuracy; test labels never seen in training count as wrong. Labels are compared
        as the Python values they are (a list holding 2**64 - 1 would become floats)."""
        y = np.asarray(as_values(y, "score", "labels"), dtype=object).reshape(-1)
        if len(y) == 0:
            raise ValueError("score: empty test set")
        pred = self.predict(Z)
        if len(pred) != len(y):
            raise ValueError(f"score: {len(pred)} samples but {len(y)} labels")
        return float(np.mean(pred == y))

    # ------------------------------------------------------------------ to implement
    def _init_state(self, dim: int) -> None:
        raise NotImplementedError

    def _add_class(self) -> None:
        """A new class arrived; its index is len(self.classes_) - 1."""
        raise NotImplementedError

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        raise NotImplementedError

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        raise NotImplementedError

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Optional: one update on a mini-batch (n, d), (n,) (see ``learn_many``)."""
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def _rebuilt(cls: type[Learner], params: dict[str, Any], state: dict[str, Any]) -> Learner:
    """A learner of ``cls`` continued from ``state`` (``Learner.__reduce__``)."""
    learner = cls(**params)
    learner.load_state_dict(state, check=False)
    return learner


for _name in GUARDED:  # Learner's own or its parts' (state_dict, load_state_dict, memory_bytes)
    setattr(Learner, _name, _no_exit(inspect.getattr_static(Learner, _name)))


Factory = Callable[..., Learner]
