"""Learner settings: their description (``Setting``), parsing from ``--set`` text, and the
checks of their types, bounds and sane ranges (``SETTING_RANGES``)."""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ciosl.errors import echo


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
    if t is int and _DIGITS.fullmatch(text.strip()) and len(text.strip()) > MAX_INT_DIGITS:
        # int() refuses more than 4300 digits as if it were no integer at all
        digits = len(text.strip().lstrip("+-"))
        sign = "a negative one" if text.strip().startswith("-") else "one"
        raise ValueError(f"setting {setting.name!r} expects an integer <= "
                         f"{int_bound(setting.name)}, got {sign} of {digits:,} digits")
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
            f"setting {setting.name!r} expects {t.__name__}, got {echo(text)}"
        ) from None
    if isinstance(value, float) and math.isinf(value) and "inf" not in text.lower():
        raise ValueError(f"setting {setting.name!r} expects a finite number, got {echo(text)}: "
                         "too large for a float (it reads as inf)")
    check_finite(setting, value)
    return value


def plain(value: Any) -> Any:
    """``value`` with NumPy scalars made Python numbers (inside lists and tuples too): a setting
    of ``np.float64(0.1)`` would make a saved learner unreadable with ``weights_only=True``."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               tuple: "a list of integers"}


def check_type(setting: Setting, value: Any, prefix: str = "") -> None:
    """Refuse a value of the wrong kind for a setting: ``buffer=20.5`` or ``buffer=True`` for an
    integer, a string for a number, ``1`` for a flag (settings whose default is None take any
    value: their kind is not known)."""
    t = setting.type
    if t is type(None) or t not in _TYPE_WORDS:
        return
    if t is bool:
        ok = isinstance(value, bool)
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif t is str:
        ok = isinstance(value, str)
    else:
        ok = isinstance(value, tuple | list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok:
        raise ValueError(f"{prefix}setting {setting.name!r} expects {_TYPE_WORDS[t]}, got "
                         f"{setting.name}={echo(value)} ({type(value).__name__})")



def allows_inf(setting: Setting) -> bool:
    """A setting whose help documents what ``inf`` means (``max_grad_norm``: "inf: plain SGD")."""
    return "inf:" in setting.help or "inf " in setting.help


MAX_EPOCHS = 1000  # an *_epochs setting (base_epochs, retrain_epochs, ...), as --epochs
MAX_SEED = 2**32 - 1  # what every generator here accepts
MAX_INT_DIGITS = 30  # --set text of more digits is refused as too large, unparsed
_DIGITS = re.compile(r"[+-]?[0-9]+")
MAX_INT_SETTING = 10**6  # any other integer setting: buffer, n_replay, refresh_every, ...
# (those that multiply memory or work have a tighter range too: SETTING_RANGES, checked later)


def check_bound(setting: Setting, value: Any, prefix: str = "") -> None:
    """Refuse an integer setting so large that the run would never end or never allocate
    (``base_epochs=10**9``, ``mc_samples=10**8``): each kind has a sane upper bound."""
    if setting.type is not int or isinstance(value, bool) or not isinstance(value, int):
        return
    name = setting.name
    bound = int_bound(name)
    if value > bound:
        raise ValueError(f"{prefix}setting {name!r} must be <= {bound}, got {name}={echo(value)}")


def int_bound(name: str) -> int:
    """The largest value an integer setting called ``name`` may take."""
    return (MAX_EPOCHS if name.endswith("epochs") else MAX_SEED if name == "seed"
            else MAX_INT_SETTING)


@dataclass(frozen=True)
class Range:
    """The sane values of a number setting: ``Range(0, 1, high_open=True)`` is [0, 1)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, x: Any) -> bool:
        above = x > self.low if self.low_open else x >= self.low
        below = x < self.high if self.high_open else x <= self.high
        return bool(above and below)

    def __str__(self) -> str:
        return (f"{'(' if self.low_open else '['}{_short(self.low)}, {_short(self.high)}"
                f"{')' if self.high_open else ']'}")


def _short(x: float) -> str:
    """``0``, ``100``, ``0.001``, ``1e6``, ``1e-6``: a range's end as people write it."""
    if x == int(x) and abs(x) < 1e5:
        return str(int(x))
    return f"{x:g}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")


# A float setting without a range of its own (a learner of the user's own, a new setting):
# beyond +-1e6 a weight, a scale or a rate is a typo, and it overflows float32 arithmetic.
FLOAT_RANGE = Range(-1e6, 1e6)

