"""A learner of the user's own (a plugin, no ``@register``) is first-class across restarts: a
learner file and a served folder record its import path and a new process imports it from
sys.path; what is missing is said in one line. Its own bugs are its errors, not ciosl's, and
its settings are checked at construction by the declared ranges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ciosl.errors import LearnerError, message
from helpers import QUICK, cli, one_line_error

PLUGIN = textwrap.dedent('''
    import torch

    from ciosl.learners import Learner


    class CosineMeans(Learner):
        name = "plug-cosine"
        description = "cosine similarity to running class means"
        help = {"scale": "softmax scale", "hidden": "unused width", "seed": "unused"}
        ranges = {"scale": (0.1, 100)}

        def __init__(self, *, scale: float = 10.0, hidden: int = 4, seed: int = 0):
            self.scale, self.hidden = scale, hidden
            super().__init__(seed=seed)

        def _init_state(self, dim):
            self.per_unit = dim // self.hidden  # a plugin that divides by a setting
            self.sums = torch.zeros(0, dim, dtype=torch.float64)

        def _add_class(self):
            self.sums = torch.cat([self.sums, self.sums.new_zeros(1, self.sums.shape[1])])

        def _learn_one(self, z, yi):
            row = torch.zeros_like(self.sums)
            row[yi] = torch.from_numpy(z).double()
            self.sums = self.sums + row

        def _predict_proba(self, Z):
            means = torch.nn.functional.normalize(self.sums, dim=1)
            cos = torch.nn.functional.normalize(torch.from_numpy(Z).double(), dim=1) @ means.T
            return torch.softmax(self.scale * cos, dim=1).numpy()

        def _state(self):
            return {"sums": self.sums.clone()}

        def _load_state(self, state):
            self.sums = state["sums"].clone()


    class Buggy(CosineMeans):
        name = "plug-buggy"

        def _learn_one(self, z, yi):
            return [0][yi + 5]  # an IndexError of the method's own


    class Refusing(CosineMeans):
        name = "plug-refusing"

        def _learn_one(self, z, yi):
            if z[0] > 100:
                raise ValueError("feature 0 over 100: refused")  # a refusal of its own
            super()._learn_one(z, yi)
''')


def _write(folder) -> None:
    (folder / "plugmod.py").write_text(PLUGIN)


def _python(code: str, folder, *, path: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path:
        env["PYTHONPATH"] = str(folder)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd="/", env=env,
                          capture_output=True, text=True, timeout=600)  # a hang guard


SAVE = '''
    import numpy as np, plugmod
    rng = np.random.default_rng(0)
    L = plugmod.CosineMeans(scale=5.0)
    for i in range(30):
        L.learn_one(rng.normal(size=8) + i % 3, i % 3)
    L.save({path!r})
    np.save({probs!r}, L.predict_proba(np.eye(8)))
'''


def test_a_plugin_file_loads_in_a_new_process_from_its_recorded_import_path(tmp_path):
    _write(tmp_path)
    path, probs = tmp_path / "p.ciosl", tmp_path / "p.npy"
    done = _python(SAVE.format(path=str(path), probs=str(probs)), tmp_path)
    assert done.returncode == 0, done.stderr
    load = f'''
        import numpy as np, ciosl
        L = ciosl.Learner.load({str(path)!r})
        assert type(L).__module__ == "plugmod" and L.scale == 5.0
        assert np.array_equal(L.predict_proba(np.eye(8)), np.load({str(probs)!r}))
        L.learn_one(np.ones(8), 7)
        print(L.classes_)
    '''
    done = _python(load, tmp_path)  # plugmod is on PYTHONPATH but never imported by hand
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 2, 7]"


def test_a_plugin_file_whose_module_is_missing_says_what_to_install(tmp_path):
    _write(tmp_path)
    path, probs = tmp_path / "p.ciosl", tmp_path / "p.npy"
    assert _python(SAVE.format(path=str(path), probs=str(probs)), tmp_path).returncode == 0
    done = _python(f"import ciosl; ciosl.Learner.load({str(path)!r})", tmp_path, path=False)
    last = done.stderr.strip().splitlines()[-1]
    assert "ValueError" in last, done.stderr
    for fragment in ("method 'plug-cosine' is the class plugmod:CosineMeans",
                     "module 'plugmod' cannot be imported here",
                     "install the package that provides it, or put its folder on PYTHONPATH"):
        assert fragment in last, last


def test_a_served_plugin_folder_restarts_without_method(tmp_path):
    _write(tmp_path)
    folder = tmp_path / "served"
    first = f'''
        import numpy as np
        from ciosl.serve.service import Service
        s = Service({str(folder)!r}, "plugmod:CosineMeans", None).open()
        for i in range(6):
            s.submit_learn(np.full((1, 4), float(i % 2)) + i, [i % 2], f"r{{i}}").result()
        s.submit_snapshot().result()
        s.close()
    '''
    done = _python(first, tmp_path)
    assert done.returncode == 0, done.stderr
    meta = json.loads((folder / "ciosl-serve.json").read_text())
    assert meta["class"] == "plugmod:CosineMeans" and meta["method"] == "plug-cosine"
    again = f'''
        from ciosl.serve.service import Service
        s = Service({str(folder)!r}, None, None).open()
        print(s.learner.n_seen_, s.learner.classes_)
        s.close()
    '''
    done = _python(again, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6 [0, 1]"
    done = _python(again, tmp_path, path=False)
    assert "module 'plugmod' cannot be imported here" in done.stderr, done.stderr
    assert "damaged" not in done.stderr


@pytest.fixture
def plugmod(tmp_path, monkeypatch):
    from ciosl.learners import registry

    _write(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    import importlib

    sys.modules.pop("plugmod", None)
    yield importlib.import_module("plugmod")
    sys.modules.pop("plugmod", None)


def test_an_error_in_a_plugins_own_code_names_the_method_and_its_hook(plugmod):
    learner = plugmod.Buggy()
    with pytest.raises(LearnerError) as err:
        learner.learn_one(np.ones(8), 1)
    line = message(err.value)
    assert line.startswith("method 'plug-buggy' (plugmod:Buggy): _learn_one raised IndexError")
    assert "not in ciosl" in line and "a bug in ciosl" not in line
    assert learner.classes_ == [] and learner.dim_ is None  # all or nothing still
    with pytest.raises(TypeError, match="labels must be integers or strings"):
        plugmod.CosineMeans().learn_one(np.ones(8), 1.5)  # ciosl's own refusal stays itself


def test_an_expected_error_of_a_plugin_keeps_its_type_and_names_the_method(plugmod):
    learner = plugmod.Refusing()
    learner.learn_one(np.ones(8), 1)
    z = np.ones(8)
    z[0] = 500.0
    with pytest.raises(ValueError) as err:
        learner.learn_one(z, 2)
    assert str(err.value) == ("method 'plug-refusing' (plugmod:Refusing): _learn_one: "
                              "feature 0 over 100: refused")
    assert learner.classes_ == [1]  # all or nothing still: the new class is not kept


@pytest.mark.parametrize(("settings", "fragment"), [
    ({"hidden": 0}, "setting 'hidden' must be in [1, 1e6], got hidden=0"),  # a shared range
    ({"scale": 500.0}, "setting 'scale' must be in [0.1, 100], got scale=500.0"),  # its own
])
def test_a_plugins_settings_are_checked_at_construction(plugmod, settings, fragment):
    with pytest.raises(ValueError) as err:
        plugmod.CosineMeans(**settings)
    assert fragment in str(err.value)


def test_ciosl_run_refuses_a_plugins_bad_setting_before_loading_data(
        plugmod, tmp_path, capsys, monkeypatch):
    from ciosl.data import datasets

    loads = []
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: loads.append(1) or pytest.fail("data loaded"))
    argv = ["run", *QUICK, "--method", "plugmod:CosineMeans", "--set", "hidden=0", "--cache",
            str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    line = one_line_error(*cli(capsys, argv))
    assert "setting 'hidden' must be in [1, 1e6], got hidden=0" in line, line
    assert not loads


def test_ciosl_run_names_a_plugins_own_error(plugmod, tmp_path, capsys):
    argv = ["run", *QUICK, "--method", "plugmod:Buggy", "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out")]
    line = one_line_error(*cli(capsys, argv))
    assert "method 'plug-buggy' (plugmod:Buggy): _learn_one raised IndexError" in line, line


REPLAY_PLUGIN = textwrap.dedent('''
    import torch
    import torch.nn.functional as F

    from ciosl.learners import MLP, SGD, Learner, ReplayMemory


    class ReplayMLP(Learner):
        name = "plug-replay-mlp"
        description = "MLP head, one SGD step per sample and 8 replayed items"
        help = {"lr": "SGD learning rate", "buffer": "replay capacity", "seed": "seed"}

        def __init__(self, *, lr: float = 0.05, buffer: int = 100, seed: int = 0):
            self.lr, self.buffer = lr, buffer
            super().__init__(seed=seed)

        def _init_state(self, dim):
            self.net = MLP(dim, 0, (64,), generator=self.torch_rng)
            self.opt = SGD(self.net.params, lr=self.lr, momentum=0.9, weight_decay=0.0)
            self.memory = ReplayMemory(self.buffer, dim)

        def _add_class(self):
            self.net.grow(1, self.torch_rng)

        def memory_size(self):
            return len(self.memory)

        def _learn_one(self, z, yi):
            X, Y = torch.from_numpy(z)[None], torch.tensor([yi])
            if len(self.memory):
                Zm, ym = self.memory.batch(self.memory.sample_uniform(8, self.rng))
                X, Y = torch.cat([X, Zm]), torch.cat([Y, ym])
            grads = torch.autograd.grad(F.cross_entropy(self.net(X), Y), self.net.params)
            self.net.params = self.opt.step(self.net.params, grads)
            self.memory.offer(z, yi, rng=self.rng)

        def _predict_proba(self, Z):
            return self.net.predict_proba(Z)

        def _state(self):
            return {"net": self.net.state(), "opt": self.opt.state(),
                    "memory": self.memory.state()}

        def _load_state(self, state):
            self.net.load(state["net"])
            self.opt.load(state["opt"])
            self.memory.load(state["memory"])
''')


def test_a_replay_mlp_plugin_from_the_public_helpers_passes_the_suite(tmp_path, monkeypatch):
    """The replay head of CONTRIBUTING's concept count (10: the plugin's 7, the MLP head and
    its SGD, the ReplayMemory, self.rng), written against ``ciosl.learners`` only: a plugin,
    no undo record, it passes ``check_learner``; as a built-in it lacks the undo record."""
    import importlib

    import ciosl
    from ciosl.learners import registry

    (tmp_path / "replaymod.py").write_text(REPLAY_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    cls = importlib.import_module("replaymod").ReplayMLP
    assert len(REPLAY_PLUGIN.strip().splitlines()) <= 50
    assert any(p.startswith("check_faults") for p in ciosl.check_learner(cls))
    with pytest.raises(AssertionError, match="fails check_undo_record"):
        ciosl.check_learner(cls, builtin=True)
