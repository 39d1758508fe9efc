"""Streaming learners. Importing this package registers every method."""

from ciosl.learners import ciosl, finetune, ncm, slda  # noqa: F401
from ciosl.learners.base import Learner, available_methods, get_method, make_learner, register

__all__ = ["Learner", "available_methods", "get_method", "make_learner", "register"]
