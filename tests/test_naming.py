"""Result names and identity (``evaluation.naming``): two experiments never share a result file
(settings, flags, extractors, feature files, data folders, long names), and a result of another
experiment is never replaced without ``--force``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.evaluation import experiment
from ciosl.evaluation.experiment import (
    ExperimentSpec,
    experiment_path,
    fit_name,
    result_path,
    variant_slug,
)
from ciosl.learners import get_method
from helpers import (
    NAME,
    PROTOCOL,
    cli,
    grid_file,
    one_line_error,
    own_learner,
    run_args,
)


def snapshot(path: Path) -> bytes | str:
    return path.read_bytes() if path.is_file() else "fifo"


def test_a_set_variant_never_overwrites_the_default_result(tmp_path, capsys):
    assert main(run_args(tmp_path, "--runs", "2", method="slda")) == 0
    default = tmp_path / "out" / f"digits_class_iid_slda_{PROTOCOL}.json"
    before = default.read_bytes()
    assert main(run_args(tmp_path, "--runs", "1", "--set", "shrinkage=1e-2",
                         "--set", "shrinkage_estimator=fixed", method="slda")) == 0
    assert default.read_bytes() == before
    variant = json.loads((tmp_path / "out" /
                          f"digits_class_iid_slda_shrinkage-0.01+shrinkage_estimator-fixed_{PROTOCOL}.json")
                         .read_text())
    assert variant["settings"]["shrinkage"] == 0.01 and len(variant["runs"]) == 1


def test_one_stream_through_two_extractors_keeps_two_results(tmp_path):
    from ciosl.evaluation.experiment import experiment_path
    from ciosl.learners import get_method

    def path(dataset, extractor):
        spec = experiment.ExperimentSpec(dataset, "class_iid", "ncm", extractor=extractor, out_dir=tmp_path)
        return experiment_path(spec, get_method("ncm")).name

    # the dataset's default extractor, named or not, keeps the plain name; another one is named
    assert path("digits", None) == path("digits", "pixels") == "digits_class_iid_ncm.json"
    assert path("digits", "efficientnet_lite0") == "digits-efficientnet_lite0_class_iid_ncm.json"
    assert path("digits-instances", "efficientnet_lite0") == "digits-instances_class_iid_ncm.json"
    assert path("digits-instances", "pixels") == "digits-instances-pixels_class_iid_ncm.json"


def test_two_feature_files_with_one_name_keep_two_results(tmp_path):
    rng = np.random.default_rng(0)
    names = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        y = np.repeat(np.arange(4), 20)
        z = rng.normal(size=(80, 5)).astype(np.float32) + y[:, None]
        np.savez(tmp_path / folder / "feats.npz", train_z=z, train_y=y, test_z=z, test_y=y)
        res = experiment.run_experiment(experiment.ExperimentSpec(
            dataset=f"features:{tmp_path / folder / 'feats.npz'}", ordering="class_iid",
            method="ncm", seeds=[0], out_dir=tmp_path / "out", cache_dir=tmp_path / "cache",
            offline_epochs=2))
        names.append(Path(res["path"]).name)
    assert names[0] != names[1]
    assert all(n.startswith("features-feats-") for n in names)
    assert len(list((tmp_path / "out").glob("*.json"))) == 2


# ---------------------------------------------------------------------------- lost work: names
# (id, two experiments) whose results must have two different file names


def spec(**kw) -> tuple[ExperimentSpec, str]:
    kw = {"dataset": "digits", "ordering": "class_iid", "method": "tinyer", "out_dir": ".",
          **kw}
    return ExperimentSpec(**kw), kw["method"]


def name_of(case: tuple[ExperimentSpec, str]) -> str:
    exp, method = case
    return experiment_path(exp, get_method(method)).name


NAME_CASES = [
    ("buffer-flag-vs-default", spec(buffer=50), spec()),
    ("limit-per-class-vs-full", spec(limit_per_class=60), spec()),
    ("offline-epochs-vs-default", spec(offline_epochs=3), spec()),
    ("batch-epochs", spec(regime="batch", epochs=2), spec(regime="batch")),
    ("online-batch-size", spec(regime="online", batch_size=3), spec(regime="online")),
]


@pytest.mark.parametrize(("a", "b"), [c[1:] for c in NAME_CASES], ids=[c[0] for c in NAME_CASES])
def test_two_experiments_never_share_a_name(a, b):
    assert name_of(a) != name_of(b)


def test_buffer_flag_names_like_the_set_setting_and_defaults_keep_their_names():
    assert name_of(spec(buffer=50)) == name_of(spec(settings={"buffer": "50"}))
    assert name_of(spec(buffer=100)) == name_of(spec()) == "digits_class_iid_tinyer.json"
    assert name_of(spec(offline_epochs=30)) == "digits_class_iid_tinyer.json"  # digits' own
    assert name_of(spec(regime="batch", epochs=5)) == "digits_class_iid_tinyer_batch.json"


@pytest.mark.parametrize("values", [("a/b", "a-b", "a b", "a--b", "-a-b-"), ("x+y", "x-y"),
                                    ("1,2", "1-2")], ids=["slash-dash-space", "plus", "comma"])
def test_string_settings_differing_in_dropped_characters_never_collide(values):
    slugs = {variant_slug({"tag": v}) for v in values}
    assert len(slugs) == len(values)
    assert all("/" not in s and " " not in s for s in slugs)


def test_custom_learner_names_differing_in_dropped_characters_never_collide():
    names = {result_path(".", "digits", "iid", m).name for m in ("a/b", "a-b", "a b", "a:b")}
    assert len(names) == 4 and all("/" not in n for n in names)


def test_grid_values_with_slashes_stay_in_the_output_folder(tmp_path):
    from ciosl.evaluation.grid import parse_grid

    grid = parse_grid({"datasets": ["digits"], "orderings": ["iid"], "methods": ["ciosl"],
                       "grid": {"ciosl": {"selection": ["uniform"],
                                          "lambda1": [1.0, 2.0]}}})
    assert [c.id for c in grid.cells] == ["digits_iid_ciosl_selection-uniform+lambda1-1.0",
                                          "digits_iid_ciosl_selection-uniform+lambda1-2.0"]
    from ciosl.evaluation.experiment import slug_items

    ids = {slug_items([("tag", v)]) for v in ("../x", "..-x", "a/b")}
    assert len(ids) == 3 and not any("/" in i for i in ids)


# ---------------------------------------------------------------------------- lost work: files
# (id, setup(tmp) -> argv, fragment of the one-line error); the file at the result's name is
# byte for byte unchanged afterwards


def other_result(tmp: Path, name: str = NAME, **changes) -> Path:
    """A result of another experiment (a hand-edited copy of a real one) at ``name``."""
    real = tmp / "real"
    assert main(run_args(tmp, "--runs", "1", out="real")) == 0
    data = json.loads((real / NAME).read_text())
    data.update(changes)
    path = tmp / "out" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def sweep_then_run(tmp: Path) -> tuple[Path, list[str]]:
    """A sweep's cell file (limit 12) where `ciosl run` of the full stream writes."""
    grid = grid_file(tmp, 'methods = ["ncm"]\nruns = 1\noffline_epochs = 2')
    assert main(["sweep", grid, "--workers", "1"]) == 0
    return tmp / "out" / "digits_class_iid_ncm.json", [
        "run", "--dataset", "digits", "--ordering", "class_iid", "--method", "ncm", "--quiet",
        "--runs", "1", "--cache", str(tmp / "cache"), "--out", str(tmp / "out")]


