"""Every registered learner (and each of its ``conformance_settings``) passes every check."""

import pytest

from ciosl.conformance import CHECKS, case_id, cases


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_conformance(case, check):
    cls, settings = case
    check(cls, settings)
