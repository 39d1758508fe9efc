"""Metrics, the offline reference cache, the stream runner, experiments and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.data.orderings import make_ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation import protocol
from ciosl.evaluation.experiment import ExperimentSpec, parse_assignments, run_experiment
from ciosl.evaluation.metrics import mean_std, omega_all
from ciosl.evaluation.protocol import OfflineSettings, offline_accuracy, run_stream
from ciosl.learners import make_learner


def blobs(n_per_class=40, n_classes=6, dim=8, seed=0, sep=6.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_classes, dim)) * sep
    y = np.repeat(np.arange(n_classes), n_per_class)
    z = (centers[y] + rng.normal(size=(len(y), dim))).astype(np.float32)
    return z, y


@pytest.fixture
def fs():
    z, y = blobs(seed=0)
    tz, ty = blobs(n_per_class=10, seed=0)
    return FeatureSet("blobs", "none", z, y.astype(np.int64), tz, ty.astype(np.int64),
                      tuple(str(i) for i in range(6)), key="blobs-test")


def test_omega_all_is_the_mean_ratio():
    assert omega_all([0.5, 0.9], [1.0, 0.9]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        omega_all([0.5], [0.5, 0.4])
    with pytest.raises(ValueError, match="offline accuracy is 0"):
        omega_all([0.5], [0.0])
    m, s = mean_std([1.0, 2.0, 3.0])
    assert m == 2.0 and s == pytest.approx(1.0)
    assert mean_std([0.7]) == (0.7, 0.0)


def test_offline_reference_is_cached_and_shared(fs, tmp_path, monkeypatch):
    o = make_ordering("class_iid", fs.train_y, seed=1, base_fraction=0.1, classes_per_step=2)
    st = OfflineSettings(epochs=5, batch_size=16)
    accs = [offline_accuracy(fs, o, t, st, tmp_path) for t in range(len(o.events))]
    assert all(a > 0.9 for a in accs)  # separable blobs, seen classes only
    assert len(list((tmp_path / "offline").glob("*.json"))) == len(o.events)

    def boom(*a, **k):
        raise AssertionError("offline learner retrained although cached")

    monkeypatch.setattr(protocol, "train_offline", boom)
    assert [offline_accuracy(fs, o, t, st, tmp_path) for t in range(len(o.events))] == accs
    # a corrupt cache entry is recomputed, not trusted
    path = next((tmp_path / "offline").glob("*.json"))
    path.write_text("{not json")
    with pytest.raises(AssertionError, match="retrained"):
        [offline_accuracy(fs, o, t, st, tmp_path) for t in range(len(o.events))]


def test_run_stream_tests_on_seen_classes_at_each_event(fs):
    o = make_ordering("class_iid", fs.train_y, seed=0, base_fraction=0.1, classes_per_step=2)
    seen_sizes = []
    run = run_stream(make_learner("ncm"), fs, o, progress=seen_sizes.append)
    assert run["events"] == [0, 80, 160]
    assert run["n_test"] == [20, 40, 60]  # 10 test samples per seen class
    assert sum(seen_sizes) == len(o.stream) == run["n_stream"]
    assert min(run["accuracy"]) > 0.95
    assert run["peak_memory_bytes"] > 0 and run["samples_per_second"] > 0
    assert run["predict_seconds"] > 0


def test_run_experiment_writes_json_and_refuses_bad_settings(fs, tmp_path):
    path = tmp_path / "feats.npz"
    np.savez(path, train_z=fs.train_z, train_y=fs.train_y, test_z=fs.test_z, test_y=fs.test_y)
    out = tmp_path / "out"
    exp = ExperimentSpec(dataset=f"features:{path}", ordering="class_iid", method="slda",
                         seeds=[0, 1], out_dir=out, cache_dir=tmp_path / "cache",
                         offline_epochs=5)
    res = run_experiment(exp)
    saved = json.loads((out / "features-feats_class_iid_slda.json").read_text())
    assert saved["omega_all"] == res["omega_all"]
    assert len(saved["runs"]) == 2
    for run in saved["runs"]:
        assert len(run["accuracy"]) == len(run["accuracy_offline"]) == 3
        assert run["omega_all"] == pytest.approx(
            np.mean(np.array(run["accuracy"]) / np.array(run["accuracy_offline"])))
    assert saved["omega_all"]["mean"] == pytest.approx(
        np.mean([r["omega_all"] for r in saved["runs"]]))

    out2 = tmp_path / "out2"
    for bad, match in [({"shrinkage": "abc"}, "expects float"),
                       ({"nope": "1"}, "valid settings")]:
        with pytest.raises(ValueError, match=match):
            run_experiment(ExperimentSpec(dataset=f"features:{path}", ordering="class_iid",
                                          method="slda", settings=bad, out_dir=out2))
    with pytest.raises(ValueError, match="valid choices"):
        run_experiment(ExperimentSpec(dataset=f"features:{path}", ordering="instance",
                                      method="slda", out_dir=out2))
    assert not out2.exists()  # nothing written half-way


def _base_recipe_methods() -> list:
    from ciosl.learners import available_methods

    out = []
    for name, cls in available_methods().items():
        if {"base_epochs", "base_batch_size"} <= {s.name for s in cls.settings()}:
            # CIOSL.protocol_defaults (ciosl.py, being rewritten elsewhere) must merge
            # Learner.protocol_defaults; strict: remove the mark once it does
            marks = ([pytest.mark.xfail(strict=True, reason="CIOSL.protocol_defaults does not "
                                        "merge Learner.protocol_defaults yet")]
                     if name == "ciosl" else [])
            out.append(pytest.param(name, marks=marks))
    return out


@pytest.mark.parametrize("method", _base_recipe_methods())
def test_every_learner_with_a_base_recipe_gets_the_datasets(method):
    """One base-init recipe (epochs, batch size) for every learner that trains its head on the
    base set, from the dataset's spec; the user's --set still wins."""
    from dataclasses import replace

    from ciosl.data.datasets import get_spec
    from ciosl.evaluation.experiment import resolve_settings
    from ciosl.learners.base import get_method

    cls = get_method(method)
    for dataset in ("digits", "fashion-mnist", "cifar100", "digits-video"):
        spec = get_spec(dataset)
        for ordering in spec.orderings:
            got = resolve_settings(cls, spec, ordering, None, {})
            assert (got["base_epochs"], got["base_batch_size"]) == (
                spec.base_epochs, spec.base_batch_size), (dataset, ordering)
    odd = replace(get_spec("digits"), base_epochs=7, base_batch_size=5)  # from the spec itself
    got = resolve_settings(cls, odd, "class_iid", None, {})
    assert (got["base_epochs"], got["base_batch_size"]) == (7, 5)
    cls(**got)  # a valid learner
    got = resolve_settings(cls, odd, "iid", None, {"base_epochs": "3"})
    assert (got["base_epochs"], got["base_batch_size"]) == (3, 5)  # --set base_epochs=3 wins


def test_base_recipe_of_the_datasets():
    """Table 5's offline recipe per dataset ("training parameters used for CIOSL and the
    offline model"); the stand-ins take the recipe of the dataset they stand in for."""
    from ciosl.data.datasets import get_spec

    recipe = {name: (get_spec(name).base_epochs, get_spec(name).base_batch_size)
              for name in ("cifar10", "cifar100", "imagenet100", "icubworld1", "fashion-mnist",
                           "digits", "digits-video", "fashion-mnist-video")}
    assert recipe == {"cifar10": (50, 128), "cifar100": (50, 128), "imagenet100": (100, 256),
                      "icubworld1": (30, 16), "fashion-mnist": (50, 128), "digits": (30, 16),
                      "digits-video": (30, 16), "fashion-mnist-video": (30, 16)}