def run_then_sweep(tmp: Path) -> tuple[Path, list[str]]:
    """A `ciosl run` result of another experiment where a sweep writes its cell file."""
    path = other_result(tmp, "digits_class_iid_ncm.json")  # limit 12 and 2 offline epochs
    grid = grid_file(tmp, 'methods = ["ncm"]\nruns = 1')
    Path(grid).write_text(Path(grid).read_text().replace("limit_per_class = 12\n",
                                                         "limit_per_class = 13\n"))
    return path, ["sweep", grid, "--workers", "1"]


def notes(tmp: Path) -> Path:
    path = tmp / "out" / NAME
    path.parent.mkdir(parents=True)
    path.write_text("my notes")
    return path


def fifo(tmp: Path) -> tuple[Path, list[str]]:
    path = tmp / "out" / NAME
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    return path, run_args(tmp, "--runs", "1")


OVERWRITE_CASES = [
    ("other-method-at-the-name", lambda t: (other_result(t, method="slda"),
                                            run_args(t, "--runs", "1")),
     "holds another experiment (method: \"slda\" there, \"ncm\" here)"),
    ("other-setting-at-the-name", lambda t: (other_result(t, settings={"temperature": 9.0}),
                                             run_args(t, "--runs", "1")),
     "holds another experiment (settings.temperature: 9.0 there, 1.0 here)"),
    ("other-limit-at-the-name", lambda t: (other_result(t, limit_per_class=60),
                                           run_args(t, "--runs", "1")),
     "holds another experiment (limit_per_class: 60 there, 12 here"),
    ("not-a-result", lambda t: (notes(t), run_args(t, "--runs", "1")), "not valid JSON"),
    ("fewer-seeds-drop-runs", lambda t: (other_result(t, seeds=[0, 1, 2, 3]),
                                         run_args(t, "--runs", "1")),
     "does not repeat (seeds 1,2,3): refused to drop them"),
    ("sweep-cell-then-run", sweep_then_run,
     "digits_class_iid_ncm.json holds another experiment (limit_per_class: 12 there, null "
     "here"),
    ("run-result-then-sweep", run_then_sweep,
     "digits_class_iid_ncm.json holds another experiment (limit_per_class: 12 there, 13 here"),
    ("fifo-at-the-name", fifo, "not a regular file (a FIFO (named pipe))"),
]