# The sane range of each number setting, by name (``Learner.ranges``; a learner may widen or
# narrow one in its own ``ranges``). Checked after the method's own checks (``_check_ranges``):
# those name finer conditions, and relations between settings, first.
SETTING_RANGES: dict[str, Range] = {
    # SGD: lr 0 learns nothing, and far beyond the stability bound lr < 4 (1 + m) / ||x||^2
    # of head.check_finite every step diverges (100 still shows the divergence message);
    # momentum >= 1 never converges (the buffer sums every gradient ever seen)
    "lr": Range(0, 100, low_open=True),
    "momentum": Range(0, 1, high_open=True),
    "weight_decay": Range(0, 1),
    # caps (inf where the help documents it, ``allows_inf``: no cap)
    "max_grad_norm": Range(0, 1e6, low_open=True),
    "max_penalty_step": Range(0, 1e6, low_open=True),
    # weights of loss terms; EWC / MAS weigh importances of 1e-6 and less (their penalty step
    # is capped by max_penalty_step), so their lam reaches far higher
    "lam": Range(0, 1e10),
    "lambda1": Range(0, 1e6),
    "lambda2": Range(0, 1e6),
    # NCM's softmax temperature (on squared distances) and the Bayesian heads' posterior
    # temperature (evidence N / T in float32 precisions): outside, the softmax is a one-hot of
    # NaN or exactly uniform (predict would answer the first class), the precision overflows
    "temperature": Range(1e-6, 1e6),
    # EMA rate of the Fisher: below 1e-6 its bias correction 1 / (1 - (1 - r)^t) overflows;
    # 0 is the running mean of every update (the Bayesian heads refuse (0, 1e-6))
    "fisher_decay": Range(0, 1),
    "shrinkage": Range(0, 1),
    # initial prior N(0, s^2 / fan_in): its precision fan_in / s^2 is float32
    "prior_scale": Range(1e-3, 1e3),
    # integers that multiply memory or work beyond the generic MAX_INT_SETTING: k weight draws
    # of the whole head at predict time (prediction=mc), train_draws forward/backward passes
    # per step, pq_subvectors padded feature columns per stored item
    "mc_samples": Range(1, 1000),
    "train_draws": Range(1, 100),
    "pq_subvectors": Range(1, 4096),
    # sizes that are counts of units or rows: 0 builds an empty layer (a plugin's division by
    # zero at its first sample) or an empty batch
    "hidden": Range(1, 1e6),
    "batch_size": Range(1, 1e6),
    "base_batch_size": Range(1, 1e6),
}


def check_range(setting: Setting, value: Any, allowed: Range | None, prefix: str = "") -> None:
    """Refuse a number setting outside its sane range ``allowed`` (None: no range; ``inf``
    passes where the setting documents it, ``allows_inf``)."""
    if allowed is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    inf = allows_inf(setting)
    if (math.isinf(value) and inf) or value in allowed:
        return
    name = setting.name
    raise ValueError(f"{prefix}setting {name!r} must be in {allowed}{' or inf' if inf else ''}, "
                     f"got {name}={echo(value)}")


def check_finite(setting: Setting, value: Any, prefix: str = "") -> None:
    """Refuse NaN for every number setting, and infinity unless the setting documents it."""
    if isinstance(value, bool) or not isinstance(value, float | np.floating):
        return  # an integer is finite (and math.isnan(10**400) would overflow)
    if math.isnan(value) or (math.isinf(value) and not allows_inf(setting)):
        raise ValueError(f"{prefix}setting {setting.name!r} expects a finite number, got "
                         f"{setting.name}={echo(value)}")


def as_ranges(declared: dict, inherited: dict) -> dict[str, Range]:
    """A learner's ``ranges``: the inherited ones updated by those it declares, each a
    ``Range`` or a ``(low, high)`` pair (both ends included)."""
    out = dict(inherited)
    for name, r in declared.items():
        if isinstance(r, tuple) and len(r) == 2:
            r = Range(*r)
        if not isinstance(r, Range):
            raise TypeError(f"ranges[{name!r}] must be a Range or a (low, high) pair, got "
                            f"{echo(r)}")
        out[name] = r
    return out


class Configurable:
    """The settings of ``ciosl.learners.base.Learner`` (a mixin): the constructor's keyword-only
    arguments, their defaults from the benchmark protocol, and their checks (type, bound,
    choices, sane range)."""

    help: ClassVar[dict[str, str]] = {}
    choices: ClassVar[dict[str, tuple]] = {}
    ranges: ClassVar[dict[str, Range]] = {}

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