def test_parse_assignments():
    assert parse_assignments(["a=1", "b = x"]) == {"a": "1", "b": "x"}
    with pytest.raises(ValueError, match="name=value"):
        parse_assignments(["novalue"])


def test_cli_run_on_digits_writes_json(tmp_path, capsys):
    rc = main(["run", "--dataset", "digits", "--ordering", "class_iid", "--method", "ncm",
               "--runs", "2", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"),
               "--offline-epochs", "3", "--quiet"])
    assert rc == 0
    res = json.loads((tmp_path / "digits_class_iid_ncm.json").read_text())
    assert res["seeds"] == [0, 1] and len(res["runs"][0]["accuracy"]) == 5
    assert "Omega_all" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["--method", "nope"], "unknown method 'nope'; valid choices"),
    (["--method", "ncm", "--dataset", "mnist-x"], "valid choices"),
    (["--method", "ncm", "--set", "bogus=1"], "valid settings"),
    (["--method", "ncm", "--dataset", "digits", "--ordering", "instance"], "valid choices"),
    (["--method", "ncm", "--buffer", "10"], "no replay buffer"),
])
def test_cli_errors_list_valid_choices(args, needle, tmp_path, capsys):
    rc = main(["run", *args, "--out", str(tmp_path / "o")])
    assert rc == 2
    assert needle in capsys.readouterr().err.replace("\n", " ")
    assert not (tmp_path / "o").exists()


def test_cli_lists_datasets_and_methods(capsys):
    assert main(["datasets"]) == 0
    text = capsys.readouterr().out
    for name in ("digits", "fashion-mnist", "cifar10", "imagenet100", "icubworld1",
                 "digits-video"):
        assert name in text
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    assert "slda" in text and "shrinkage" in text


def test_cli_features_builds_the_cache(tmp_path, capsys):
    args = ["features", "--dataset", "digits", "--extractor", "pixels", "--cache", str(tmp_path)]
    assert main(args) == 0
    assert "(1437, 64)" in capsys.readouterr().out
    entries = list((tmp_path / "features").glob("*.npz"))
    assert len(entries) == 1
    assert main(["features", "--dataset", "digits", "--extractor", "resnet"]) == 2
    assert "valid choices" in capsys.readouterr().err
