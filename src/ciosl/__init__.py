"""ciosl: class-incremental online streaming learning.

Public API (``help(ciosl.NAME)`` documents each):

- ``make_learner(name, **settings)``: a new learner of a method (``ciosl methods`` lists them);
- ``available_methods()``: every method by name, those of installed plugins included;
- ``Learner``: the protocol every learner follows (subclass it for your own method);
- ``register``: class decorator that makes a ``Learner`` available by its ``name``;
- ``check_learner(cls)``: the conformance suite every learner passes, on your own learner
  (``builtin=True``: with what a method shipped with ciosl needs besides, an undo record);
- ``ciosl.learners``: the helpers a method may build on (``MLP``, ``SGD``, ``ReplayMemory``,
  ``keep`` / ``restore``, ``Rows``, ``Range``), CONTRIBUTING.md's "A method";
- ``Client(url, token=...)``: a learner served by ``ciosl serve``, behind the same calls;
- adapters: ``ciosl.river.RiverClassifier``, ``ciosl.sklearn.StreamingClassifier``.
"""

__version__ = "0.1.0"

__all__ = ["Client", "Learner", "available_methods", "check_learner", "make_learner", "register",
           "__version__"]

_LAZY = {"Learner": "ciosl.learners.base", "available_methods": "ciosl.learners.base",
         "make_learner": "ciosl.learners.base", "register": "ciosl.learners.base",
         "check_learner": "ciosl.conformance", "Client": "ciosl.serve.client"}


def __getattr__(name):  # lazy: `import ciosl` stays cheap and free of torch until needed
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ciosl' has no attribute {name!r}")


def __dir__():
    return sorted([*__all__, "river", "sklearn"])
