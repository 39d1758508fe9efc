"""Every registered learner (and each of its ``conformance_settings``) passes every check,
those a built-in must pass besides included (``BUILTIN_CHECKS``: an undo record)."""

from __future__ import annotations

import pytest

from ciosl.cli import main
from ciosl.conformance import BUILTIN_CHECKS, case_id, cases
from helpers import (
    QUICK,
    cli,
    one_line_error,
)


@pytest.mark.parametrize("check", BUILTIN_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_conformance(case, check):
    cls, settings = case
    check(cls, settings)


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


@pytest.mark.parametrize("method", ["finetune", "ewc", "ciosl", "ncm", "tinyer"])
def test_the_rollback_checks_fail_when_rollback_is_broken(method, monkeypatch):
    """Rollback broken once (the learner's ``_undo`` puts nothing back): the conformance
    checks of the all-or-nothing promise fail, so their passing means something."""
    from ciosl.conformance import check_failure_rolls_back, check_faults
    from ciosl.learners import available_methods

    cls = available_methods()[method]
    monkeypatch.setattr(cls, "_undo", lambda self, record, n_classes: None)
    for check in (check_faults, check_failure_rolls_back):
        with pytest.raises(AssertionError):
            check(cls, {})
