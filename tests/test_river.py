"""The river adapter (``ciosl.river``) refuses bad features in one line naming the key, and a
refused first sample fixes no feature layout."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.river import RiverClassifier
from helpers import (
    one_line,
    snapshot,
)


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


HUGE_INT_CASES = [
    ("int-beyond-float", {"a": 10**400}, "feature 'a' = 1e+400 (an int) is too large"),
    ("negative-int-beyond-float", {"b": -(10**400)}, "feature 'b' = -1e+400 (an int) is too large"),
    ("int-beyond-str-limit", {"a": 3 * 10**5000}, "feature 'a' = 3e+5000 (an int) is too large"),
    ("numpy-0d-huge-int", {"a": np.array(10**400, dtype=object)}, "feature 'a' = 1e+400"),
]


@pytest.mark.parametrize(("x", "fragment"), [c[1:] for c in HUGE_INT_CASES],
                         ids=[c[0] for c in HUGE_INT_CASES])
def test_river_refuses_huge_ints_naming_the_feature(x, fragment):
    clf = river()
    before, layout = snapshot(clf.learner), list(clf.features_)
    for call in (lambda: clf.learn_one(x, 0), lambda: clf.predict_proba_one(x),
                 lambda: clf.predict_one(x)):
        with pytest.raises(ValueError) as err:
            call()
        text = one_line(err.value)
        assert fragment in text and len(text) < 200, text
    assert snapshot(clf.learner) == before and clf.features_ == layout


def test_river_a_huge_int_first_sample_fixes_no_layout():
    clf = RiverClassifier(make_learner("ncm"))
    with pytest.raises(ValueError, match="feature 'a'"):
        clf.learn_one({"a": 10**400}, 0)
    with pytest.raises(ValueError, match="feature 'a'"):
        clf.predict_proba_one({"a": 10**400})
    assert clf.features_ is None and clf.learner.dim_ is None
