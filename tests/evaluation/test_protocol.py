"""Metrics, the offline reference cache, the stream runner, experiments and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.data.orderings import make_ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation import experiment, protocol
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
    assert omega_all([0.5, 0.9], [1.0, 0.9], events="all") == pytest.approx(0.75)
    assert omega_all([0.5, 0.9], [1.0, 0.9]) == pytest.approx(1.0)  # the base event left out
    with pytest.raises(ValueError):
        omega_all([0.5], [0.5, 0.4])
    with pytest.raises(ValueError, match="offline accuracy is 0"):
        omega_all([0.5, 0.5], [0.4, 0.0])
    with pytest.raises(ValueError, match="no testing event after base init"):
        omega_all([0.5], [0.5])
    with pytest.raises(ValueError, match="valid choices: after_base, all"):
        omega_all([0.5, 0.5], [0.5, 0.5], events="first")
    m, s = mean_std([1.0, 2.0, 3.0])
    assert m == 2.0 and s == pytest.approx(1.0)
    assert mean_std([0.7]) == (0.7, 0.0)


def test_omega_all_after_base_init_and_over_every_event_by_hand():
    """A hand-made curve: the base event (index 0) scores like the offline learner, the later
    ones do not. Ratios: 0.99 / 1.0 = 0.99, 0.6 / 0.8 = 0.75, 0.4 / 0.8 = 0.5, 0.3 / 0.6 = 0.5.
    After base init (Kemker et al.): (0.75 + 0.5 + 0.5) / 3 = 0.58333...
    Every event:                     (0.99 + 0.75 + 0.5 + 0.5) / 4 = 0.685."""
    acc, offline = [0.99, 0.6, 0.4, 0.3], [1.0, 0.8, 0.8, 0.6]
    assert omega_all(acc, offline) == pytest.approx(1.75 / 3)
    assert omega_all(acc, offline, events="after_base") == pytest.approx(0.5833333333)
    assert omega_all(acc, offline, events="all") == pytest.approx(0.685)


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
    # features:PATH results carry a hash of the file's path: two feats.npz never collide
    # (and --offline-epochs, not the protocol's, names it too)
    assert re.fullmatch(r"features-feats-[0-9a-f]{8}_class_iid_slda_offline_epochs=5\.json",
                        Path(res["path"]).name)
    saved = json.loads(Path(res["path"]).read_text())
    assert saved["omega_all"] == res["omega_all"]
    assert len(saved["runs"]) == 2
    for run in saved["runs"]:
        # every event's accuracy is stored, the base event (stream position 0) included ...
        assert run["events"][0] == 0
        assert len(run["accuracy"]) == len(run["accuracy_offline"]) == len(run["events"]) == 3
        # ... and Omega_all averages the events after it by default
        ratio = np.array(run["accuracy"]) / np.array(run["accuracy_offline"])
        assert run["omega_all"] == pytest.approx(ratio[1:].mean())
        assert run["omega_events"] == "after_base"
    assert saved["omega_all"]["mean"] == pytest.approx(
        np.mean([r["omega_all"] for r in saved["runs"]]))
    assert saved["omega_all"]["events"] == "after_base"

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


def test_base_event_is_stored_but_left_out_of_omega_all_by_default(fs, tmp_path):
    """Through the runner and the JSON: a learner that forgets everything after base init
    (fine-tuning on separable blobs, class-iid) scores ~1 at the base event only; Omega_all
    leaves that event out unless --omega-events all asks for it."""
    path = tmp_path / "feats.npz"
    np.savez(path, train_z=fs.train_z, train_y=fs.train_y, test_z=fs.test_z, test_y=fs.test_y)
    cache = tmp_path / "cache"
    common = dict(dataset=f"features:{path}", ordering="class_iid", method="finetune",
                  seeds=[0], cache_dir=cache, offline_epochs=5, settings={"base_epochs": "5"})
    default = run_experiment(ExperimentSpec(**common, out_dir=tmp_path / "a"))
    every = run_experiment(ExperimentSpec(**common, out_dir=tmp_path / "b",
                                          omega_events="all"))
    # the --set settings name the result file
    assert Path(default["path"]).name.endswith(
        "_class_iid_finetune_base_epochs-5_offline_epochs=5.json")
    saved = json.loads(Path(default["path"]).read_text())
    run = saved["runs"][0]
    assert run["events"] == [0, 80, 160] and len(run["accuracy"]) == 3
    assert run["accuracy"] == every["runs"][0]["accuracy"]  # same runs, two averages
    ratio = np.array(run["accuracy"]) / np.array(run["accuracy_offline"])
    assert ratio[0] > 0.9  # the base event flatters: just trained offline on the same data
    assert saved["omega_all"] == {"mean": pytest.approx(ratio[1:].mean()), "std": 0.0,
                                  "events": "after_base"}
    assert every["omega_all"]["mean"] == pytest.approx(ratio.mean())
    assert every["omega_all"]["events"] == "all"
    assert default["omega_all"]["mean"] < every["omega_all"]["mean"]
    with pytest.raises(ValueError, match="valid choices: after_base, all"):
        run_experiment(ExperimentSpec(**common, omega_events="base"))


def test_cli_omega_events_flag(tmp_path, capsys):
    args = ["run", "--dataset", "digits", "--ordering", "class_iid", "--method", "ncm",
            "--runs", "1", "--cache", str(tmp_path / "cache"), "--offline-epochs", "3"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "over the events after base init" in out
    assert "event 0: right after base init, not in Omega_all" in out
    assert main([*args, "--out", str(tmp_path / "b"), "--omega-events", "all", "--quiet"]) == 0
    assert "every event, base init included" in capsys.readouterr().out
    a, b = (json.loads((tmp_path / d / "digits_class_iid_ncm_offline_epochs=3.json").read_text())
            for d in "ab")
    assert a["runs"][0]["accuracy"] == b["runs"][0]["accuracy"]
    ratio = np.array(a["runs"][0]["accuracy"]) / np.array(a["runs"][0]["accuracy_offline"])
    assert a["omega_all"]["mean"] == pytest.approx(ratio[1:].mean())
    assert b["omega_all"]["mean"] == pytest.approx(ratio.mean())


def _base_recipe_methods() -> list:
    from ciosl.learners import available_methods

    return [name for name, cls in available_methods().items()
            if {"base_epochs", "base_batch_size"} <= {s.name for s in cls.settings()}]


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
                           "digits", "digits-video", "digits-video-28",
                           "fashion-mnist-video")}
    assert recipe == {"cifar10": (50, 128), "cifar100": (50, 128), "imagenet100": (100, 256),
                      "icubworld1": (30, 16), "fashion-mnist": (50, 128), "digits": (30, 16),
                      "digits-video": (30, 16), "digits-video-28": (30, 16),
                      "fashion-mnist-video": (30, 16)}


def test_parse_assignments():
    assert parse_assignments(["a=1", "b = x"]) == {"a": "1", "b": "x"}
    with pytest.raises(ValueError, match="name=value"):
        parse_assignments(["novalue"])


def test_cli_run_on_digits_writes_json(tmp_path, capsys):
    rc = main(["run", "--dataset", "digits", "--ordering", "class_iid", "--method", "ncm",
               "--runs", "2", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"),
               "--offline-epochs", "3", "--quiet"])
    assert rc == 0
    res = json.loads((tmp_path / "digits_class_iid_ncm_offline_epochs=3.json").read_text())
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
    flat = text.replace("\n", " ")
    for user in ("folder:DIR", "features:PATH", "onnx:PATH[@S]", "module:package.module:callable",
                 "docs/datasets.md"):
        assert user in flat, user
    assert main(["methods"]) == 0
    text = capsys.readouterr().out
    assert "slda" in text and "shrinkage" in text and "ciosl" in text
    assert len(text.splitlines()) < 150  # one line or so per method, not every setting's help
    assert main(["methods", "ciosl", "slda"]) == 0
    text = capsys.readouterr().out
    assert "lambda2" in text and "class_growth" in text and "shrinkage" in text and "ncm" not in text
    assert main(["methods", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_cli_features_builds_the_cache(tmp_path, capsys):
    args = ["features", "--dataset", "digits", "--extractor", "pixels", "--cache", str(tmp_path)]
    assert main(args) == 0
    assert "(1437, 64)" in capsys.readouterr().out
    entries = list((tmp_path / "features").glob("*.npz"))
    assert len(entries) == 1
    assert main(["features", "--dataset", "digits", "--extractor", "resnet"]) == 2
    assert "valid choices" in capsys.readouterr().err


def test_cli_help_gives_every_option_a_meaning_and_its_default():
    import argparse

    from ciosl.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"run", "datasets", "methods", "features", "sweep", "report",
                                "serve"}
    for name, p in sub.choices.items():
        text = " ".join(p.format_help().split())
        for action in p._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (name, action.dest)
            shown = " ".join(p._get_formatter()._get_help_string(action).split())
            assert "default" in shown or "required" in shown, (name, action.dest, shown)
        if name == "run":
            assert "(default: class_iid)" in text and "(default: digits)" in text


def test_public_api_is_listed_and_documented():
    import ciosl

    for name in ("Learner", "available_methods", "check_learner", "make_learner", "register"):
        assert name in dir(ciosl) and getattr(ciosl, name).__doc__, name
    assert "make_learner(" in ciosl.__doc__


def test_features_file_shows_precomputed_features_not_none(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "f.npz"
    np.savez(path, train_z=rng.normal(size=(40, 3)), train_y=np.arange(40) % 4,
             test_z=rng.normal(size=(8, 3)), test_y=np.arange(8) % 4)
    assert main(["features", "--dataset", f"features:{path}", "--cache", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "precomputed features" in out and "none" not in out.split("cache key")[0]


@pytest.mark.parametrize("width", [80, 100, 250])
def test_listings_cut_no_name_or_setting_at_any_width(width, monkeypatch):
    """`ciosl datasets` and `ciosl methods [NAME]` without a terminal or in 80 columns: a table
    that cannot hold every word whole becomes a plain listing, one entry per line, so no
    dataset, method or setting name is folded across lines ("fashio / n-mnis / t")."""
    import io
    import re

    from rich.console import Console

    from ciosl.data.datasets import DATASETS
    from ciosl.learners import available_methods
    from ciosl.report import console as con

    def printed(argv, until: str | None = None) -> set[str]:
        out = io.StringIO()
        monkeypatch.setattr(con, "console", Console(file=out, width=width))
        assert main(argv) == 0
        text = out.getvalue()
        return set(re.findall(r"[\w\-./]+", text[:text.index(until)] if until else text))

    words = printed(["datasets"], until="base init / offline:")  # the table, not the notes
    assert set(DATASETS) <= words, set(DATASETS) - words
    methods = available_methods()
    words = printed(["methods"])
    settings = {s.name for cls in methods.values() for s in cls.settings() if s.name != "seed"}
    assert set(methods) | settings <= words, (set(methods) | settings) - words
    for name in ("ciosl", "slda", "rp_lda"):
        words = printed(["methods", name])
        names = {s.name for s in methods[name].settings() if s.name != "seed"}
        assert names <= words, names - words


# ---------------------------------------------------------------------------- caches, loaders


def test_an_edited_offline_reference_is_recomputed(tmp_path):
    spec = dict(dataset="digits", ordering="class_iid", method="ncm", seeds=[0],
                cache_dir=tmp_path / "cache", limit_per_class=12, offline_epochs=2)
    first = experiment.run_experiment(experiment.ExperimentSpec(**spec))
    entries = sorted((tmp_path / "cache" / "offline").glob("*.json"))
    assert entries
    for path in entries:  # an edit that keeps the JSON valid and the identity intact
        entry = json.loads(path.read_text())
        entry["accuracy"] = 0.011
        path.write_text(json.dumps(entry))
    again = experiment.run_experiment(experiment.ExperimentSpec(**spec))
    assert again["runs"][0]["accuracy_offline"] == first["runs"][0]["accuracy_offline"]
    assert again["omega_all"] == first["omega_all"]
    assert all(json.loads(p.read_text())["accuracy"] != 0.011 for p in entries)  # rewritten
