"""Rules shared by several methods: a failed step leaves the anchor (EWC, MAS) or the prior
(CIOSL, VCL) as before; the single-pass flags and the settings of the regularization and coreset
baselines."""

from __future__ import annotations

import pytest

from ciosl.conformance import blobs
from ciosl.learners import make_learner
from ciosl.learners.coreset_only import CoresetOnly
from ciosl.learners.ewc import EWC
from ciosl.learners.vcl import VCL
from ciosl.learners.vcl_coreset import VCLCoreset


@pytest.mark.parametrize(("method", "settings"), [
    ("ewc", {}), ("mas", {}), ("ciosl", {"prior_refresh": "every"}),
    ("vcl", {"prior_refresh": "every"})])
def test_a_known_step_failing_after_its_refresh_leaves_the_anchor_as_before(method, settings):
    """A known-class learn_one with a refresh due whose finite check raises: the Bayesian
    heads re-anchor before the check (their prior and its schedule are put back); EWC and MAS
    re-anchor after it (their anchor, penalty importance, curvature and counters are untouched).
    Either way the learner is as before the call, and it continues as a twin."""
    from ciosl.serial import digest

    twins = [make_learner(method, refresh_every=2, base_epochs=1, **settings)
             for _ in range(2)]
    Z, y = blobs([0, 1], 6, seed=4)
    for t in twins:
        t.fit_base(Z[:4], y[:4])
        t.learn_one(Z[4], int(y[4]))
        t.learn_one(Z[5], int(y[5]))  # a refresh is due at the next step
    learner, twin = twins
    before = digest(learner.state_dict())

    def non_finite(*args, **kwargs):
        raise FloatingPointError("injected")

    learner._check_finite = non_finite
    for _ in range(2):
        with pytest.raises(FloatingPointError):
            learner.learn_one(Z[6], int(y[6]))
        assert digest(learner.state_dict()) == before
    del learner._check_finite
    for t in twins:
        for z, c in zip(Z[6:], y[6:], strict=True):
            t.learn_one(z, int(c))
    assert digest(learner.state_dict()) == digest(twin.state_dict())


def test_single_pass_flags_and_settings():
    assert VCLCoreset.violates_single_pass and CoresetOnly.violates_single_pass
    assert not (EWC.violates_single_pass or VCL.violates_single_pass)
    assert not make_learner("mas").violates_single_pass
    assert EWC().lam == 500.0 and make_learner("mas").lam == 1.0
    with pytest.raises(ValueError, match="valid choices"):
        VCLCoreset(replacement="lawrrr")
    with pytest.raises(ValueError, match="buffer"):
        VCLCoreset(buffer=0)
    with pytest.raises(ValueError, match="max_penalty_step"):
        EWC(max_penalty_step=0.0)