@pytest.mark.parametrize(("setup", "fragment"), [c[1:] for c in OVERWRITE_CASES],
                         ids=[c[0] for c in OVERWRITE_CASES])
def test_a_result_of_another_experiment_is_never_replaced(setup, fragment, tmp_path, capsys):
    path, argv = setup(tmp_path)
    before = snapshot(path)
    capsys.readouterr()
    line = one_line_error(*cli(capsys, argv))
    assert fragment in line and str(path) in line and "--force" in line
    assert snapshot(path) == before
    assert not list(path.parent.glob("*.ckpt"))


def test_force_replaces_and_the_same_experiment_still_extends(tmp_path, capsys):
    path = other_result(tmp_path, method="slda")
    assert main(run_args(tmp_path, "--runs", "1", "--force")) == 0
    assert json.loads(path.read_text())["method"] == "ncm"
    assert main(run_args(tmp_path, "--runs", "2")) == 0  # the same experiment, more seeds
    assert json.loads(path.read_text())["seeds"] == [0, 1]
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--seeds", "1")))
    assert "(seeds 0)" in line
    assert main(run_args(tmp_path, "--seeds", "1", "--force")) == 0


def test_a_result_appearing_during_the_run_is_not_replaced(tmp_path, capsys, monkeypatch):
    """Another command writes at the name while this one computes: refused at the write, the
    finished runs kept in the checkpoint for --resume."""
    other = json.dumps({"dataset": "digits", "ordering": "class_iid", "method": "slda"})
    real_run_seed = experiment.run_seed

    def meanwhile(*a, **kw):
        (tmp_path / "out" / NAME).write_text(other)
        return real_run_seed(*a, **kw)

    monkeypatch.setattr(experiment, "run_seed", meanwhile)
    line = one_line_error(*cli(capsys, run_args(tmp_path, "--runs", "1")))
    assert "holds another experiment (method" in line and "--resume" in line
    assert (tmp_path / "out" / NAME).read_text() == other
    assert list((tmp_path / "out").glob("*.ckpt"))


