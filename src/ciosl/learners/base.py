"""The learner protocol, the method registry and the shared input checks.

A learner (river / scikit-learn conventions):

- keyword-only constructor that only stores its settings; state is built lazily on the
  first sample, since the feature width and the classes are not known in advance;
- ``fit_base(Z, y)`` once (offline base initialization), then ``learn_one(z, y)`` per sample;
  a label never seen before is accepted at any time and the output grows;
- ``predict_proba(Z) -> (n, n_seen_classes)`` with columns in ``classes_`` order (order of
  first appearance), ``predict(Z)`` the argmax label;
- ``state_dict()`` / ``load_state_dict()``, ``clone()`` an untrained twin.

Subclasses implement ``_init_state(dim)``, ``_add_class()``, ``_fit_base(Z, yi)``,
``_learn_one(z, yi)``, ``_predict_proba(Z)``, ``_state()`` / ``_load_state(state)`` and work with
internal class indices ``yi`` in [0, n_seen). This class maps labels, validates input and keeps
the random generators, so every method rejects bad input the same way.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ciosl.fileio import atomic_write_bytes

_REGISTRY: dict[str, type[Learner]] = {}
FILE_FORMAT = "ciosl-learner"  # Learner.save / Learner.load
FILE_VERSION = 1


def register(cls: type[Learner]) -> type[Learner]:
    """Class decorator: make a learner available by its ``name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__qualname__} needs a class attribute `name`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load_all() -> None:
    # importing the package registers every method
    import ciosl.learners  # noqa: F401


def available_methods() -> dict[str, type[Learner]]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get_method(name: str) -> type[Learner]:
    methods = available_methods()
    if name not in methods:
        raise ValueError(f"unknown method {name!r}; valid choices: {', '.join(methods)}")
    return methods[name]


def make_learner(name: str, **settings: Any) -> Learner:
    return get_method(name)(**settings)


SMALL_BATCH = 256  # predict_proba on fewer rows runs single-threaded too


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


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    type: type
    help: str
    choices: tuple | None = None


def parse_value(setting: Setting, text: str) -> Any:
    """Parse a ``--set name=value`` string into the setting's type, with a clear error."""
    t = setting.type
    try:
        if t is bool:
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                value: Any = True
            elif low in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError(text)
        elif t in (tuple, list):
            value = tuple(int(v) for v in text.replace("[", "").replace("]", "").split(",") if v)
        elif t is type(None):
            value = None if text.lower() in ("none", "") else float(text)
        else:
            value = t(text)
    except ValueError:
        raise ValueError(
            f"setting {setting.name!r} expects {t.__name__}, got {text!r}"
        ) from None
    check_finite(setting, value)
    return value


def allows_inf(setting: Setting) -> bool:
    """A setting whose help documents what ``inf`` means (``max_grad_norm``: "inf: plain SGD")."""
    return "inf:" in setting.help or "inf " in setting.help


