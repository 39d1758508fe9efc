"""Streaming learners. Importing this package registers every method.

The public API for writing a method (CONTRIBUTING.md, "A method"): ``Learner`` and
``register``; ``Range`` for a setting's sane values; the helpers a method may build on:

- ``MLP`` (a ReLU head, ``HIDDEN`` units by default, ``grow`` for a new class) and ``SGD`` (its
  optimizer, out of place: ``params = opt.step(params, grads)``);
- ``ReplayMemory`` (a fixed-capacity replay buffer: ``offer``, ``sample_uniform``, ``batch``,
  ``begin`` / ``commit`` / ``rollback`` for the undo record);
- ``keep`` / ``keep_attrs`` / ``restore`` (an undo record by reference) and ``Rows`` (a
  class-indexed tensor grown by capacity doubling, rolled back by truncation).
"""

from ciosl.learners import (  # noqa: F401
    acil,
    agem,
    ciosl,
    coreset_only,
    ewc,
    exstream,
    finetune,
    gdumb,
    mas,
    ncm,
    offline,
    ranpac,
    remind,
    rplda,
    slda,
    tinyer,
    vcl,
    vcl_coreset,
)
from ciosl.learners.base import Learner, available_methods, get_method, make_learner, register
from ciosl.learners.head import HIDDEN, MLP, SGD
from ciosl.learners.memory import ReplayMemory
from ciosl.learners.settings import Range
from ciosl.learners.undo import Rows, keep, keep_attrs, restore

__all__ = ["HIDDEN", "MLP", "SGD", "Learner", "Range", "ReplayMemory", "Rows",
           "available_methods", "get_method", "keep", "keep_attrs", "make_learner", "register",
           "restore"]
