"""A learner's state and its files: ``state_dict`` / ``load_state_dict`` (checked as strictly as
constructor settings and learned input), ``save`` / ``load`` (a self-describing, checksummed
torch file that loading never runs code from) and ``memory_bytes``. ``Persistent`` is a part of
``ciosl.learners.base.Learner`` (a mixin); ``state_problem`` checks a state before it is
applied."""

from __future__ import annotations

import copy
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ciosl.errors import LearnerError, _describe, describe_learner, writing
from ciosl.fileio import atomic_write_bytes
from ciosl.learners.registry import available_methods, class_path, resolve_method
from ciosl.learners.settings import plain
from ciosl.serial import checksum_problem, serialize, with_checksum

if TYPE_CHECKING:
    from ciosl.learners.base import Learner

FILE_FORMAT = "ciosl-learner"  # Learner.save / Learner.load
FILE_VERSION = 1


class Persistent:
    """State and files of ``Learner``."""

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

    def load_state_dict(self, sd: dict[str, Any], *, check: bool = True) -> Learner:
        """Continue from ``sd`` (a ``state_dict``). ``check``: validate it as strictly as
        constructor settings and learned input (``ValueError`` naming the problem, and this
        learner unchanged) -- settings in range, classes unique, of one kind and matching the
        model's outputs, no NaN anywhere."""
        if not check:
            self._apply_state(sd)
            return self
        problem = state_problem(type(self), sd)
        if problem is not None:
            raise ValueError(f"{self.name}: inconsistent learner state: {problem}")
        backup = copy.deepcopy(self.state_dict())
        try:
            self._apply_state(sd)
            problem = self._output_problem()
        except Exception as e:  # tensors of the wrong shape for the classes, and the like
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            self._apply_state(backup)
            raise ValueError(f"{self.name}: inconsistent learner state: {problem}")
        return self

    def _output_problem(self) -> str | None:
        """A probe of the loaded model: one output per class, finite. Learners that retrain
        before inference (``violates_single_pass``) are not probed (too costly)."""
        if not self.classes_ or self.violates_single_pass:
            return None
        rng = self.rng.bit_generator.state, self.torch_rng.get_state()  # fresh copies
        try:
            P = np.asarray(self._predict_proba(np.zeros((1, self.dim_), np.float32)))
        finally:
            self.rng.bit_generator.state = rng[0]
            self.torch_rng.set_state(rng[1])
        if P.shape != (1, len(self.classes_)):
            return (f"the model answers with {P.shape[-1]} outputs for {len(self.classes_)} "
                    "classes")
        if not np.isfinite(P).all():
            return "the model's answers are not finite"
        return None

    def _apply_state(self, sd: dict[str, Any]) -> None:
        if sd.get("method") != self.name:
            raise ValueError(f"state of method {sd.get('method')!r} given to {self.name!r}")
        added = {k: v for k, v in type(self).added_settings.items() if k not in sd["params"]}
        for k, v in {**added, **sd["params"]}.items():  # a state older than a setting: its value
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
        self._publish()

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the learner to a self-describing file (method, settings, version, tensors).

        ``torch.save`` of plain containers and tensors, written atomically (temporary file,
        fsync, rename); ``Learner.load`` reads it with ``weights_only=True``, so loading never
        runs code from the file.
        """
        from ciosl import __version__

        data = serialize(with_checksum(
            {"format": FILE_FORMAT, "format_version": FILE_VERSION, "ciosl_version": __version__,
             "method": self.name, "class": class_path(type(self)),
             "settings": plain(self.get_params()),
             "state": self.state_dict()}), f"{describe_learner(self)}: cannot save to {path}")
        with writing(path):
            return atomic_write_bytes(path, data)

    @classmethod
    def load(cls, path: str | Path) -> Learner:
        """A learner saved with ``save``; ``Learner.load`` gives the saved method's class,
        ``SomeMethod.load`` refuses a file of another method."""
        from ciosl.data.archive import ArchiveError, check_zip
        from ciosl.fileio import check_regular

        path = check_regular(path, "ciosl learner file")  # a FIFO or a device would block
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
        missing = [k for k in ("format_version", "method", "settings", "state") if k not in blob]
        if missing:
            raise ValueError(f"{path}: damaged ciosl learner file: missing {', '.join(missing)}")
        version = blob["format_version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise ValueError(f"{path}: damaged ciosl learner file: format_version must be an "
                             f"integer, got {version!r}")
        if not isinstance(blob["method"], str) or not isinstance(blob["settings"], dict):
            raise ValueError(f"{path}: damaged ciosl learner file: method must be a name and "
                             "settings a table")
        if blob["format_version"] > FILE_VERSION:
            raise ValueError(
                f"{path} has learner file format version {blob['format_version']} (written by "
                f"ciosl {blob.get('ciosl_version')}), newer than this ciosl supports "
                f"({FILE_VERSION}); upgrade ciosl")
        method = blob["method"]
        from ciosl.learners.base import Learner

        if cls is not Learner and method != cls.name:
            raise ValueError(f"{path} holds a {method!r} learner, not {cls.name!r}; load it with "
                             "ciosl.Learner.load")
        if cls is Learner:  # a registered method, else the class the file names, imported
            spec = blob.get("class")  # from an installed module or one on sys.path
            if method not in available_methods() and isinstance(spec, str):
                problem = checksum_problem(blob)  # a damaged file imports nothing
                if problem is not None:
                    raise ValueError(f"{path}: damaged ciosl learner file: {problem}")
            cls = resolve_method(method, spec, str(path))
        try:
            learner = cls(**blob["settings"])
            learner.load_state_dict(blob["state"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None
        # last, so that a file edited into an inconsistent state gets the reason above
        problem = checksum_problem(blob)
        if problem is not None:
            raise ValueError(f"{path}: damaged ciosl learner file: {problem}")
        return learner

    def memory_bytes(self) -> int:
        """Size of the learner's state (model, memory buffers) as it would be serialized."""
        buf = io.BytesIO()
        try:
            torch.save(self.state_dict(), buf)
        except Exception as e:  # a function or an unpicklable object of the learner's own
            raise LearnerError(f"{describe_learner(self)}: its state cannot be saved "
                               f"({_describe(e)}); a state holds numbers, strings, lists, "
                               "tables and tensors") from None
        return buf.getbuffer().nbytes


