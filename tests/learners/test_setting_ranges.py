"""Number settings without a sane range. Every float setting now lies in a range named in its
one-line error (``Learner.ranges``: per setting, by name; ``FLOAT_RANGE`` otherwise), the ends
of each range are accepted and learn, and a saved state out of range is refused."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from ciosl.learners import Learner, make_learner
from ciosl.learners.base import available_methods
from helpers import (
    snapshot,
)


def trained(method: str, **settings):
    Z, y = blobs()
    learner = make_learner(method, **settings).fit_base(Z, y)
    rng = np.random.default_rng(1)
    for i in range(4):
        learner.learn_one(rng.normal(size=D) + 4 * np.eye(D)[i % 2], i % 2)
    return learner


D = 8


def blobs(n_per_class: int = 20, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(2 * n_per_class, D)).astype(np.float32)
    Z += np.repeat(np.eye(2, D, dtype=np.float32) * 4, n_per_class, axis=0)
    return Z, np.repeat([0, 1], n_per_class)


SMALL = {"base_epochs": 1}  # the MLP heads: one base epoch is enough to have a state


# ---------------------------------------------------------------------------- constructors
# (id, method, settings, the one-line error's fragment)
SETTING_CASES = [
    ("tinyer-lr-huge", "tinyer", {"lr": 1e308},
     "tinyer: setting 'lr' must be in (0, 100], got lr=1e+308"),
    ("tinyer-wd-huge", "tinyer", {"weight_decay": 1e308},
     "tinyer: setting 'weight_decay' must be in [0, 1], got weight_decay=1e+308"),
    ("tinyer-momentum-huge", "tinyer", {"momentum": 1e308},
     "tinyer: setting 'momentum' must be in [0, 1), got momentum=1e+308"),
    ("tinyer-momentum-negative", "tinyer", {"momentum": -5},
     "tinyer: setting 'momentum' must be in [0, 1), got momentum=-5"),
    ("finetune-momentum-one", "finetune", {"momentum": 1.0},
     "finetune: setting 'momentum' must be in [0, 1), got momentum=1.0"),
    ("ciosl-momentum-one", "ciosl", {"momentum": 1.0},
     "ciosl: setting 'momentum' must be in [0, 1), got momentum=1.0"),
    ("finetune-lr-zero", "finetune", {"lr": 0},
     "finetune: setting 'lr' must be in (0, 100], got lr=0"),
    ("ciosl-lr-zero", "ciosl", {"lr": 0.0}, "ciosl: setting 'lr' must be in (0, 100], got lr=0.0"),
    ("gdumb-lr-zero", "gdumb", {"lr": 0.0}, "gdumb: setting 'lr' must be in (0, 100], got lr=0.0"),
    ("offline-lr-too-big", "offline", {"lr": 1000},
     "offline: setting 'lr' must be in (0, 100], got lr=1000"),
    ("agem-lr-too-big", "agem", {"lr": 101.0}, "agem: setting 'lr' must be in (0, 100]"),
    ("ncm-temperature-tiny", "ncm", {"temperature": 1e-308},
     "ncm: setting 'temperature' must be in [1e-6, 1e6], got temperature=1e-308"),
    ("ncm-temperature-huge", "ncm", {"temperature": 1e30},
     "ncm: setting 'temperature' must be in [1e-6, 1e6], got temperature=1e+30"),
    ("ciosl-temperature-tiny", "ciosl", {"temperature": 1e-308},
     "ciosl: setting 'temperature' must be in [1e-6, 1e6], got temperature=1e-308"),
    ("vcl-temperature-huge", "vcl", {"temperature": 1e30},
     "vcl: setting 'temperature' must be in [1e-6, 1e6]"),
    ("ciosl-mc-samples", "ciosl", {"mc_samples": 10**6},
     "ciosl: setting 'mc_samples' must be in [1, 1000], got mc_samples=1000000"),
    ("coreset-only-mc-samples", "coreset_only", {"mc_samples": 5000},
     "coreset_only: setting 'mc_samples' must be in [1, 1000]"),
    ("ciosl-lambda2-huge", "ciosl", {"lambda2": 1e300},
     "ciosl: setting 'lambda2' must be in [0, 1e6], got lambda2=1e+300"),
    ("ciosl-lambda2-negative", "ciosl", {"lambda2": -1.0},
     "ciosl: setting 'lambda2' must be in [0, 1e6], got lambda2=-1.0"),
    ("vcl-lambda1-huge", "vcl", {"lambda1": 1e7}, "vcl: setting 'lambda1' must be in [0, 1e6]"),
    ("ciosl-prior-scale-tiny", "ciosl", {"prior_scale": 1e-300},
     "ciosl: setting 'prior_scale' must be in [0.001, 1000], got prior_scale=1e-300"),
    ("vcl-coreset-fisher-decay", "vcl_coreset", {"fisher_decay": 1e-300},
     "vcl_coreset: fisher_decay must be 0 (the mean of every update: nothing forgotten) or "
     "in [1e-6, 1]"),
    ("ciosl-train-draws", "ciosl", {"train_draws": 10**6},
     "ciosl: setting 'train_draws' must be in [1, 100], got train_draws=1000000"),
    ("ewc-lam-huge", "ewc", {"lam": 1e300},
     "ewc: setting 'lam' must be in [0, 1e10], got lam=1e+300"),
    ("mas-lam-negative", "mas", {"lam": -1.0}, "mas: setting 'lam' must be in [0, 1e10], got lam=-1.0"),
    ("mas-penalty-step-huge", "mas", {"max_penalty_step": 1e300},
     "mas: setting 'max_penalty_step' must be in (0, 1e6] or inf"),
    ("finetune-clip-huge", "finetune", {"max_grad_norm": 1e300},
     "finetune: setting 'max_grad_norm' must be in (0, 1e6] or inf, got max_grad_norm=1e+300"),
    ("exstream-buffer", "exstream", {"buffer": 10**6},
     "exstream: setting 'buffer' must be in [1, 10000], got buffer=1000000"),
    ("remind-pq-subvectors", "remind", {"pq_subvectors": 10**6},
     "remind: setting 'pq_subvectors' must be in [1, 4096], got pq_subvectors=1000000"),
    ("agem-wd-two", "agem", {"weight_decay": 2.0}, "agem: setting 'weight_decay' must be in [0, 1]"),
]


@pytest.mark.parametrize(("method", "settings", "fragment"), [c[1:] for c in SETTING_CASES],
                         ids=[c[0] for c in SETTING_CASES])
def test_number_settings_out_of_their_range_are_refused(method, settings, fragment):
    with pytest.raises(ValueError) as info:
        make_learner(method, **settings)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


@pytest.mark.parametrize(("method", "setting", "value"), [
    ("ncm", "temperature", 1e-6), ("ncm", "temperature", 1e6), ("ciosl", "temperature", 1e-6),
    ("ciosl", "temperature", 1.0), ("finetune", "lr", 100), ("finetune", "momentum", 0.0),
    ("finetune", "momentum", 0.99), ("finetune", "weight_decay", 1.0),
    ("finetune", "max_grad_norm", math.inf), ("ewc", "max_penalty_step", math.inf),
    ("ciosl", "mc_samples", 1000), ("ciosl", "lambda2", 1e6), ("ewc", "lam", 1e10), ("exstream", "buffer", 10000),
    ("remind", "pq_subvectors", 4096), ("rp_lda", "proj_dim", 65536),
])
def test_the_ends_of_each_range_are_accepted(method, setting, value):
    assert make_learner(method, **{setting: value}).get_params()[setting] == value


def test_every_float_setting_of_every_method_has_a_range_that_holds_its_defaults():
    for name, cls in available_methods().items():
        learner = cls()  # the defaults are in range
        for s in cls.settings():
            allowed = cls.range_of(s.name)
            if s.type is float:
                assert allowed is not None, (name, s.name)
            if allowed is not None and not isinstance(s.default, bool):
                assert s.default in allowed or (math.isinf(s.default)), (name, s.name)
        for extra in getattr(cls, "conformance_settings", []):
            cls(**{**learner.get_params(), **extra})
        cls(**{**learner.get_params(), **cls.paper_values})
        for ordering in ("iid", "class_iid", "instance", "class_instance"):
            cls(**{**learner.get_params(), **cls.protocol_defaults(ordering=ordering)})


class Scaled(Learner):
    """A learner of the user's own with a float setting: the generic rule applies to it."""

    name = "scaled_test_learner"

    def __init__(self, *, scale: float = 10.0, seed: int = 0):
        self.scale = scale
        super().__init__(seed=seed)


