"""acil (exact recursive least squares on random ReLU features) against a direct ridge solve on
the same features, at random moments of a stream; its Woodbury state against a fresh inverse
after thousands of updates; rollback and the state rule (published tensors never written)."""

import numpy as np
import pytest
import torch
from scipy.special import softmax

from ciosl.learners import make_learner
from ciosl.serial import digest


def stream(n, dim=24, n_classes=9, seed=0):
    """Classes appearing one after another (class k from sample 40 k on), then mixed."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, (n_classes, dim))
    y = np.minimum(rng.integers(0, n_classes, n), np.arange(n) // 40)
    return (centers[y] + rng.normal(size=(n, dim))).astype(np.float32), y


def ridge(learner, Z, y, gamma):
    """W^T (K, D) = ((H^T H + gamma I)^-1 H^T Y)^T on the learner's features, and R."""
    H = learner.transform(Z)
    Y = np.eye(len(learner.classes_))[[learner.classes_.index(v) for v in y]]
    A = H.T @ H + gamma * np.eye(H.shape[1])
    return np.linalg.solve(A, H.T @ Y).T, np.linalg.inv(A)


@pytest.mark.parametrize("D, gamma", [(48, 0.3), (96, 10.0)])
def test_every_moment_equals_a_direct_ridge_solve(D, gamma):
    Z, y = stream(600)
    Zt, _ = stream(40, seed=1)
    learner = make_learner("acil", proj_dim=D, gamma=gamma)
    learner.fit_base(Z[:30], y[:30])
    rng = np.random.default_rng(2)
    i, checks = 30, 0
    while i < len(y):
        if rng.random() < 0.5:
            learner.learn_one(Z[i], y[i])
            i += 1
        else:
            b = int(rng.integers(2, 40))
            learner.learn_many(Z[i:i + b], y[i:i + b])
            i += b
        if rng.random() < 0.2:  # a random moment
            W, _ = ridge(learner, Z[:i], y[:i], gamma)
            out = learner.transform(Zt) @ W.T
            np.testing.assert_allclose(learner.predict_proba(Zt), softmax(out, axis=1),
                                       rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(learner.W.numpy(), W, atol=1e-9 * np.abs(W).max())
            checks += 1
    assert checks >= 5 and len(learner.classes_) == 9


def test_the_inverse_stays_near_a_fresh_one_after_thousands_of_updates():
    gamma = 1.0
    Z, y = stream(4000, n_classes=9)
    learner = make_learner("acil", proj_dim=64, gamma=gamma)
    for z, label in zip(Z[:3000], y[:3000], strict=True):
        learner.learn_one(z, label)
    learner.learn_many(Z[3000:], y[3000:])  # two Woodbury blocks
    W, R = ridge(learner, Z, y, gamma)
    R_kept = learner.R.numpy()
    assert np.abs(R_kept - R).max() / np.abs(R).max() < 1e-9
    assert np.abs(learner.W.numpy() - W).max() / np.abs(W).max() < 1e-9
    np.testing.assert_array_equal(R_kept, R_kept.T)  # symmetric to the bit


def test_published_tensors_are_never_written_and_a_raising_call_restores_them(monkeypatch):
    Z, y = stream(200)
    learner = make_learner("acil", proj_dim=64, gamma=0.5)
    learner.fit_base(Z[:60], y[:60])
    R0, Wt0 = learner._R, learner._Wt
    values = R0.clone(), Wt0.clone()
    learner.learn_one(Z[60], y[60])
    rows = learner._U[:learner._r].clone()
    learner.learn_one(Z[61], y[61])  # a second pending row: the first is not written
    assert learner._r == 2 and torch.equal(learner._U[:1], rows)
    learner.learn_many(Z[62:70], y[62:70])
    assert learner._R is not R0 and torch.equal(R0, values[0]) and torch.equal(Wt0, values[1])
    learner.learn_one(Z[70], y[70])  # one pending row in the state below
    before, R1, Wt1 = digest(learner.state_dict()), learner._R, learner._Wt
    r1, U1 = learner._r, learner._U[:learner._r].clone()
    classes = list(learner.classes_)
    twin = make_learner("acil", proj_dim=64, gamma=0.5)
    twin.load_state_dict(learner.state_dict())
    # a failure inside the block update, after the new classes grew W and one block was done
    calls = [0]
    project = type(learner)._project

    def failing(self, Z):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected")
        return project(self, Z)

    monkeypatch.setattr("ciosl.learners.acil.BLOCK", 4)
    monkeypatch.setattr(type(learner), "_project", failing)
    new = np.arange(9) + 100  # nine new classes: W's buffer grows past its capacity
    with pytest.raises(RuntimeError, match="injected"):
        learner.learn_many(Z[70:79], new)
    monkeypatch.undo()
    assert learner._R is R1 and learner._Wt is Wt1 and learner.classes_ == classes
    assert learner._r == r1 and torch.equal(learner._U[:r1], U1)
    assert digest(learner.state_dict()) == before
    for model in (learner, twin):
        model.learn_many(Z[70:79], new)
        for z, label in zip(Z[79:90], y[79:90], strict=True):
            model.learn_one(z, label)
    assert digest(learner.state_dict()) == digest(twin.state_dict())


def test_a_lost_positive_definiteness_raises_before_anything_moves():
    Z, y = stream(50)
    learner = make_learner("acil", proj_dim=16, gamma=1.0)
    learner.fit_base(Z[:20], y[:20])
    before = digest(learner.state_dict())
    assert learner._r == 0  # after a batch: nothing pending, R is R0
    learner._R = -learner._R  # c = 1 - h^T R h < 1
    R = learner._R
    with pytest.raises(FloatingPointError, match="positive definite"):
        learner.learn_one(Z[20], y[20])
    with pytest.raises(FloatingPointError, match="positive definite"):
        learner.learn_many(Z[20:30], y[20:30])
    assert learner._R is R and learner._r == 0
    learner._R = -learner._R
    assert digest(learner.state_dict()) == before


def test_state_round_trip_answers_and_continues_bit_for_bit():
    Z, y = stream(300)
    a = make_learner("acil", proj_dim=40, gamma=2.0)
    a.fit_base(Z[:50], y[:50])
    for z, label in zip(Z[50:150], y[50:150], strict=True):
        a.learn_one(z, label)
    b = make_learner("acil", proj_dim=40, gamma=2.0).load_state_dict(a.state_dict())
    np.testing.assert_array_equal(a.predict_proba(Z[:20]), b.predict_proba(Z[:20]))
    for model in (a, b):
        model.learn_many(Z[150:250], y[150:250])
        for z, label in zip(Z[250:], y[250:], strict=True):
            model.learn_one(z, label)
    assert digest(a.state_dict()) == digest(b.state_dict())
    np.testing.assert_array_equal(a.predict_proba(Z), b.predict_proba(Z))
    bad = a.state_dict()
    bad["state"]["W"] = bad["state"]["W"][:-1]
    with pytest.raises(ValueError, match="inconsistent"):
        make_learner("acil", proj_dim=40, gamma=2.0).load_state_dict(bad)


def test_a_learn_reads_the_base_inverse_and_writes_one_row_folding_every_few():
    """learn_one writes one row of U (R = R0 - U^T U) and replaces R0 only when U is full: the
    D x D matrix is written once every len(U) learns, not once a learn."""
    Z, y = stream(400)
    learner = make_learner("acil", proj_dim=96, gamma=1.0)
    learner.fit_base(Z[:20], y[:20])
    fold = len(learner._U)
    assert fold == 96 // 16
    replaced = 0
    for i in range(20, 20 + 5 * fold):
        R0 = learner._R
        learner.learn_one(Z[i], y[i])
        replaced += learner._R is not R0
        assert learner._r == (i - 19) % fold
    assert replaced == 5
    W, R = ridge(learner, Z[:20 + 5 * fold], y[:20 + 5 * fold], 1.0)
    assert np.abs(learner._R.numpy() - R).max() / np.abs(R).max() < 1e-10  # all folded
    states = []  # every state passed through (a reader's twin may hold any): its pending rows
    for i in range(20 + 5 * fold, 20 + 7 * fold + 2):  # are never written later, folds and
        states.append((learner._U, learner._r, learner._U[:learner._r].clone()))  # batches
        learner.learn_one(Z[i], y[i])  # included
        if i % 5 == 0:
            learner.learn_many(Z[i:i + 2], y[i:i + 2])
    assert all(torch.equal(U[:r], rows) for U, r, rows in states)


def test_a_file_without_pending_rows_loads():
    """A state file written before the pending rows existed (R and W only) loads, with none
    pending, and answers as the learner that wrote it."""
    Z, y = stream(120)
    a = make_learner("acil", proj_dim=40, gamma=2.0)
    a.learn_many(Z[:100], y[:100])
    old = a.state_dict()
    del old["state"]["U"]
    b = make_learner("acil", proj_dim=40, gamma=2.0).load_state_dict(old)
    assert b._r == 0
    np.testing.assert_array_equal(a.predict_proba(Z[100:]), b.predict_proba(Z[100:]))


def test_new_classes_grow_the_weights_by_capacity_doubling():
    learner = make_learner("acil", proj_dim=8, gamma=1.0)
    z = np.ones(4, np.float32)
    caps = []
    for k in range(40):
        learner.learn_one(z * (k + 1), k)
        caps.append(len(learner._Wt))
    assert caps[0] == 8 and caps[8] == 16 and caps[16] == 32 and caps[32] == 64
    assert learner.W.shape == (40, 8)
    assert learner.predict_proba(z[None]).shape == (1, 40)


def test_the_same_seed_gives_ranpacs_features():
    Z, y = stream(20)
    a, r = make_learner("acil", proj_dim=32, seed=3), make_learner("ranpac", proj_dim=32, seed=3)
    a.learn_one(Z[0], y[0])
    r.learn_one(Z[0], y[0])
    np.testing.assert_array_equal(a.transform(Z), r.transform(Z))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="gamma"):
        make_learner("acil", gamma=0.0)
    with pytest.raises(ValueError, match="proj_dim"):
        make_learner("acil", proj_dim=0)


@pytest.mark.parametrize("n, block", [(1, 3), (7, 3), (9, 3), (10, 512)])
def test_symmetrize_in_blocks_is_the_average_with_the_transpose_to_the_bit(n, block):
    from ciosl.learners.acil import _symmetrize_
    R = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    expected = 0.5 * (R + R.T)
    out = _symmetrize_(R, block=block)
    assert out is R  # in place: no second D x D tensor
    assert torch.equal(out, expected) and torch.equal(out, out.T)
