"""The conformance suite catches each kind of wrong learner (a test of the suite itself): a
correct learner passes ``check_learner(..., builtin=True)``, and each learner below, wrong in one
way, fails the check of its rule, with a message that names the rule and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ciosl
from ciosl.learners import Learner, registry
from ciosl.learners.undo import keep_attrs, restore


class Means(Learner):
    """Running class means, softmax over negative squared distances; the state rule kept."""

    name = "catch-means"
    description = "running class means (a correct learner)"
    help = {"scale": "softmax scale", "seed": "seed"}
    published_parts = ()  # predictions read sums and counts, which steps replace

    def __init__(self, *, scale: float = 1.0, seed: int = 0):
        self.scale = scale
        super().__init__(seed=seed)

    def _init_state(self, dim):
        self.sums = torch.zeros(0, dim, dtype=torch.float64)
        self.counts = torch.zeros(0, dtype=torch.float64)

    def _add_class(self):
        self.sums = torch.cat([self.sums, self.sums.new_zeros(1, self.sums.shape[1])])
        self.counts = torch.cat([self.counts, self.counts.new_zeros(1)])

    def _learn_one(self, z, yi):
        one = torch.zeros_like(self.counts)
        one[yi] = 1
        self.sums = self.sums + one[:, None] * torch.from_numpy(z).double()
        self.counts = self.counts + one

    def _predict_proba(self, Z):
        means = self.sums / self.counts.clamp(min=1)[:, None]
        d = torch.cdist(torch.from_numpy(Z).double(), means) ** 2
        return torch.softmax(-self.scale * d / Z.shape[1], dim=1).numpy()

    def _undo_record(self, yi):
        return keep_attrs(self, ("sums", "counts"))

    def _undo(self, record, n_classes):
        restore(record)

    def _state(self):
        return {"sums": self.sums.clone(), "counts": self.counts.clone()}

    def _load_state(self, state):
        self.sums, self.counts = state["sums"].clone(), state["counts"].clone()


class InPlace(Means):
    """Known-class rows written in place (a step's ``+=`` into the state)."""

    published_parts = None

    def _learn_one(self, z, yi):
        self.sums[yi] += torch.from_numpy(z).double()
        self.counts[yi] += 1


class MissesOldRows(InPlace):
    """An undo record that only truncates the new classes: old rows written are not put back."""

    def _undo_record(self, yi):
        return None

    def _undo(self, record, n_classes):
        self.sums, self.counts = self.sums[:n_classes], self.counts[:n_classes]


class GlobalRNG(Means):
    def _learn_one(self, z, yi):
        super()._learn_one(z + np.random.normal(0, 1e-3, z.shape).astype(z.dtype), yi)


class MemoryOutsideState(Means):
    def _state(self):
        return {"sums": self.sums.clone()}

    def _load_state(self, state):
        self.sums = state["sums"].clone()
        self.counts = torch.ones(len(self.sums), dtype=torch.float64)


class NoHelp(Means):
    help = {"seed": "seed"}


class Positional(Means):
    def __init__(self, scale: float = 1.0, *, seed: int = 0):
        self.scale = scale
        Learner.__init__(self, seed=seed)


class TwinInPlace(Means):
    """Declares published_parts, then writes the shared tensors in place (no undo record)."""

    _undo_record = Learner._undo_record

    def _learn_one(self, z, yi):
        self.sums[yi] += torch.from_numpy(z).double()
        self.counts[yi] += 1


class LiveViews(TwinInPlace):
    published_parts = None

    def _state(self):
        return {"sums": self.sums, "counts": self.counts}


WRONG = [  # (learner, builtin mode, the checks that may catch it first, a fragment of the fix)
    (MissesOldRows, True, {"check_failure_rolls_back", "check_faults"}, "_undo_record"),
    (InPlace, True, {"check_failure_rolls_back", "check_faults"}, "_undo_record"),
    (GlobalRNG, False, {"check_same_seed", "check_private_randomness"}, "self.rng"),
    (MemoryOutsideState, False, {"check_state_round_trip"}, "_state"),
    (NoHelp, False, {"check_metadata"}, "one help line per setting"),
    (Positional, False, {"check_constructor"}, "not keyword-only"),
    (TwinInPlace, False, {"check_published_twin"}, "published_parts"),
    (LiveViews, False, {"check_state_snapshot"}, "live views"),
]


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_the_correct_learner_passes_as_a_builtin():
    passed = ciosl.check_learner(Means, builtin=True)
    assert "check_undo_record" in passed and "check_published_twin" in passed


@pytest.mark.parametrize(("cls", "builtin", "checks", "fix"), WRONG,
                         ids=[w[0].__name__ for w in WRONG])
def test_each_wrong_learner_is_caught_with_its_rule_and_fix(cls, builtin, checks, fix):
    cls.name = f"catch-{cls.__name__.lower()}"
    with pytest.raises(AssertionError) as err:
        ciosl.check_learner(cls, builtin=builtin)
    text = str(err.value)
    failed = text.split(" fails ", 1)[1].split(" ", 1)[0]
    assert failed in checks, text
    assert "rule: " in text and "fix: " in text, text
    assert fix in text, text


class Plugin(Means):
    name = "catch-plugin"
    _undo_record = Learner._undo_record


def test_a_plugin_without_undo_record_passes_as_a_plugin_not_as_a_builtin():
    assert ciosl.check_learner(Plugin)
    with pytest.raises(AssertionError, match="fails check_undo_record .*keeps an undo record"):
        ciosl.check_learner(Plugin, builtin=True)
