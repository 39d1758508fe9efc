"""Class names in a features file (``features:PATH``, ``class_names``): recorded as the text
they are. Byte strings (dtype ``S``, as ``np.array([b"cat"])`` or h5py give them) were recorded
as ``"b'cat'"``; now they are decoded as UTF-8, and bytes that are not UTF-8 are refused,
naming the entry.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ciosl.cli import main
from ciosl.data.datasets import load_features


def features_file(tmp, names) -> str:
    rng = np.random.default_rng(0)
    k = len(names)
    z = np.concatenate([rng.normal(loc=3 * c, size=(20, 4)) for c in range(k)]).astype("f4")
    y = np.repeat(np.arange(k), 20)
    path = tmp / "f.npz"
    np.savez(path, train_z=z, train_y=y, test_z=z, test_y=y, class_names=names)
    return str(path)


# (class_names as stored, the names recorded)
NAMES = [
    (np.array([b"cat", b"dog"]), ("cat", "dog")),
    (np.array([b"cat", "chien-loup é".encode()]), ("cat", "chien-loup é")),
    (np.array(["cat", "dog"]), ("cat", "dog")),
    (np.array([3, 4]), ("3", "4")),
]


@pytest.mark.parametrize("names,recorded", NAMES, ids=lambda v: str(getattr(v, "dtype", v)))
def test_class_names_are_recorded_as_text(tmp_path, names, recorded):
    assert load_features(features_file(tmp_path, names)).class_names == recorded


def test_byte_string_class_names_reach_the_result_decoded(tmp_path, capsys):
    path = features_file(tmp_path, np.array([b"cat", b"dog", b"cow", "émeu".encode()]))
    assert main(["run", "--dataset", f"features:{path}", "--ordering", "class_iid",
                 "--method", "ncm", "--seeds", "0", "--quiet", "--offline-epochs", "1",
                 "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")]) == 0, \
        capsys.readouterr().err
    (result,) = (tmp_path / "out").glob("*.json")
    assert json.loads(result.read_text())["class_names"] == ["cat", "dog", "cow", "émeu"]


def test_class_names_that_are_not_utf8_are_refused_naming_the_entry(tmp_path):
    path = features_file(tmp_path, np.array([b"cat", b"d\xffg"]))
    with pytest.raises(ValueError, match=r"f\.npz: class_names\[1\] = b'd\\xffg' is not UTF-8 "
                                         r"text \(byte 1\)"):
        load_features(path)
