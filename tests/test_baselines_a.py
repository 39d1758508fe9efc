"""The characteristic rule of each baseline: TinyER, A-GEM, GDumb, Offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ciosl.data.datasets import get_spec
from ciosl.evaluation.experiment import ExperimentSpec, resolve_settings, run_experiment
from ciosl.learners import agem, gdumb, make_learner
from ciosl.learners.agem import project
from ciosl.learners.head import train_offline
from ciosl.learners.offline import Offline


def blobs(n_per_class, n_classes=4, dim=8, sep=3.0, seed=0, shuffle=True):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(100).normal(size=(n_classes, dim)) * sep
    y = np.repeat(np.arange(n_classes), n_per_class)
    if shuffle:
        y = rng.permutation(y)
    return (centers[y] + rng.normal(size=(len(y), dim))).astype(np.float32), y


# ---------------------------------------------------------------------------- TinyER
def test_tinyer_steps_on_new_sample_plus_replay(monkeypatch):
    Z, y = blobs(30, seed=1)
    learner = make_learner("tinyer", buffer=40, n_replay=16, base_epochs=1)
    learner.fit_base(Z[:30], y[:30])
    seen = []
    monkeypatch.setattr(learner, "_step", lambda X, Y: seen.append((X.clone(), Y.clone())))
    learner.learn_one(Z[30], y[30])
    X, Y = seen[0]
    assert X.shape == (17, Z.shape[1]) and len(Y) == 17  # one joint batch: new + N1'
    assert torch.equal(X[0], torch.from_numpy(Z[30])) and learner.classes_[int(Y[0])] == y[30]
    rows = {tuple(r) for r in learner.memory.z[:len(learner.memory)].tolist()}
    assert all(tuple(r) in rows for r in X[1:].tolist())  # replayed rows come from memory
    assert len({tuple(r) for r in X[1:].tolist()}) == 16  # without replacement


def test_tinyer_memory_is_a_reservoir():
    B, N = 20, 400
    late = []
    for seed in range(5):
        Z, y = blobs(N // 4, seed=seed)
        Z[:, 0] = np.arange(N)  # identifies each sample
        learner = make_learner("tinyer", buffer=B, base_epochs=0, lr=1e-4, seed=seed)
        learner.fit_base(Z[:10], y[:10])
        for i in range(10, N):
            learner.learn_one(Z[i], y[i])
            assert learner.memory_size() == min(i + 1, B)
        assert learner.memory.n_offered == N
        ids = learner.memory.z[:, 0].numpy()
        assert len(np.unique(ids)) == B
        late.append(int(np.sum(ids >= N // 2)))
    # each sample is held with probability B / N: half the memory from the second half
    assert 35 <= sum(late) <= 65, late


# ---------------------------------------------------------------------------- A-GEM
def test_agem_projection_rule():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        g, g_ref = torch.randn(300, generator=gen), torch.randn(300, generator=gen)
        g_t = project(g, g_ref)
        if torch.dot(g, g_ref) >= 0:
            assert g_t is g  # no conflict: unchanged
        else:
            assert torch.dot(g_t, g_ref) >= -1e-4 * g_ref.norm() * g.norm()
            assert torch.dot(g_t, g_ref).abs() < 1e-4 * g_ref.norm() * g.norm()
            # only the component along g_ref was removed
            resid = g - g_t
            assert torch.allclose(resid, (resid @ g_ref / (g_ref @ g_ref)) * g_ref, atol=1e-5)


def test_agem_step_applies_the_projected_gradient(monkeypatch):
    Z, y = blobs(40, seed=2, shuffle=False)  # class after class: gradients conflict
    learner = make_learner("agem", buffer=30, base_epochs=2, momentum=0.0, weight_decay=0.0)
    learner.fit_base(Z[:80], y[:80])
    calls = []
    real = agem.project

    def spy(g, g_ref):
        out = real(g, g_ref)
        calls.append((g, g_ref, out))
        return out

    monkeypatch.setattr(agem, "project", spy)
    for i in range(80, 160):
        before = torch.cat([p.detach().reshape(-1) for p in learner.net.params])
        learner.learn_one(Z[i], y[i])
        after = torch.cat([p.detach().reshape(-1) for p in learner.net.params])
        g, g_ref, g_t = calls[-1]
        assert torch.dot(g_t, g_ref) >= -1e-5 * g.norm() * g_ref.norm()
        if torch.dot(g, g_ref) >= 0:
            assert torch.equal(g_t, g)
        if before.shape != after.shape:  # a new class's output unit grew in this call
            continue
        torch.testing.assert_close(after - before, -learner.lr * g_t, rtol=1e-4, atol=1e-7)
    assert learner.n_projected > 0  # conflicts happened and were projected
    assert learner.n_projected == sum(int(torch.dot(g, r) < 0) for g, r, _ in calls)


# ---------------------------------------------------------------------------- GDumb
def test_gdumb_memory_stays_class_balanced():
    B = 20
    learner = make_learner("gdumb", buffer=B, retrain_epochs=1)
    Z, y = blobs(30, n_classes=6, seed=3, shuffle=False)  # class after class
    learner.fit_base(Z[:60], y[:60])  # classes 0 and 1
    for k in range(2, 6):
        for i in np.flatnonzero(y == k):
            learner.learn_one(Z[i], y[i])
            assert learner.memory_size() <= B
        counts = learner.memory.class_counts()
        assert learner.memory_size() == B and len(counts) == k + 1
        assert max(counts.values()) - min(counts.values()) <= 1, counts
    # an iid stream too
    learner = make_learner("gdumb", buffer=B, retrain_epochs=1, seed=1)
    Z, y = blobs(50, n_classes=3, seed=4)
    learner.fit_base(Z[:5], y[:5])
    for z, k in zip(Z[5:], y[5:], strict=True):
        learner.learn_one(z, k)
    counts = learner.memory.class_counts()
    assert sorted(counts.values()) == [6, 7, 7]


def test_gdumb_retrains_from_scratch_only_when_memory_changes(monkeypatch):
    calls = []

    def counting(*args, **kw):
        calls.append(kw["seed"])
        return train_offline(*args, **kw)

    monkeypatch.setattr(gdumb, "train_offline", counting)
    Z, y = blobs(10, n_classes=2, seed=5)
    learner = make_learner("gdumb", buffer=10, retrain_epochs=3)
    learner.fit_base(Z[:10], y[:10])  # fills the memory; classes 5/5 (or so)
    with torch.no_grad():  # as the runner predicts: the retraining still has gradients
        P = learner.predict_proba(Z)
    assert len(calls) == 1
    np.testing.assert_array_equal(learner.predict_proba(Z), P)  # cached
    assert len(calls) == 1
    # from scratch: exactly a fresh train_offline on the memory
    Zm, ym = learner.memory.batch(np.arange(10))
    fresh = train_offline(Zm.numpy(), ym.numpy(), 2, epochs=3, batch_size=16, seed=calls[0])
    np.testing.assert_allclose(P, fresh.predict_proba(Z), rtol=1e-6)
    counts = learner.memory.class_counts()
    full = max(counts, key=counts.get)  # a class at (or above) its share: dropped, no change
    i = int(np.flatnonzero(y[10:] == full)[0]) + 10
    version = learner.version
    learner.learn_one(Z[i], y[i])
    assert counts[full] >= 5 and learner.version == version
    learner.predict_proba(Z)
    assert len(calls) == 1
    learner.learn_one(Z[0] + 100.0, 99)  # a new class (99) is always stored
    assert learner.version > version
    assert learner.predict_proba(Z).shape == (len(Z), 3)
    assert len(calls) == 2


# ---------------------------------------------------------------------------- Offline
def test_offline_protocol_defaults_follow_the_dataset():
    spec = get_spec("digits")
    s = resolve_settings(Offline, spec, "iid", None, {})
    assert s == {"epochs": spec.offline_epochs, "batch_size": spec.offline_batch_size}
    assert Offline.protocol_defaults(ordering="iid") == {}


@pytest.mark.parametrize("ordering", ["class_iid", "iid"])
def test_offline_method_matches_the_reference_exactly(tmp_path, ordering):
    Z, y = blobs(40, n_classes=6, sep=0.8, seed=6)  # overlapping: accuracy far from 1
    Zt, yt = blobs(25, n_classes=6, sep=0.8, seed=7)
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
    Z, y = blobs(20, n_classes=3, seed=8)
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
