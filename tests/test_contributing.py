"""CONTRIBUTING's "A method" section is code that works: its plugin passes the conformance
suite, its built-in passes it as a built-in (an undo record), and README's method example is the
very same plugin."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

import ciosl
from ciosl.learners import registry

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## A method", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "the section shows a plugin, then a built-in"
    return blocks


def _load(source: str, module: str, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registered here only
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))  # a module of its own: copies pickle it by name
    return importlib.import_module(module)


def test_the_contributing_plugin_passes_the_conformance_suite(monkeypatch, tmp_path):
    cls = _load(_blocks()[0], "contributing_plugin", tmp_path, monkeypatch).CosineMeans
    passed = ciosl.check_learner(cls)
    assert any(p.startswith("check_faults") for p in passed)
    with pytest.raises(ValueError, match="setting 'scale' must be in"):
        cls(scale=0.0)  # its own range


def test_the_contributing_builtin_passes_as_a_builtin(monkeypatch, tmp_path):
    cls = _load(_blocks()[1], "contributing_builtin", tmp_path, monkeypatch).ReplayHead
    passed = ciosl.check_learner(cls, builtin=True)
    assert "check_undo_record" in passed and any(p.startswith("check_faults") for p in passed)
    learner = cls()
    X = np.random.default_rng(0).normal(size=(40, 6)).astype(np.float32) + np.repeat(
        np.arange(4), 10)[:, None]
    for z, c in zip(X, np.repeat(np.arange(4), 10), strict=True):
        learner.learn_one(z, int(c))
    assert learner.score(X, np.repeat(np.arange(4), 10)) > 0.5
    assert learner.published() is not None


def test_readme_shows_the_contributing_plugin():
    (readme,) = re.findall(r"```python\n(# my_method\.py.*?)```", (ROOT / "README.md").read_text(),
                           re.S)
    assert readme == _blocks()[0]


def test_the_contributing_methods_are_short():
    """A plugin on one screen, a built-in (TinyER-sized) on two."""
    plugin, builtin = _blocks()
    assert len(plugin.splitlines()) <= 40 and len(builtin.splitlines()) <= 80