def test_a_float_setting_without_a_range_of_its_own_gets_the_generic_one():
    from ciosl.learners.base import Range

    class WideScaled(Scaled):  # a learner widens a range in its own `ranges`
        name = "wide_scaled_test_learner"
        ranges = {**Learner.ranges, "scale": Range(0, 1e9)}

        def __init__(self, *, scale: float = 1e8, seed: int = 0):
            super().__init__(scale=scale, seed=seed)

    assert Scaled(scale=-1e6).scale == -1e6
    with pytest.raises(ValueError, match=re.escape(
            "scaled_test_learner: setting 'scale' must be in [-1e6, 1e6], got scale=1e+300")):
        Scaled(scale=1e300)
    assert WideScaled().scale == 1e8
    with pytest.raises(ValueError, match=re.escape("setting 'scale' must be in [0, 1e9]")):
        WideScaled(scale=-1.0)


# ---------------------------------------------------------------------------- states
def without(key: str):
    def damage(sd: dict) -> None:
        del sd["params"][key]
    return damage


def params(**kw):
    def damage(sd: dict) -> None:
        sd["params"].update(kw)
    return damage


def empty_params(sd: dict) -> None:
    sd["params"] = {}


# (id, method, damage to a state_dict of a learner trained with other settings, fragment)
LOAD_CASES = [
    ("tinyer-params-empty", "tinyer", empty_params,
     "tinyer: inconsistent learner state: params lacks setting(s) base_batch_size, base_epochs, "
     "buffer, lr, max_grad_norm, momentum, n_replay, seed, weight_decay"),
    ("ncm-params-empty", "ncm", empty_params,
     "ncm: inconsistent learner state: params lacks setting(s) seed, temperature"),
    ("tinyer-params-missing-lr", "tinyer", without("lr"),
     "tinyer: inconsistent learner state: params lacks setting(s) lr"),
    ("ciosl-params-missing-lambda2", "ciosl", without("lambda2"),
     "ciosl: inconsistent learner state: params lacks setting(s) lambda2"),
    ("tinyer-params-extra", "tinyer", params(gamma=0.5),
     "tinyer: inconsistent learner state: unknown setting(s) gamma in params"),
    ("tinyer-params-lr-huge", "tinyer", params(lr=1e308),
     "setting 'lr' must be in (0, 100], got lr=1e+308"),
    ("tinyer-params-momentum-one", "tinyer", params(momentum=1.0),
     "setting 'momentum' must be in [0, 1), got momentum=1.0"),
    ("ncm-params-temperature-huge", "ncm", params(temperature=1e30),
     "setting 'temperature' must be in [1e-6, 1e6], got temperature=1e+30"),
    ("ciosl-params-mc-samples", "ciosl", params(mc_samples=10**6),
     "setting 'mc_samples' must be in [1, 1000], got mc_samples=1000000"),
]


