"""ciosl: class-incremental online streaming learning."""

__version__ = "0.1.0"

__all__ = ["Learner", "available_methods", "make_learner", "__version__"]


def __getattr__(name):  # lazy: `import ciosl` stays cheap and free of torch until needed
    if name in ("Learner", "available_methods", "make_learner"):
        from ciosl.learners import base

        return getattr(base, name)
    raise AttributeError(f"module 'ciosl' has no attribute {name!r}")
