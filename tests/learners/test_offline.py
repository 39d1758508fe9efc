"""The Offline method: the protocol's offline reference, exactly."""

from __future__ import annotations

import numpy as np
import pytest

from ciosl.data.datasets import get_spec
from ciosl.evaluation.experiment import ExperimentSpec, resolve_settings, run_experiment
from ciosl.learners import make_learner
from ciosl.learners.head import train_offline
from ciosl.learners.offline import Offline
from helpers import class_blobs


def test_offline_protocol_defaults_follow_the_dataset():
    spec = get_spec("digits")
    s = resolve_settings(Offline, spec, "iid", None, {})
    assert s == {"epochs": spec.offline_epochs, "batch_size": spec.offline_batch_size}
    assert Offline.protocol_defaults(ordering="iid") == {}


@pytest.mark.parametrize("ordering", ["class_iid", "iid"])
def test_offline_method_matches_the_reference_exactly(tmp_path, ordering):
    Z, y = class_blobs(40, n_classes=6, sep=0.8, seed=6)  # overlapping: accuracy far from 1
    Zt, yt = class_blobs(25, n_classes=6, sep=0.8, seed=7)
    path = tmp_path / "feats.npz"
    np.savez(path, train_z=Z, train_y=y, test_z=Zt, test_y=yt)
    res = run_experiment(ExperimentSpec(
        dataset=f"features:{path}", ordering=ordering, method="offline", seeds=[0, 1],
        offline_epochs=4, settings={"epochs": "4"}, cache_dir=tmp_path / "cache"))
    accs = []
    for run in res["runs"]:
        assert run["accuracy"] == run["accuracy_offline"]
        assert run["omega_all"] == 1.0
        accs += run["accuracy"]
    assert res["omega_all"] == {"mean": 1.0, "std": 0.0, "events": "after_base"}
    assert min(accs) < 0.9  # not saturated, so equality is not trivial
    assert res["violates_single_pass"] is True


def test_offline_maps_sorted_units_back_to_classes_order():
    Z, y = class_blobs(20, n_classes=3, seed=8)
    labels = np.array(["zebra", "ant", "moth"])
    learner = make_learner("offline", epochs=3, batch_size=16, seed=2)
    learner.fit_base(Z[:30], labels[y[:30]])
    for z, k in zip(Z[30:], y[30:], strict=True):
        learner.learn_one(z, labels[k])
    P = learner.predict_proba(Z)
    classes, yi = np.unique(labels[y], return_inverse=True)
    ref = train_offline(Z, yi, 3, epochs=3, batch_size=16, seed=2 * 1000 + 0)
    R = ref.predict_proba(Z)
    for j, lab in enumerate(learner.classes_):
        np.testing.assert_array_equal(P[:, j], R[:, list(classes).index(lab)])
    assert learner.n_trains == 1
    learner.predict_proba(Z)  # no new data: cached, t unchanged
    assert learner.n_trains == 1
    learner.learn_one(Z[0], "ant")
    learner.predict_proba(Z)
    assert learner.n_trains == 2
