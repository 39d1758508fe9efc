"""CONTRIBUTING's complete method (its "A method" section) runs and passes the conformance
suite: the page a method author copies from is code that works."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import ciosl
from ciosl.learners import registry

ROOT = Path(__file__).resolve().parents[1]


def _method_source() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## A method", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section shows one complete method"
    return blocks[0]


def test_the_contributing_method_passes_the_conformance_suite(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registered here only
    (tmp_path / "contributing_method.py").write_text(_method_source())
    monkeypatch.syspath_prepend(str(tmp_path))  # a module of its own: copies pickle it by name
    import importlib

    cls = importlib.import_module("contributing_method").ReplayHead
    passed = ciosl.check_learner(cls)
    assert any(p.startswith("check_faults") for p in passed)
    learner = cls()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6)).astype(np.float32) + np.repeat(np.arange(4), 10)[:, None]
    for z, c in zip(X, np.repeat(np.arange(4), 10), strict=True):
        learner.learn_one(z, int(c))
    assert learner.score(X, np.repeat(np.arange(4), 10)) > 0.5
    assert learner.published() is not None


def test_the_contributing_method_is_short():
    """TinyER-sized: a method author reads it on one screen or two."""
    assert len(_method_source().splitlines()) <= 80