def _nan_at(obj: Any, where: str) -> str | None:
    """The path of the first NaN in a nested state (tensors, arrays, numbers), or None."""
    if isinstance(obj, torch.Tensor):
        return where if obj.is_floating_point() and bool(torch.isnan(obj).any()) else None
    if isinstance(obj, np.ndarray):
        return where if obj.dtype.kind == "f" and bool(np.isnan(obj).any()) else None
    if isinstance(obj, float):
        return where if math.isnan(obj) else None
    items = (obj.items() if isinstance(obj, dict)
             else enumerate(obj) if isinstance(obj, list | tuple) else ())
    for k, v in items:
        found = _nan_at(v, f"{where}.{k}")
        if found is not None:
            return found
    return None


def state_problem(cls: type[Learner], sd: Any) -> str | None:
    """What is wrong with a ``state_dict`` for ``cls`` before it is applied (None: nothing
    found): missing keys, settings that are unknown or out of range, classes that are not
    unique integers or strings of one kind, a width or count that is not a count, NaN."""
    if not isinstance(sd, dict):
        return f"expected a table, got {type(sd).__name__}"
    need = ("method", "params", "classes", "dim", "n_seen", "rng", "torch_rng", "state")
    missing = [k for k in need if k not in sd]
    if missing:
        return f"missing {', '.join(missing)}"
    params = sd["params"]
    if not isinstance(params, dict):
        return "params must be a table of settings"
    known = {s.name for s in cls.settings()}
    unknown = sorted(set(params) - known, key=str)
    if unknown:
        return f"unknown setting(s) {', '.join(map(str, unknown))} in params"
    # every setting, but those added after the state was written (they take their old value)
    missing = sorted(known - set(params) - set(cls.added_settings))
    if missing:
        return f"params lacks setting(s) {', '.join(missing)}"
    try:
        cls(**params)
    except (ValueError, TypeError) as e:
        return f"params: {e}"
    classes = sd["classes"]
    if not isinstance(classes, list) or any(
            isinstance(c, bool) or not isinstance(c, int | str) for c in classes):
        return "classes must be a list of integers or strings"
    if len({type(c) for c in classes}) > 1:
        return "classes mix integers and strings"
    if len(set(classes)) != len(classes):
        return "classes lists a label twice"
    dim, n_seen = sd["dim"], sd["n_seen"]
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        return f"dim must be a positive integer or None, got {dim!r}"
    if dim is None and classes:
        return "classes without a model (dim is None)"
    if isinstance(n_seen, bool) or not isinstance(n_seen, int) or n_seen < 0:
        return f"n_seen must be an integer >= 0, got {n_seen!r}"
    nan = _nan_at(sd["state"], "state")
    return f"{nan} holds NaN" if nan is not None else None
