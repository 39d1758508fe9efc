"""Learner settings: the wrong kind of value, NaN, integers beyond their bound, a seed beyond the
generators, a memory too large to allocate: each refused in one line naming the setting."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ciosl.evaluation import experiment
from helpers import (
    cli,
    one_line_error,
    trained,
)


def test_library_refuses_nan_settings_and_repeated_seeds():
    from ciosl.learners import make_learner

    with pytest.raises(ValueError, match="'lr' expects a finite number, got lr=nan"):
        make_learner("finetune", lr=float("nan"))
    make_learner("finetune", max_grad_norm=float("inf"))  # documented: plain SGD
    with pytest.raises(ValueError, match="seeds lists seed 0 more than once"):
        experiment.validate(experiment.ExperimentSpec(dataset="digits", ordering="class_iid",
                                                      method="ncm", seeds=[0, 0]))


# (id, method, settings, pattern)
SETTING_CASES = [
    ("buffer-float", "tinyer", {"buffer": 20.5},
     "tinyer: setting 'buffer' expects an integer, got buffer=20.5 (float)"),
    ("buffer-bool", "ciosl", {"buffer": True},
     "ciosl: setting 'buffer' expects an integer, got buffer=True (bool)"),
    ("epochs-float", "finetune", {"base_epochs": 2.0},
     "setting 'base_epochs' expects an integer, got base_epochs=2.0"),
    ("lr-string", "finetune", {"lr": "0.1"}, "setting 'lr' expects a number, got lr='0.1'"),
    ("flag-int", "slda", {"streaming_update": 1},
     "setting 'streaming_update' expects true or false, got streaming_update=1"),
    ("choice-not-str", "ciosl", {"selection": 3}, "setting 'selection' expects a string"),
    ("seed-bool", "ncm", {"seed": False}, "setting 'seed' expects an integer"),
]


@pytest.mark.parametrize(("method", "settings", "pattern"), [c[1:] for c in SETTING_CASES],
                         ids=[c[0] for c in SETTING_CASES])
def test_settings_of_the_wrong_kind_are_refused(method, settings, pattern):
    from ciosl.learners import make_learner

    with pytest.raises(ValueError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
        make_learner(method, **settings)


def test_numpy_scalar_settings_save_and_load(tmp_path):
    import ciosl

    learner = trained("slda", shrinkage=np.float64(0.01), shrinkage_estimator="fixed",
                      seed=np.int64(3))
    assert type(learner.shrinkage) is float and type(learner.seed) is int
    loaded = ciosl.Learner.load(learner.save(tmp_path / "l.ciosl"))
    assert loaded.get_params() == learner.get_params()


def test_a_replay_memory_too_large_to_allocate_names_the_setting():
    from ciosl.learners.memory import ReplayMemory

    with pytest.raises(ValueError, match=r"buffer=10000000: a replay memory of 10000000 samples "
                                         r"x 10000000 features needs .* GiB, more than can be "
                                         r"allocated here; use a smaller buffer \(--buffer\)"):
        ReplayMemory(10**7, 10**7)


ALLOCATION_CASES = [  # (what torch.zeros raises for the memory, the error, its message)
    ("allocator-failure", RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. "
                                       "DefaultCPUAllocator: can't allocate memory: you tried "
                                       "to allocate 448 bytes. Error code 12"),
     ValueError, "buffer=7: a replay memory of 7 samples x 64 features needs 1.8 KiB, more than "
                 "can be allocated here; use a smaller buffer (--buffer)"),
    ("memory-error", MemoryError(), ValueError, "features needs 1.8 KiB, more than can be"),
    ("size-overflow", RuntimeError("Storage size calculation overflowed with sizes=[7, 64]"),
     ValueError, "needs 1.8 KiB, more than can be allocated"),
    ("another-runtime-error", RuntimeError("Cannot set version_counter for inference tensor"),
     RuntimeError, "buffer=7: creating a replay memory of 7 samples x 64 features failed "
                   "(RuntimeError: Cannot set version_counter for inference tensor)"),
]


@pytest.mark.parametrize(("raised", "kind", "fragment"), [c[1:] for c in ALLOCATION_CASES],
                         ids=[c[0] for c in ALLOCATION_CASES])
def test_only_a_real_allocation_failure_says_more_than_can_be_allocated(raised, kind, fragment,
                                                                       monkeypatch):
    import torch
    from sklearn.datasets import load_digits

    from ciosl.learners import make_learner

    X, y = load_digits(return_X_y=True)
    learner = make_learner("gdumb", buffer=7)
    real = torch.zeros

    def zeros(*shape, **kw):
        if shape == (7, 64):  # the memory's feature rows
            raise raised
        return real(*shape, **kw)

    monkeypatch.setattr(torch, "zeros", zeros)
    with pytest.raises(kind) as info:
        learner.learn_one(X[0].astype(np.float32), int(y[0]))
    message = str(info.value)
    assert fragment in message and "\n" not in message
    assert ("more than can be allocated" in message) == (kind is ValueError)
    assert "0.0 GiB" not in message
    monkeypatch.undo()
    learner.learn_one(X[0].astype(np.float32), int(y[0]))  # the failed call changed nothing
    assert learner.classes_ == [int(y[0])] and learner.memory_size() == 1


@pytest.mark.parametrize(("method", "setting", "value", "fragment"), [
    ("tinyer", "base_epochs", 10**9, "tinyer: setting 'base_epochs' must be <= 1000, got "
                                     "base_epochs=1000000000"),
    ("gdumb", "retrain_epochs", 5000, "setting 'retrain_epochs' must be <= 1000"),
    ("ciosl", "mc_samples", 10**8, "ciosl: setting 'mc_samples' must be <= 1000000"),
    ("rp_lda", "proj_dim", 10**9, "setting 'proj_dim' must be <= 1000000"),
    ("exstream", "n_replay", 10**7, "exstream: setting 'n_replay' must be <= 1000000"),
])
def test_integer_settings_have_an_upper_bound(method, setting, value, fragment, tmp_path,
                                              capsys):
    from ciosl.learners import make_learner

    with pytest.raises(ValueError, match=re.escape(fragment)):
        make_learner(method, **{setting: value})
    make_learner(method, **{setting: 1000 if setting.endswith("epochs") else 7})  # in range
    argv = ["run", "--dataset", "digits", "--ordering", "iid", "--method", method, "--runs", "1",
            "--set", f"{setting}={value}", "--out", str(tmp_path / "out")]
    line = one_line_error(*cli(capsys, argv))
    assert fragment in line, line


def test_a_seed_beyond_what_the_generators_take_is_refused():
    from ciosl.learners import make_learner

    with pytest.raises(ValueError, match=r"ncm: setting 'seed' must be <= 4294967295"):
        make_learner("ncm", seed=2**40)
    assert make_learner("ncm", seed=2**32 - 1).seed == 2**32 - 1


def test_a_method_declares_its_own_ranges_over_the_shared_ones():
    """``ranges = {name: (low, high)}`` (or a ``Range``) adds to the inherited ranges: the
    shared ones stay (``lr``), the declared one is checked at construction."""
    from ciosl.learners import Learner, Range

    class Own(Learner):
        name = "own-ranges"
        ranges = {"width": (1, 64), "decay": Range(0, 1, high_open=True)}

        def __init__(self, *, width: int = 8, decay: float = 0.5, lr: float = 0.1,
                     seed: int = 0):
            self.width, self.decay, self.lr = width, decay, lr
            super().__init__(seed=seed)

    assert Own.range_of("width") == Range(1, 64) and Own.range_of("lr") == Range(
        0, 100, low_open=True)
    for bad, fragment in [({"width": 65}, "'width' must be in [1, 64], got width=65"),
                          ({"decay": 1.0}, "'decay' must be in [0, 1), got decay=1.0"),
                          ({"lr": 0.0}, "'lr' must be in (0, 100], got lr=0.0")]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            Own(**bad)
    with pytest.raises(TypeError, match=r"ranges\['width'\] must be a Range or a \(low, high\)"):
        type("Bad", (Learner,), {"name": "bad-ranges", "ranges": {"width": "1..64"}})
