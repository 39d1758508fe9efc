"""Streaming learners. Importing this package registers every method."""

from ciosl.learners import (  # noqa: F401
    agem,
    ciosl,
    exstream,
    finetune,
    gdumb,
    ncm,
    offline,
    remind,
    slda,
    tinyer,
)
from ciosl.learners.base import Learner, available_methods, get_method, make_learner, register

__all__ = ["Learner", "available_methods", "get_method", "make_learner", "register"]