@pytest.mark.parametrize(("method", "damage", "fragment"), [c[1:] for c in LOAD_CASES],
                         ids=[c[0] for c in LOAD_CASES])
def test_an_incomplete_or_out_of_range_state_is_refused_and_nothing_changes(method, damage,
                                                                            fragment):
    settings = {**(SMALL if method != "ncm" else {}),
                **({"temperature": 2.0} if method == "ncm" else {"seed": 3})}
    source = trained(method, **settings)
    sd = source.state_dict()
    damage(sd)
    # the receiver has other settings: an incomplete params would have kept them
    receiver = trained(method, **(SMALL if method != "ncm" else {}))
    before = snapshot(receiver)
    with pytest.raises(ValueError) as info:
        receiver.load_state_dict(sd)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert snapshot(receiver) == before


def test_a_state_older_than_a_setting_still_loads():
    """Settings added later (``added_settings``) may be missing: they take the old value."""
    source = trained("ciosl", **SMALL)
    sd = source.state_dict()
    del sd["params"]["fisher_decay"], sd["params"]["train_draws"]
    loaded = make_learner("ciosl").load_state_dict(sd)
    assert loaded.fisher_decay == 0.01 and loaded.train_draws == 1


# ---------------------------------------------------------------------------- the effects
def test_ncm_at_the_ends_of_its_temperature_range_predicts_the_nearest_mean():
    Z, y = blobs()
    ref = make_learner("ncm").fit_base(Z, y)
    for t in (1e-6, 1e6):
        learner = make_learner("ncm", temperature=t).fit_base(Z, y)
        P = learner.predict_proba(Z)
        assert np.isfinite(P).all()
        assert (learner.predict(Z) == ref.predict(Z)).all()


@pytest.mark.parametrize("settings", [{"momentum": 0.99, "lr": 100.0, "weight_decay": 1.0},
                                      {"momentum": 0.0, "lr": 100.0, "max_grad_norm": math.inf},
                                      {"momentum": 0.99, "lr": 1e-9, "weight_decay": 0.0}])
def test_a_head_at_the_ends_of_its_ranges_learns_or_refuses_cleanly(settings):
    """At extreme values inside the ranges a step either learns (finite parameters) or raises
    the divergence error with nothing moved (a guard: the ranges leave no raw torch error)."""
    learner = make_learner("tinyer", buffer=20, base_epochs=0, **settings).fit_base(*blobs())
    for i in range(8):
        before = snapshot(learner)
        try:
            learner.learn_one(np.random.default_rng(i).normal(size=D) * 30, i % 2)
        except FloatingPointError as e:
            assert "diverged" in str(e)
            assert snapshot(learner) == before
            break
        assert all(torch.isfinite(p).all() for p in learner.net.params)


@pytest.mark.parametrize("method", ["ciosl", "vcl", "vcl_coreset", "coreset_only"])
@pytest.mark.parametrize("settings", [{"momentum": 0.0}, {"fisher_decay": 1.0}],
                         ids=["momentum-0", "fisher-decay-1"])
def test_the_bayesian_heads_learn_at_the_ends_of_their_ranges(method, settings):
    """momentum 0 (torch's fused SGD kernel refused the momentum buffer) and fisher_decay 1
    (the bias correction took log(0)) raised raw errors mid-step, after the Fisher moved."""
    learner = trained(method, **SMALL, **settings)
    assert np.isfinite(learner.predict_proba(blobs()[0])).all()
    assert set(learner.predict(blobs()[0])) <= {0, 1}