def check_finite(setting: Setting, value: Any, prefix: str = "") -> None:
    """Refuse NaN for every number setting, and infinity unless the setting documents it."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return
    if math.isnan(value) or (math.isinf(value) and not allows_inf(setting)):
        raise ValueError(f"{prefix}setting {setting.name!r} expects a finite number, got "
                         f"{setting.name}={value}")


class Learner:
    """Base class of every streaming learner. See the module docstring for the protocol."""

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

    def get_params(self) -> dict[str, Any]:
        return {s.name: getattr(self, s.name) for s in self.settings()}

    def _check_settings(self) -> None:
        for s in self.settings():
            v = getattr(self, s.name)
            check_finite(s, v, f"{self.name}: ")
            if s.choices is not None and v not in s.choices:
                raise ValueError(
                    f"{self.name}: {s.name}={v!r} is not valid; valid choices: "
                    f"{', '.join(map(str, s.choices))}"
                )
        if hasattr(self, "buffer") and hasattr(self, "n_replay"):
            if self.buffer <= 0:
                raise ValueError(f"{self.name}: buffer must be positive, got {self.buffer}")
            if self.buffer < self.n_replay:
                raise ValueError(
                    f"{self.name}: buffer ({self.buffer}) is smaller than n_replay ({self.n_replay})"
                )

    def __init__(self, *, seed: int = 0):
        self.seed = seed

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        # subclass constructors only store their arguments; wrap them to validate choices and
        # reset the fitted state, so no subclass can forget it.
        init = cls.__dict__.get("__init__")
        if init is None:
            return

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
            __init(self, **kwargs)
            if type(self).__init__ is wrapped:  # outermost constructor only
                self._check_settings()
                self._reset()

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

    def clone(self) -> Learner:
        """An untrained learner with the same settings."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------ input checks
    def _check_Z(self, Z: Any, *, where: str, first: int = 0) -> np.ndarray:
        Z = np.asarray(Z)
        if Z.ndim == 1:
            Z = Z[None, :]
        if Z.ndim != 2:
            raise ValueError(f"{where}: features must be 2-d (n, d), got shape {Z.shape}")
        if not np.issubdtype(Z.dtype, np.number) or np.issubdtype(Z.dtype, np.complexfloating):
            raise ValueError(f"{where}: features must be real numbers, got dtype {Z.dtype}")
        if Z.shape[0] == 0:
            raise ValueError(f"{where}: empty input (0 samples)")
        Z = Z.astype(np.float32, copy=False)
        finite = np.isfinite(Z).all(axis=1)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise ValueError(
                f"{where}: sample at position {first + bad} has NaN or infinite features"
            )
        if self.dim_ is not None and Z.shape[1] != self.dim_:
            raise ValueError(
                f"{where}: feature width {Z.shape[1]} differs from the width seen first "
                f"({self.dim_})"
            )
        return Z

    @staticmethod
    def _check_label(label: Any, *, where: str) -> Any:
        if isinstance(label, np.generic):
            label = label.item()
        if isinstance(label, bool) or not isinstance(label, int | str):
            raise TypeError(
                f"{where}: labels must be integers or strings, got {type(label).__name__} {label!r}"
            )
        return label

    def _encode_new(self, labels: list) -> np.ndarray:
        """Internal indices of ``labels``, adding unseen labels (in order of appearance)."""
        out = np.empty(len(labels), dtype=np.int64)
        for i, lab in enumerate(labels):
            k = self._class_index.get(lab)
            if k is None:
                k = len(self.classes_)
                self._class_index[lab] = k
                self.classes_.append(lab)
                self._add_class()
            out[i] = k
        return out

    def _prepare(self, Z, y, where: str) -> tuple[np.ndarray, list]:
        Z = self._check_Z(Z, where=where)
        y = list(np.asarray(y).reshape(-1)) if not isinstance(y, list) else y
        if len(y) != Z.shape[0]:
            raise ValueError(f"{where}: {Z.shape[0]} samples but {len(y)} labels")
        y = [self._check_label(v, where=where) for v in y]
        if self.dim_ is None:
            self.dim_ = int(Z.shape[1])
            self._init_state(self.dim_)
        return Z, y

    # ------------------------------------------------------------------ public protocol
    def fit_base(self, Z, y) -> Learner:
        """Offline base initialization on (Z, y)."""
        Z, y = self._prepare(Z, y, "fit_base")
        yi = self._encode_new(y)
        self._fit_base(Z, yi)
        self.n_seen_ += len(yi)
        return self

    def learn_one(self, z, y) -> None:
        """One streaming update with a single sample (z of shape (d,) or (1, d))."""
        Z = self._check_Z(z, where="learn_one")
        if Z.shape[0] != 1:  # checked before _prepare may fix the feature width
            raise ValueError(f"learn_one: expects one sample, got {Z.shape[0]}")
        Z, (lab,) = self._prepare(Z, [y] if not isinstance(y, list | np.ndarray) else y,
                                  "learn_one")
        (yi,) = self._encode_new([lab])
        with single_thread():
            self._learn_one(Z[0], int(yi))
        self.n_seen_ += 1

    def learn_many(self, Z, y) -> None:
        """A mini-batch (the online and batch regimes). Methods with a mini-batch update
        implement ``_learn_batch(Z, yi)``; the others learn the samples one at a time, in
        order. The whole batch is checked before anything is learned."""
        Z, y = self._prepare(Z, y, "learn_many")
        if not self._has_batch_update():
            for i in range(Z.shape[0]):
                self.learn_one(Z[i], y[i])
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
        if not self.classes_:
            raise RuntimeError(f"{self.name}: predict before any sample was learned")
        Z = self._check_Z(Z, where="predict_proba")
        with single_thread() if len(Z) < SMALL_BATCH else contextlib.nullcontext():
            return np.asarray(self._predict_proba(Z), dtype=np.float64)

    def predict(self, Z) -> np.ndarray:
        P = self.predict_proba(Z)
        return np.asarray(self.classes_, dtype=object)[P.argmax(axis=1)].astype(
            np.asarray(self.classes_).dtype
        )

    def score(self, Z, y) -> float:
        """Accuracy; test labels never seen in training count as wrong."""
        y = np.asarray(y)
        if len(y) == 0:
            raise ValueError("score: empty test set")
        return float(np.mean(self.predict(Z) == y))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this learner is."""
        return {
            "method": self.name,
            "params": self.get_params(),
            "classes": list(self.classes_),
            "dim": self.dim_,
            "n_seen": self.n_seen_,
            "rng": copy.deepcopy(self.rng.bit_generator.state),
            "torch_rng": self.torch_rng.get_state().clone(),
            "state": self._state() if self.dim_ is not None else None,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> Learner:
        if sd.get("method") != self.name:
            raise ValueError(f"state of method {sd.get('method')!r} given to {self.name!r}")
        for k, v in sd["params"].items():
            setattr(self, k, v)
        self._reset()
        self.dim_ = sd["dim"]
        if self.dim_ is not None:
            self._init_state(self.dim_)
            for lab in sd["classes"]:
                self._encode_new([lab])
            self._load_state(sd["state"])
        self.n_seen_ = sd["n_seen"]
        self.rng.bit_generator.state = copy.deepcopy(sd["rng"])
        self.torch_rng.set_state(sd["torch_rng"].clone())
        return self

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the learner to a self-describing file (method, settings, version, tensors).

        ``torch.save`` of plain containers and tensors, written atomically (temporary file,
        fsync, rename); ``Learner.load`` reads it with ``weights_only=True``, so loading never
        runs code from the file.
        """
        from ciosl import __version__

        buf = io.BytesIO()
        torch.save({"format": FILE_FORMAT, "format_version": FILE_VERSION,
                    "ciosl_version": __version__, "method": self.name,
                    "settings": self.get_params(), "state": self.state_dict()}, buf)
        return atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> Learner:
        """A learner saved with ``save``; ``Learner.load`` gives the saved method's class,
        ``SomeMethod.load`` refuses a file of another method."""
        from ciosl.data.archive import ArchiveError, check_zip

        path = Path(path)
        try:
            check_zip(path, "ciosl learner file")  # sizes checked before anything inflates
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except (FileNotFoundError, ArchiveError):
            raise
        except Exception as e:
            raise ValueError(f"{path} is not a readable ciosl learner file ({type(e).__name__}: "
                             f"{e})") from None
        if not isinstance(blob, dict) or blob.get("format") != FILE_FORMAT:
            raise ValueError(f"{path} is not a ciosl learner file")
        if blob["format_version"] > FILE_VERSION:
            raise ValueError(
                f"{path} has learner file format version {blob['format_version']} (written by "
                f"ciosl {blob.get('ciosl_version')}), newer than this ciosl supports "
                f"({FILE_VERSION}); upgrade ciosl")
        method = blob["method"]
        if cls is not Learner and method != cls.name:
            raise ValueError(f"{path} holds a {method!r} learner, not {cls.name!r}; load it with "
                             "ciosl.Learner.load")
        return get_method(method)(**blob["settings"]).load_state_dict(blob["state"])

    def memory_bytes(self) -> int:
        """Size of the learner's state (model, memory buffers) as it would be serialized."""
        buf = io.BytesIO()
        torch.save(self.state_dict(), buf)
        return buf.getbuffer().nbytes

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


Factory = Callable[..., Learner]
