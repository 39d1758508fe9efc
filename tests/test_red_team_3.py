"""Issue 29, the second red-team pass: the "silently wrong" and "unclear error" kinds of bad
input, one row of a table each, with the one-line error they must get now and a check that
nothing changed (learner state byte for byte, adapter layout, no result file). Each row failed
before its fix.

Tables: ``USER_METHOD_CASES`` (``ciosl run --method module:Class`` with a learner of the user's
own that breaks the protocol, or a module that does not import: exit 2, one line naming the
method and the problem, no result), ``FRESH_CASES`` / ``TRAINED_CASES`` (a call on a learner:
the error, the state unchanged), ``SETTING_CASES`` (a constructor: the error), ``RIVER_CASES``
and the scikit-learn tests (the adapters), ``INTEGRITY_CASES`` (a flipped bit in a learner file
or a checkpoint), ``DATA_CASES`` (``ciosl run`` / ``ciosl features`` on bad data: exit 2, one
line).
"""

from __future__ import annotations

import errno
import io
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ciosl.cli import main

QUICK = ["--dataset", "digits", "--ordering", "class_iid", "--limit-per-class", "12",
         "--offline-epochs", "2", "--quiet"]
D = 6


def cli(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def one_line_error(rc: int, err: str) -> str:
    assert rc == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def snapshot(learner) -> bytes:
    buf = io.BytesIO()
    torch.save(learner.state_dict(), buf)
    return buf.getvalue()


def trained(method: str, **settings):
    from ciosl.learners import make_learner

    rng = np.random.default_rng(0)
    learner = make_learner(method, **settings)
    Z = rng.normal(size=(40, D)).astype(np.float32) + np.repeat(np.eye(2, D) * 4, 20, axis=0)
    learner.fit_base(Z, [0] * 20 + [1] * 20)
    for i in range(6):
        learner.learn_one(rng.normal(size=D) + 4 * np.eye(D)[i % 2], i % 2)
    return learner


# ---------------------------------------------------------------------------- user methods
USER_MODULE = '''
import sys

import numpy as np
import torch

from ciosl.learners.base import Learner


class Means(Learner):
    """Nearest class mean: a well-behaved learner of the user's own; the others break it."""

    name = "rt3-means"
    description = "nearest class mean"
    help = {"seed": "unused"}

    def __init__(self, *, seed: int = 0):
        super().__init__(seed=seed)

    def _init_state(self, dim):
        self.sums = torch.zeros(0, dim, dtype=torch.float64)
        self.counts = torch.zeros(0, dtype=torch.float64)

    def _add_class(self):
        self.sums = torch.cat([self.sums, torch.zeros(1, self.sums.shape[1],
                                                      dtype=torch.float64)])
        self.counts = torch.cat([self.counts, torch.zeros(1, dtype=torch.float64)])

    def _fit_base(self, Z, yi):
        for z, k in zip(Z, yi):
            self.sums[k] += torch.as_tensor(z, dtype=torch.float64)
            self.counts[k] += 1

    def _learn_one(self, z, yi):
        self.sums[yi] += torch.as_tensor(z, dtype=torch.float64)
        self.counts[yi] += 1

    def _predict_proba(self, Z):
        mu = (self.sums / self.counts.clamp(min=1)[:, None]).numpy()
        d = ((np.asarray(Z, np.float64)[:, None, :] - mu[None]) ** 2).sum(-1)
        e = np.exp(-(d - d.min(axis=1, keepdims=True)))
        return e / e.sum(axis=1, keepdims=True)

    def _state(self):
        return {"sums": self.sums.clone(), "counts": self.counts.clone()}

    def _load_state(self, state):
        self.sums, self.counts = state["sums"].clone(), state["counts"].clone()


class NaNs(Means):
    name = "rt3-nan"

    def _predict_proba(self, Z):
        return np.full((len(Z), len(self.classes_)), np.nan)


class ExtraColumn(Means):
    name = "rt3-columns"

    def _predict_proba(self, Z):
        P = super()._predict_proba(Z)
        return np.concatenate([P, np.zeros((len(Z), 1))], axis=1)


class MissingRow(Means):
    name = "rt3-rows"

    def _predict_proba(self, Z):
        return super()._predict_proba(Z)[1:]


class OwnProbaNaN(Means):
    name = "rt3-own-proba"

    def predict_proba(self, Z):  # overrides the checked one
        P = super().predict_proba(Z)
        return np.full_like(P, np.nan)


class NoDescription(Means):
    name = "rt3-no-description"
    description = ""


class UnseenLabels(Means):
    name = "rt3-unseen"

    def predict(self, Z):
        return np.full(len(Z), 999)


class Exits(Means):
    name = "rt3-exit"

    def _learn_one(self, z, yi):
        sys.exit(0)


class Unsaveable(Means):
    name = "rt3-unsaveable"

    def _state(self):
        return {**super()._state(), "scorer": lambda z: z}
'''


@pytest.fixture(scope="module")
def user_modules(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user")
    (folder / "rt3_learners.py").write_text(USER_MODULE)
    (folder / "rt3_syntax.py").write_text("def broken(:\n    pass\n")
    (folder / "rt3_raises.py").write_text("x = 1 / 0\n")
    return folder


USER_METHOD_CASES = [
    ("nan-probabilities", "rt3_learners:NaNs",
     "method 'rt3-nan' (rt3_learners:NaNs): predict_proba holds NaN or infinite probabilities"),
    ("extra-column", "rt3_learners:ExtraColumn",
     "method 'rt3-columns' (rt3_learners:ExtraColumn): predict_proba has shape"),
    ("missing-row", "rt3_learners:MissingRow", "predict_proba has shape"),
    ("own-predict-proba-nan", "rt3_learners:OwnProbaNaN",
     "method 'rt3-own-proba' (rt3_learners:OwnProbaNaN): predict_proba holds NaN"),
    ("unseen-labels", "rt3_learners:UnseenLabels",
     "method 'rt3-unseen' (rt3_learners:UnseenLabels): predict answered label 999, which it "
     "never learned"),
    ("system-exit", "rt3_learners:Exits",
     "method 'rt3-exit' (rt3_learners:Exits): learn_one called sys.exit(0); a learner must "
     "raise an exception"),
    ("state-not-saveable", "rt3_learners:Unsaveable",
     "method 'rt3-unsaveable' (rt3_learners:Unsaveable): its state cannot be saved"),
    ("syntax-error", "rt3_syntax:Learner",
     "method 'rt3_syntax:Learner': importing module 'rt3_syntax' failed: SyntaxError: "),
    ("exception-at-import", "rt3_raises:Learner",
     "method 'rt3_raises:Learner': importing module 'rt3_raises' failed: ZeroDivisionError: "
     "division by zero"),
]


@pytest.mark.parametrize(("spec", "fragment"), [c[1:] for c in USER_METHOD_CASES],
                         ids=[c[0] for c in USER_METHOD_CASES])
def test_a_user_method_breaking_the_protocol_fails_the_run_in_one_line(
        spec, fragment, user_modules, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(user_modules))
    argv = ["run", *QUICK, "--method", spec, "--cache", str(tmp_path / "cache"), "--out",
            str(tmp_path / "out")]
    line = one_line_error(*cli(capsys, argv))
    assert fragment in line, line
    assert not list((tmp_path / "out").glob("*.json"))  # no Omega written


def test_the_well_behaved_user_method_still_runs(user_modules, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(user_modules))
    argv = ["run", *QUICK, "--method", "rt3_learners:Means", "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0, capsys.readouterr().err
    assert list((tmp_path / "out").glob("*.json"))


def test_check_learner_names_the_reason_for_nan(user_modules, monkeypatch):
    import ciosl

    monkeypatch.syspath_prepend(str(user_modules))
    from ciosl.learners.base import load_method

    for spec in ("rt3_learners:NaNs", "rt3_learners:OwnProbaNaN"):
        with pytest.raises(AssertionError) as err:
            ciosl.check_learner(load_method(spec))
        reason = str(err.value).split(": ", 2)[-1]
        assert "NaN" in reason, str(err.value)


def test_check_learner_never_gives_an_empty_reason(user_modules, monkeypatch):
    import ciosl
    from ciosl.learners.base import load_method

    monkeypatch.syspath_prepend(str(user_modules))
    assert ciosl.check_learner(load_method("rt3_learners:Means"))
    with pytest.raises(AssertionError) as err:  # a bare assert of the suite fails
        ciosl.check_learner(load_method("rt3_learners:NoDescription"))
    assert "fails check_metadata with settings {}: AssertionError: assert cls.description" in (
        str(err.value))


# ---------------------------------------------------------------------------- the learners
# (id, methods, call on a FRESH learner, error, pattern): afterwards still fresh
FRESH_CASES = [
    ("zero-width-fit-base", ["ncm", "slda", "ciosl", "tinyer"],
     lambda L: L.fit_base(np.zeros((4, 0)), [0, 1, 0, 1]), ValueError,
     "fit_base: features of width 0"),
    ("zero-width-learn-one", ["ncm", "slda", "ciosl", "tinyer"],
     lambda L: L.learn_one(np.zeros(0), 0), ValueError, "learn_one: features of width 0"),
    ("finite-1e39-is-too-large", ["ncm", "slda"],
     lambda L: L.fit_base(np.array([[1.0, 2.0], [3.0, 1e39]]), [0, 1]), ValueError,
     r"position 1 has feature 1 = 1e\+39, beyond \+-1e\+12: too large"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in FRESH_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in FRESH_CASES for m in c[1]])
def test_fresh_learner_refuses_and_stays_fresh(method, call, error, pattern):
    from ciosl.learners import make_learner

    learner = make_learner(method)
    with pytest.raises(error, match=pattern):
        call(learner)
    assert learner.dim_ is None and learner.classes_ == [] and learner.n_seen_ == 0


TRAINED_CASES = [
    ("finite-1e39-learn-one", ["ncm", "slda", "tinyer"],
     lambda L: L.learn_one(np.r_[np.ones(D - 1), 1e39], 0), ValueError,
     r"position 0 has feature 5 = 1e\+39, beyond \+-1e\+12: too large"),
    ("finite-1e39-predict", ["ncm"],
     lambda L: L.predict_proba(np.r_[np.ones((4, D)), [np.r_[np.ones(D - 1), -2e39]]]),
     ValueError, r"position 4 has feature 5 = -2e\+39, beyond \+-1e\+12: too large"),
]


@pytest.mark.parametrize(("method", "call", "error", "pattern"),
                         [(m, *c[2:]) for c in TRAINED_CASES for m in c[1]],
                         ids=[f"{c[0]}-{m}" for c in TRAINED_CASES for m in c[1]])
def test_trained_learner_refuses_and_stays_unchanged(method, call, error, pattern):
    learner = trained(method)
    before, classes = snapshot(learner), list(learner.classes_)
    with pytest.raises(error, match=pattern):
        call(learner)
    assert learner.classes_ == classes and snapshot(learner) == before


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


def test_save_names_the_target_when_the_disk_is_full(tmp_path, monkeypatch):
    import ciosl.fileio
    from ciosl.errors import message

    learner = trained("ncm")
    target = tmp_path / "model.ciosl"

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ciosl.fileio.os, "fsync", full)
    with pytest.raises(OSError) as err:
        learner.save(target)
    assert message(err.value) == f"{target}: No space left on device"
    assert not list(tmp_path.iterdir())  # no temporary left behind


# ---------------------------------------------------------------------------- river
def river(method: str = "ncm"):
    from ciosl.learners import make_learner
    from ciosl.river import RiverClassifier

    clf = RiverClassifier(make_learner(method))
    clf.learn_one({"a": 1.0, "b": 0.0}, 0)
    clf.learn_one({"a": -1.0, "b": 0.5}, 1)
    return clf


RIVER_CASES = [
    ("string-number", {"a": "3.5", "b": 0.0}, TypeError,
     "feature 'a' must be a real number, got str '3.5'"),
    ("none", {"a": None}, TypeError, "feature 'a' must be a real number, got NoneType None"),
    ("complex", {"b": 1 + 2j}, TypeError, "feature 'b' must be a real number, got complex"),
    ("array", {"a": np.ones(3)}, TypeError, "feature 'a' must be a real number, got ndarray"),
    ("list-value", {"a": [1.0]}, TypeError, "feature 'a' must be a real number, got list"),
    ("nan", {"a": float("nan")}, ValueError, "feature 'a' = nan is not finite"),
    ("huge", {"b": 1e39}, ValueError, "feature 'b' = 1e+39 is too large"),
    ("list-not-dict", [1.0, 0.0], TypeError, "x must be a dict of features"),
]


@pytest.mark.parametrize(("x", "error", "fragment"), [c[1:] for c in RIVER_CASES],
                         ids=[c[0] for c in RIVER_CASES])
def test_river_refuses_bad_features_naming_the_key(x, error, fragment):
    clf = river()
    before, layout = snapshot(clf.learner), list(clf.features_)
    for call in (lambda: clf.learn_one(x, 0), lambda: clf.predict_one(x)):
        with pytest.raises(error) as err:
            call()
        assert fragment in str(err.value)
    assert snapshot(clf.learner) == before and clf.features_ == layout


@pytest.mark.parametrize("first", [{}, {"a": "x"}, {"a": None, "b": 1.0}],
                         ids=["empty", "string", "none"])
def test_river_a_refused_first_sample_fixes_no_layout(first):
    from ciosl.learners import make_learner
    from ciosl.river import RiverClassifier

    clf = RiverClassifier(make_learner("ncm"))
    with pytest.raises((TypeError, ValueError)):
        clf.learn_one(first, 0)
    assert clf.features_ is None and clf.learner.dim_ is None
    clf.learn_one({"p": 1.0, "q": 2.0}, 0)  # the real first sample
    clf.learn_one({"q": -1.0, "p": 0.0}, 1)
    assert clf.features_ == ["p", "q"] and clf.predict_one({"p": 1.0, "q": 2.0}) == 0


# ---------------------------------------------------------------------------- scikit-learn
def streaming():
    from ciosl.sklearn import StreamingClassifier

    X = np.random.default_rng(0).normal(size=(8, 3))
    return StreamingClassifier(method="ncm").fit(X, [0, 1] * 4), X


def test_partial_fit_checks_every_row_before_learning_any():
    clf, X = streaming()
    before, classes = snapshot(clf.learner_), clf.classes_.tolist()
    Xb = X[:5].copy()
    Xb[3, 1] = 1e30
    with pytest.raises(ValueError, match="position 3 has feature 1 = 1e\\+30"):
        clf.partial_fit(Xb, [2, 2, 3, 4, 5])
    assert snapshot(clf.learner_) == before and clf.classes_.tolist() == classes


def test_partial_fit_failing_midway_leaves_everything_as_it_was(monkeypatch):
    clf, X = streaming()
    before, classes = snapshot(clf.learner_), clf.classes_.tolist()
    real, calls = clf.learner_._learn_one, []

    def third_fails(z, yi):
        calls.append(1)
        if len(calls) == 3:
            raise FloatingPointError("training diverged")
        real(z, yi)

    monkeypatch.setattr(clf.learner_, "_learn_one", third_fails)
    with pytest.raises(FloatingPointError):
        clf.partial_fit(X[:4], [0, 1, 7, 8])
    monkeypatch.undo()
    assert snapshot(clf.learner_) == before
    assert clf.classes_.tolist() == classes  # 7 and 8 were never learned


def test_partial_fit_with_classes_of_another_kind_is_refused_and_later_calls_work():
    clf, X = streaming()
    before = snapshot(clf.learner_)
    with pytest.raises(ValueError, match="labels must be all numbers or all strings, got known "
                                         "labels 0, 1; classes= 'a', 'b'; y 2, 3"):
        clf.partial_fit(X[:2], [2, 3], classes=["a", "b"])
    assert snapshot(clf.learner_) == before and clf.classes_.tolist() == [0, 1]
    clf.partial_fit(X[:2], [2, 3], classes=[4])
    assert clf.classes_.tolist() == [0, 1, 2, 3, 4]
    fresh = type(clf)(method="ncm")
    with pytest.raises(ValueError, match="all numbers or all strings"):
        fresh.partial_fit(X[:2], [0, 1], classes=["a"])
    fresh.partial_fit(X[:2], [0, 1])
    assert fresh.classes_.tolist() == [0, 1]


# ---------------------------------------------------------------------------- integrity
def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def member_span(data: bytes, name_suffix: str) -> tuple[int, int]:
    """(start, end) of the stored bytes of the first zip member whose name ends so."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(name_suffix))
    header = info.header_offset
    n, m = int.from_bytes(data[header + 26:header + 28], "little"), int.from_bytes(
        data[header + 28:header + 30], "little")
    start = header + 30 + n + m
    return start, start + info.compress_size


INTEGRITY_CASES = [  # (id, which member, where in it)
    ("tensor-first-byte", "/data/0", 0),
    ("tensor-middle", "/data/0", 0.5),
    ("tensor-last-byte", "/data/0", -1),
    ("pickle", "data.pkl", 0.5),
]


@pytest.mark.parametrize(("member", "where"), [c[1:] for c in INTEGRITY_CASES],
                         ids=[c[0] for c in INTEGRITY_CASES])
def test_a_flipped_bit_in_a_learner_file_is_refused(member, where, tmp_path):
    import ciosl

    learner = trained("ncm")
    data = learner.save(tmp_path / "a.ciosl").read_bytes()
    start, end = member_span(data, member)
    pos = start + (int((end - start) * where) if isinstance(where, float) else where % (
        end - start))
    bad = tmp_path / "b.ciosl"
    bad.write_bytes(flip(data, pos, 3))
    with pytest.raises(ValueError, match=f"{bad}: (not a readable ciosl learner file "
                                         r"\(damaged\)|damaged ciosl learner file)"):
        ciosl.Learner.load(bad)


def test_no_single_flipped_bit_changes_a_loaded_learner_silently(tmp_path):
    import ciosl

    learner = trained("ncm")
    data = learner.save(tmp_path / "a.ciosl").read_bytes()
    Z = np.random.default_rng(1).normal(size=(5, D))
    P = learner.predict_proba(Z)
    bad = tmp_path / "b.ciosl"
    for pos in range(0, len(data), 7):  # every 7th byte, each bit in turn
        bad.write_bytes(flip(data, pos, pos % 8))
        try:
            loaded = ciosl.Learner.load(bad)
        except ValueError:
            continue
        assert loaded.get_params() == learner.get_params(), pos
        assert np.array_equal(loaded.predict_proba(Z), P), pos
        assert snapshot(loaded) == snapshot(learner), pos


def test_a_flipped_bit_in_a_checkpoint_is_refused(tmp_path):
    from ciosl.evaluation import checkpoint as ck

    learner = trained("tinyer")
    path, ident = tmp_path / "x.ckpt", ck.identity({"experiment": 1})
    ck.save_checkpoint(path, ident, {"runs": [], "current": {"learner": learner.state_dict(),
                                                             "position": 7}})
    assert ck.load_checkpoint(path, ident)["current"]["position"] == 7
    data = path.read_bytes()
    for member in ("/data/0", "/data/3", "data.pkl"):
        start, end = member_span(data, member)
        path.write_bytes(flip(data, (start + end) // 2, 5))
        with pytest.raises(ValueError, match=f"checkpoint {path} is damaged|{path}: not a "
                                             r"readable ciosl checkpoint \(damaged\)"):
            ck.load_checkpoint(path, ident)


def test_a_checkpoint_of_an_unsaveable_learner_is_a_clear_error(tmp_path, user_modules,
                                                                monkeypatch):
    from ciosl.errors import LearnerError
    from ciosl.evaluation import checkpoint as ck
    from ciosl.learners.base import load_method

    monkeypatch.syspath_prepend(str(user_modules))
    learner = load_method("rt3_learners:Unsaveable")()
    learner.fit_base(np.eye(2, D), [0, 1])
    with pytest.raises(LearnerError, match="cannot write checkpoint .*lambda"):
        ck.save_checkpoint(tmp_path / "x.ckpt", "{}", {"learner": learner.state_dict()})
    with pytest.raises(LearnerError, match="rt3-unsaveable.*cannot save to .*lambda"):
        learner.save(tmp_path / "l.ciosl")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- data
def features_npz(tmp: Path, **arrays) -> Path:
    rng = np.random.default_rng(0)
    base = {"train_z": rng.normal(size=(40, 4)), "train_y": np.repeat(np.arange(4), 10),
            "test_z": rng.normal(size=(8, 4)), "test_y": np.repeat(np.arange(4), 2)}
    path = tmp / "feats.npz"
    np.savez(path, **{**base, **arrays})
    return path


def with_value(value: float, row: int = 5, col: int = 2, split: str = "train"):
    def make(tmp: Path) -> list[str]:
        z = np.random.default_rng(0).normal(size=(40 if split == "train" else 8, 4))
        z[row, col] = value
        return run_on(tmp, features_npz(tmp, **{f"{split}_z": z}))
    return make


def run_on(tmp: Path, path: Path) -> list[str]:
    return ["run", *QUICK, "--dataset", f"features:{path}", "--ordering", "iid", "--method",
            "ncm", "--cache", str(tmp / "cache"), "--out", str(tmp / "out")]


def duplicate_member(tmp: Path) -> list[str]:
    path = features_npz(tmp)
    extra = io.BytesIO()
    np.save(extra, np.zeros((40, 4)))
    with zipfile.ZipFile(path, "a") as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("train_z.npy", extra.getvalue())
    return run_on(tmp, path)


def zero_width(tmp: Path) -> list[str]:
    return run_on(tmp, features_npz(tmp, train_z=np.zeros((40, 0)), test_z=np.zeros((8, 0))))


def empty_fashion_test_split(tmp: Path) -> list[str]:
    from test_datasets import write_fashion

    folder = tmp / "fashion"
    write_fashion(folder, n=20)
    import gzip

    from test_datasets import idx_bytes

    for stem, shape in (("t10k-images-idx3-ubyte", (0, 28, 28)), ("t10k-labels-idx1-ubyte", (0,))):
        for old in folder.glob(f"{stem}*"):
            old.unlink()
        (folder / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(shape, np.uint8))))
    return ["features", "--dataset", "fashion-mnist", "--data", str(folder), "--extractor",
            "pixels", "--cache", str(tmp / "cache")]


def data_elsewhere(tmp: Path, monkeypatch) -> list[str]:
    """Fashion-MNIST present in $CIOSL_DATA, a --data folder that does not exist."""
    from test_datasets import write_fashion

    write_fashion(tmp / "home" / "fashion-mnist", n=20)
    monkeypatch.setenv("CIOSL_DATA", str(tmp / "home"))
    return ["features", "--dataset", "fashion-mnist", "--data", str(tmp / "nonexistent"),
            "--extractor", "pixels", "--cache", str(tmp / "cache")]


def data_empty_folder(tmp: Path, monkeypatch) -> list[str]:
    from test_datasets import write_fashion

    write_fashion(tmp / "home" / "fashion-mnist", n=20)
    monkeypatch.setenv("CIOSL_DATA", str(tmp / "home"))
    (tmp / "empty").mkdir()
    return ["features", "--dataset", "fashion-mnist", "--data", str(tmp / "empty"),
            "--extractor", "pixels", "--cache", str(tmp / "cache")]


DATA_CASES = [  # (id, argv maker, fragment); {tmp} is the test's folder
    ("nan-at-row-5", with_value(np.nan), "{tmp}/feats.npz: train_z row 5 has NaN or infinite"),
    ("inf-in-test-row-3", with_value(-np.inf, row=3, split="test"),
     "{tmp}/feats.npz: test_z row 3 has NaN or infinite"),
    ("finite-1e39", with_value(1e39, row=7, col=1),
     "{tmp}/feats.npz: train_z row 7 has feature 1 = 1e+39, beyond +-1e+12: too large"),
    ("zero-width", zero_width, "{tmp}/feats.npz: train_z has 0 features per sample"),
    ("duplicate-member", duplicate_member,
     "{tmp}/feats.npz: damaged features .npz: member(s) 'train_z.npy' stored twice"),
    ("empty-test-split", empty_fashion_test_split,
     "Dataset 'fashion-mnist' ({tmp}/fashion) has no test samples"),
    ("data-does-not-exist", data_elsewhere, "--data {tmp}/nonexistent: no such folder"),
    ("data-without-the-files", data_empty_folder,
     "fashion-mnist: data not found (looked in: {tmp}/empty)"),
    ("features-cache-unwritable", lambda tmp: [
        "features", "--dataset", "digits", "--extractor", "pixels", "--cache", "/proc/nope",
        "--rebuild"], "/proc/nope/features/digits-pixels-"),
    ("features-cache-unwritable-no-rebuild", lambda tmp: [
        "features", "--dataset", "digits", "--extractor", "pixels", "--cache", "/proc/nope"],
     "/proc/nope/features/digits-pixels-"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in DATA_CASES],
                         ids=[c[0] for c in DATA_CASES])
def test_bad_data_is_refused_in_one_line_naming_where(make, fragment, tmp_path, capsys,
                                                      monkeypatch):
    import inspect

    argv = make(tmp_path, monkeypatch) if len(inspect.signature(make).parameters) > 1 else make(
        tmp_path)
    line = one_line_error(*cli(capsys, argv))
    assert fragment.format(tmp=tmp_path) in line, line
    assert not list((tmp_path / "out").glob("*.json"))
    if "cache-unwritable" in fragment or "/proc/nope" in fragment:
        assert "cannot write the feature cache entry" in line


def test_a_replay_memory_too_large_to_allocate_names_the_setting():
    from ciosl.learners.memory import ReplayMemory

    with pytest.raises(ValueError, match=r"buffer=10000000: a replay memory of 10000000 samples "
                                         r"x 10000000 features needs .* GiB, more than can be "
                                         r"allocated here; use a smaller buffer \(--buffer\)"):
        ReplayMemory(10**7, 10**7)


def test_a_full_disk_names_the_file_asked_for_not_its_temporary(tmp_path, monkeypatch):
    import errno

    from ciosl import fileio

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "fsync", full)
    target = tmp_path / "result.json"
    with pytest.raises(OSError, match="No space left on device") as e:
        fileio.atomic_write_json(target, {"a": 1})
    assert e.value.filename == str(target)
    assert not list(tmp_path.iterdir())  # no temporary left behind, nothing written


@pytest.mark.parametrize("what", ["learner", "checkpoint"])
def test_a_fifo_given_as_a_learner_file_or_checkpoint_is_refused_at_once(what, tmp_path):
    from ciosl.evaluation.checkpoint import load_checkpoint
    from ciosl.learners import Learner

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    load = Learner.load if what == "learner" else (lambda p: load_checkpoint(p, "x"))
    with pytest.raises(ValueError, match=r"pipe: not a regular file \(a FIFO"):
        load(fifo)  # returns at once: nothing opens the pipe


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
