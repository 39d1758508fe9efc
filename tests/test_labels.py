"""Labels of every kind a user may hand a learner, directly or through an adapter: what is
learned can always be saved, ``predict`` answers exactly the labels learned (as ``predict_one``
does), and a refused label gets a message that says what is wrong.

- subclasses of int and str (an ``IntEnum``, ``class MyInt(int)``, ``class MyStr(str)``) become
  the plain values they hold at the door (``learners.base.plain_label``): before, they were
  learned and then the learner could never be saved ("it holds a __main__.Color");
- integers beyond int64 (``2**64 - 1``, ``2**63 + 1``): ``predict`` answered floats, labels
  never learned;
- ``StreamingClassifier.fit`` with an object array of integers (``[2**63, 0]``) got
  scikit-learn's "regression target" message.
"""

from __future__ import annotations

import enum

import numpy as np
import pytest

from ciosl import make_learner
from ciosl.learners.base import Learner
from ciosl.river import RiverClassifier
from ciosl.sklearn import StreamingClassifier


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


class MyInt(int):
    def __int__(self):  # a subclass may say anything about itself: its value is what counts
        return 99


class MyStr(str):
    def __str__(self):
        return "not the label"


class Kind(str, enum.Enum):
    CAT = "cat"
    DOG = "dog"


Z = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)

# (name, labels given, the plain labels learned)
SUBCLASSED = [
    ("IntEnum", [Color.RED, Color.BLUE, Color.RED], [1, 2]),
    ("int subclass", [MyInt(1), MyInt(2), MyInt(1)], [1, 2]),
    ("str subclass", [MyStr("a"), MyStr("b"), MyStr("a")], ["a", "b"]),
    ("str Enum", [Kind.CAT, Kind.DOG, Kind.CAT], ["cat", "dog"]),
    ("NumPy integers", list(np.array([1, 2, 1], dtype=np.uint8)), [1, 2]),
]


@pytest.mark.parametrize("feed", ["learn_one", "learn_many", "fit_base"])
@pytest.mark.parametrize("name,labels,plain", SUBCLASSED, ids=[s[0] for s in SUBCLASSED])
def test_subclassed_labels_are_learned_as_plain_values_and_can_be_saved(
        tmp_path, feed, name, labels, plain):
    learner = make_learner("ncm")
    if feed == "learn_one":
        for z, y in zip(Z, labels, strict=False):
            learner.learn_one(z, y)
    else:
        getattr(learner, feed)(Z[:len(labels)], labels)
    assert learner.classes_ == plain
    assert all(type(c) in (int, str) for c in learner.classes_)
    back = Learner.load(learner.save(tmp_path / "m.ciosl"))
    assert back.classes_ == plain
    assert back.predict(Z).tolist() == learner.predict(Z).tolist()
    assert learner.predict_one(Z[0]) in plain


def test_a_subclassed_label_mixed_with_plain_ones_is_one_class_not_an_error():
    learner = make_learner("ncm")
    learner.learn_one(Z[0], 1)
    learner.learn_one(Z[1], MyInt(2))  # was: "label 2 is an integer but this learner's
    learner.learn_one(Z[2], Color.RED)  # labels are integers"
    assert learner.classes_ == [1, 2]


# (labels learned, label that mixes kinds) -> the message names both kinds plainly
MIXED = [([1, 2], "a", "label 'a' is a string but this learner's labels are integers"),
         (["a"], MyInt(3), "label 3 is an integer but this learner's labels are strings"),
         ([Color.RED], MyStr("x"), "label 'x' is a string but this learner's labels are "
                                   "integers")]


@pytest.mark.parametrize("learned,new,message", MIXED)
def test_mixing_integers_and_strings_is_refused_saying_which_is_which(learned, new, message):
    learner = make_learner("ncm")
    for z, y in zip(Z, learned, strict=False):
        learner.learn_one(z, y)
    with pytest.raises(TypeError, match=message):
        learner.learn_one(Z[3], new)


# integer labels beyond int64, with a small one: predict answers exactly what was learned
HUGE = [[2**64 - 1, 0], [2**63 + 1, 0], [-(2**63) - 1, 5], [2**100, -(2**100)]]


@pytest.mark.parametrize("labels", HUGE, ids=str)
@pytest.mark.parametrize("method", ["ncm", "slda", "rp_lda"])
def test_predict_answers_integer_labels_beyond_int64_exactly(method, labels):
    learner = make_learner(method)
    X = np.array([[10.0, 0, 0], [-10.0, 0, 0]], dtype=np.float32)
    learner.learn_many(X, labels)
    predicted = learner.predict(X)
    assert predicted.tolist() == labels  # exact Python ints, never 1.8446744073709552e+19
    assert all(type(v) is int for v in predicted.tolist())
    assert [learner.predict_one(x) for x in X] == predicted.tolist()
    assert learner.score(X, labels) == 1.0


@pytest.mark.parametrize("labels,dtype", [([3, 7], np.int64), (["a", "b"], np.str_)])
def test_ordinary_labels_keep_their_array_type(labels, dtype):
    learner = make_learner("ncm")
    learner.learn_many(Z[:2], labels)
    assert np.issubdtype(learner.predict(Z[:2]).dtype, dtype)


# ---------------------------------------------------------------------------- adapters


@pytest.mark.parametrize("name,labels,plain", SUBCLASSED[:4], ids=[s[0] for s in SUBCLASSED[:4]])
def test_the_river_adapter_learns_subclassed_labels_as_plain_values(tmp_path, name, labels,
                                                                      plain):
    model = RiverClassifier(make_learner("ncm"))
    for z, y in zip(Z, labels, strict=False):
        model.learn_one({"a": float(z[0]), "b": float(z[1])}, y)
    assert model.learner.classes_ == plain
    Learner.load(model.learner.save(tmp_path / "r.ciosl"))


@pytest.mark.parametrize("name,labels,plain", SUBCLASSED[:4], ids=[s[0] for s in SUBCLASSED[:4]])
def test_the_sklearn_adapter_keeps_plain_labels(name, labels, plain):
    y = np.empty(len(labels), dtype=object)
    y[:] = labels
    clf = StreamingClassifier(method="ncm").fit(Z[:len(labels)], y)
    assert sorted(clf.classes_.tolist()) == sorted(plain)
    assert all(type(k) in (int, str) for k in clf._code)


# object arrays of integers: as the integers they hold, or refused naming the label
OBJECT_INTS = [([2**63, 0], [2**63, 0]), ([5, 7], [5, 7]), ([2**64 - 1, 1], [2**64 - 1, 1])]


@pytest.mark.parametrize("labels,expected", OBJECT_INTS, ids=str)
def test_the_sklearn_adapter_takes_object_arrays_of_integers(labels, expected):
    y = np.empty(len(labels), dtype=object)
    y[:] = labels
    clf = StreamingClassifier(method="ncm").fit(Z[:2], y)
    assert sorted(clf.predict(Z[:2]).tolist()) == sorted(expected)


def test_the_sklearn_adapter_names_an_integer_label_no_64_bit_type_holds():
    y = np.empty(2, dtype=object)
    y[:] = [2**70, 0]
    with pytest.raises(ValueError, match=r"label 1180591620717411303424 does not fit the "
                                         r"labels' type \(int64 or uint64\)"):
        StreamingClassifier(method="ncm").fit(Z[:2], y)