def test_another_data_folder_is_another_experiment(tmp_path, capsys):
    """``--data`` elsewhere with other contents: the result file is refused, naming the
    difference (the features' key covers the data's fingerprint), and --force replaces it."""
    import gzip

    from dataset_files import idx_bytes

    def write(folder: Path, seed: int) -> None:  # learnable: each class its own brightness
        rng = np.random.default_rng(seed)
        folder.mkdir()
        for split, count in (("train", 200), ("t10k", 100)):
            y = np.arange(count) % 10
            x = np.clip(y[:, None, None] * 25 + rng.integers(0, 20, (count, 28, 28)), 0, 255)
            for stem, arr in ((f"{split}-images-idx3-ubyte", x), (f"{split}-labels-idx1-ubyte", y)):
                (folder / (stem + ".gz")).write_bytes(gzip.compress(idx_bytes(arr)))

    def argv(folder: str, *extra: str) -> list[str]:
        return ["run", "--dataset", "fashion-mnist", "--data", str(tmp_path / folder),
                "--ordering", "iid", "--method", "ncm", "--extractor", "pixels",
                "--offline-epochs", "1", "--cache", str(tmp_path / "cache"),
                "--out", str(tmp_path / "out"), "--quiet", *extra]

    for folder, seed in (("a", 0), ("b", 1)):
        write(tmp_path / folder, seed)
    rc, err = cli(capsys, argv("a"))
    assert rc == 0, err
    (result,) = (tmp_path / "out").glob("*.json")
    before = result.read_bytes()
    line = one_line_error(*cli(capsys, argv("b")))
    assert f"{result} holds another experiment (features_key: " in line and "--force" in line
    assert result.read_bytes() == before
    rc, err = cli(capsys, argv("b", "--force"))
    assert rc == 0, err
    assert json.loads(result.read_text())["features_key"] != json.loads(before)["features_key"]


# ---------------------------------------------------------------------------- long names


def test_names_too_long_for_a_file_system_are_shortened_without_collisions():
    short = "digits_iid_ncm"
    assert fit_name(short) == short
    a, b = fit_name("x" * 300), fit_name("x" * 299 + "y")
    assert a != b and len(a.encode()) <= 200 and len(b.encode()) <= 200
    assert len(fit_name("é" * 300).encode()) <= 200


# ---------------------------------------------------------------------------- lost work


def test_a_changed_learner_of_your_own_does_not_replace_its_earlier_result(
        tmp_path, capsys, monkeypatch):
    path, method = own_learner(tmp_path, monkeypatch)
    assert cli(capsys, run_args(tmp_path, method=method))[0] == 0
    assert cli(capsys, run_args(tmp_path, method=method))[0] == 0  # the same code: a rerun
    (result,) = (tmp_path / "out").glob("*.json")
    before = result.read_text()
    assert json.loads(before)["method_source"]["class"] == method
    path.write_text(path.read_text() + "\n# a change of the learner's code\n")
    line = one_line_error(*cli(capsys, run_args(tmp_path, method=method)))
    assert "holds another experiment (method_source.sha256: " in line and "--force" in line
    assert result.read_text() == before
    assert cli(capsys, run_args(tmp_path, "--force", method=method))[0] == 0


def test_results_of_ciosl_methods_record_no_source(tmp_path, capsys):
    assert cli(capsys, run_args(tmp_path))[0] == 0
    (result,) = (tmp_path / "out").glob("*.json")
    assert "method_source" not in json.loads(result.read_text())  # old results stay the same
