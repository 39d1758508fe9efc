"""The method registry: built-in methods by name, those of installed packages (entry points)
and those loaded by ``package.module:Class``; ``make_learner`` builds one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ciosl.errors import _describe, echo

if TYPE_CHECKING:
    from ciosl.learners.base import Learner

_REGISTRY: dict[str, type[Learner]] = {}


def register(cls: type[Learner]) -> type[Learner]:
    """Class decorator: make a learner available by its ``name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__qualname__} needs a class attribute `name`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"method name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


ENTRY_POINT_GROUP = "ciosl.learners"  # third-party packages register learners here


def _load_all() -> None:
    # importing the package registers every built-in method; then the installed plugins
    import ciosl.learners  # noqa: F401

    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            _register_external(ep.load(), f"entry point {ep.name} = {ep.value}")
        except Exception as e:  # one broken plugin must not take the built-in methods down
            import warnings

            warnings.warn(f"ciosl: learner entry point {ep.name!r} ({ep.value}) not loaded: "
                          f"{type(e).__name__}: {e}", stacklevel=2)


_plugins_loaded = False


def _register_external(cls: Any, where: str) -> type[Learner]:
    from ciosl.learners.base import Learner

    if not (isinstance(cls, type) and issubclass(cls, Learner)):
        raise TypeError(f"{where} is not a subclass of ciosl.Learner")
    if not cls.name:
        raise TypeError(f"{where}: {cls.__qualname__} needs a class attribute `name`")
    return register(cls)


def load_method(spec: str) -> type[Learner]:
    """The learner class named by ``package.module:Class`` (imported, then registered under its
    ``name``). The working folder is importable, as for ``python -m``, so a ``my_method.py``
    next to the command works as ``--method my_method:MyLearner``."""
    import importlib
    import os
    import sys

    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--method {echo(spec)}: expected package.module:Class")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"method {spec!r}: cannot import {module!r} ({e})") from None
    except (Exception, SystemExit) as e:  # the user's module is broken, not ciosl
        raise ValueError(f"method {spec!r}: importing module {module!r} failed: "
                         f"{_describe(e)}") from None
    for part in attr.split("."):
        try:
            found = hasattr(obj, part)
            obj = getattr(obj, part) if found else obj
        except (Exception, SystemExit) as e:  # a module __getattr__ or a property that raises
            raise ValueError(f"method {spec!r}: reading {attr!r} from module {module!r} failed: "
                             f"{_describe(e)}") from None
        if not found:
            raise ValueError(f"method {spec!r}: module {module!r} has no {attr!r}")
    try:
        return _register_external(obj, f"method {spec!r}")
    except TypeError as e:
        raise ValueError(str(e)) from None


def class_path(cls: type) -> str | None:
    """``package.module:Class``, the import path a learner file and a served folder record for
    ``cls`` so that a new process finds it (``import_class``); None for a class no other process
    can import: one defined in ``__main__`` or inside a function."""
    module, qualname = cls.__module__, cls.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


def import_class(spec: str, method: str, where: str, *, cwd: bool = False) -> type[Learner]:
    """The learner class recorded as ``spec`` (``class_path``) for a method named ``method``,
    imported with ``importlib`` from an installed module or one on ``sys.path`` (never from the
    bytes of a file) and registered; else ``ValueError`` in one line, starting with ``where``,
    saying what to install or import. ``cwd``: the working folder is importable too, as for
    ``--method`` on the command line."""
    import importlib
    import os
    import sys

    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{where}: method {method!r} is recorded as {echo(spec)}, not "
                         "package.module:Class")
    if cwd and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"{where}: method {method!r} is the class {spec}, and module {module!r} "
                         f"cannot be imported here ({e}): install the package that provides it, "
                         "or put its folder on PYTHONPATH") from None
    except (Exception, SystemExit) as e:  # the user's module is broken, not ciosl
        raise ValueError(f"{where}: method {method!r}: importing module {module!r} failed: "
                         f"{_describe(e)}") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"{where}: method {method!r} is the class {spec}, and module "
                             f"{module!r} has no {attr!r} (renamed? import the module that "
                             "defines it, then load)")
    cls = _register_external(obj, f"{where}: {spec}")
    if cls.name != method:
        raise ValueError(f"{where}: {spec} is now method {cls.name!r}, not {method!r}")
    return cls


def resolve_method(method: str, spec: str | None, where: str, *,
                   cwd: bool = False) -> type[Learner]:
    """The class of a recorded method: the registered one by ``method``, else the class at
    ``spec`` (``import_class``), else ``ValueError`` saying what to import."""
    registered = available_methods()
    if method in registered:
        return registered[method]
    if isinstance(spec, str) and spec:
        return import_class(spec, method, where, cwd=cwd)
    raise ValueError(f"{where}: method {method!r} is not registered here and no import path is "
                     "recorded (a learner of your own: import its module first)")


def available_methods() -> dict[str, type[Learner]]:
    """Every registered method by name: the built-in ones, those of installed packages (entry
    point group ``ciosl.learners``) and those loaded by ``package.module:Class``."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get_method(name: str) -> type[Learner]:
    """The learner class of a method name, or of ``package.module:Class``."""
    if ":" in name:
        _load_all()
        return load_method(name)
    methods = available_methods()
    if name not in methods:
        raise ValueError(f"unknown method {echo(name)}; valid choices: {', '.join(methods)} (or "
                         "package.module:Class for a learner defined elsewhere)")
    return methods[name]


def make_learner(name: str, **settings: Any) -> Learner:
    """A new, untrained learner of method ``name`` (see ``available_methods()`` or
    ``ciosl methods``) with the given settings, e.g. ``make_learner("ciosl", buffer=500)``;
    settings left out take the method's defaults."""
    return get_method(name)(**settings)
