"""Streaming learners. Importing this package registers every method."""

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

__all__ = ["Learner", "available_methods", "get_method", "make_learner", "register"]
