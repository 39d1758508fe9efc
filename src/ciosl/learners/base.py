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
import inspect
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.checks import MAX_FEATURE, as_values, bad_feature  # noqa: F401 (MAX_FEATURE: public here too)
from ciosl.errors import LearnerError, describe_learner, echo
from ciosl.learners.answers import (  # noqa: F401 (re-exported)
    PROBA_TOLERANCE,
    checked_proba,
    label_array,
    plain_label,
    proba_problem,
)
from ciosl.learners.atomic import AllOrNothing
from ciosl.learners.guard import (  # noqa: F401 (re-exported)
    GUARDED,
    READS,
    WRITES,
    _no_exit,
    lock_of,
    single_thread,
    user_error,
)
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
    Configurable,
    Range,
    Setting,
    as_ranges,
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


class Learner(AllOrNothing, Persistent, Configurable):
    """Base class of every streaming learner. See the module docstring for the protocol. Its
    undo machinery is ``AllOrNothing`` (atomic.py), its state and files ``Persistent``
    (persistence.py), its settings ``Configurable`` (settings.py), the guard of its public calls
    ``guard.py``."""

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

    def __init__(self, *, seed: int = 0):
        self.seed = seed

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "ranges" in cls.__dict__:  # a method's own ranges, over those it inherits
            cls.ranges = as_ranges(cls.__dict__["ranges"], super(cls, cls).ranges)
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
            except Exception as e:
                error = user_error(self, e)
                if error is None:
                    raise
                raise error from e
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
            if not reading and not asked[0]:
                self.__dict__.pop("_pub", None)
                return
            if (not reading and "_pub" in self.__dict__ and self.__dict__.get("_answer_every")
                    and time.monotonic() < self.__dict__.get("_pub_until", 0.0)):
                return  # bounded staleness (ciosl serve --answer-every-ms): the answer stands
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
        if self.__dict__.get("_answer_every"):  # published at most every _answer_every seconds
            self._pub_until = time.monotonic() + self._answer_every
        if self.keeps_answer and not reading:  # last: a publish cut short is done again whole
            asked[0] = False

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
        raise NotImplementedError(f"{self.name}: the method lacks _init_state(dim): build the state for features of width dim")

    def _add_class(self) -> None:
        """A new class arrived; its index is len(self.classes_) - 1."""
        raise NotImplementedError(f"{self.name}: the method lacks _add_class(): one more class "
                                  "(index len(classes_) - 1)")

    def _fit_base(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Optional: the base initialization; by default each sample in turn, as ``_learn_one``
        (a method with an offline recipe, several epochs, overrides it)."""
        for z, k in zip(Z, yi, strict=True):
            self._learn_one(z, int(k))

    def _learn_one(self, z: np.ndarray, yi: int) -> None:
        raise NotImplementedError(f"{self.name}: the method lacks _learn_one(z, yi): learn one sample of class index yi")

    def _predict_proba(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{self.name}: the method lacks _predict_proba(Z): (n, classes) probabilities")

    def _learn_batch(self, Z: np.ndarray, yi: np.ndarray) -> None:
        """Optional: one update on a mini-batch (n, d), (n,) (see ``learn_many``)."""
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        raise NotImplementedError(f"{self.name}: the method lacks _state(): a table of copies of the state")

    def _load_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{self.name}: the method lacks _load_state(state): the state back from _state's table")


def _rebuilt(cls: type[Learner], params: dict[str, Any], state: dict[str, Any]) -> Learner:
    """A learner of ``cls`` continued from ``state`` (``Learner.__reduce__``)."""
    learner = cls(**params)
    learner.load_state_dict(state, check=False)
    return learner


for _name in GUARDED:  # Learner's own or its parts' (state_dict, load_state_dict, memory_bytes)
    setattr(Learner, _name, _no_exit(inspect.getattr_static(Learner, _name)))


Factory = Callable[..., Learner]
