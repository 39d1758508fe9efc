"""Answers at any moment (issue 49): the closed forms keep their solution between answers and
catch up on the rows learned since, instead of refitting at the first answer after a learn.

At random moments of a real stream (scikit-learn's digits, learned one sample or one small
batch at a time), every answer equals the batch solution on the samples seen so far with the
shrinkage or ridge the learner reports; a prediction after one learn factorizes nothing; the
corrections since the last refit never pass d / 4 rows, which bounds how far the held
shrinkage is from the one the scheme would choose now.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from scipy.special import softmax
from sklearn.datasets import load_digits
from sklearn.linear_model import Ridge

from ciosl.learners import anytime, make_learner
from ciosl.learners.base import lock_of
from ciosl.serial import digest

BLOCK = 32  # a small buffer: commits, and answers two commits apart, happen often


@pytest.fixture(scope="module")
def digits():
    Z, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return (Z[order] / 16.0).astype(np.float32), y[order]


def features(learner, Z):
    return learner.transform(Z) if hasattr(learner, "transform") else Z.astype(np.float64)


def lda_reference(learner, H, y, Ht, frozen_until=None):
    """LDA's probabilities on Ht from the samples H (n, d), y, with the learner's shrinkage:
    (1 - e) S / t + e I ("fixed") or + e tr(S) / (t d) I ("oas"); the scatter S of the first
    ``frozen_until`` samples only if the covariance is frozen."""
    cls = learner.classes_
    mu = np.stack([H[y == c].mean(0) for c in cls])
    Hs, ys = (H, y) if frozen_until is None else (H[:frozen_until], y[:frozen_until])
    mus = np.stack([Hs[ys == c].mean(0) if (ys == c).any() else np.zeros(H.shape[1])
                    for c in cls])
    X = Hs - mus[[cls.index(c) for c in ys]]
    S, t, d, e = X.T @ X, len(Hs), H.shape[1], learner.shrinkage_
    target = 1.0 if learner.shrinkage_estimator == "fixed" else np.trace(S) / (t * d)
    Lam = np.linalg.inv((1 - e) * S / t + e * target * np.eye(d))
    return softmax(Ht @ (mu @ Lam).T - 0.5 * np.einsum("kd,de,ke->k", mu, Lam, mu), axis=1)


def ridge_reference(learner, H, y, Ht):
    """Ridge regression on one-hot targets with the learner's lambda, through scikit-learn."""
    Y = np.stack([y == c for c in learner.classes_], 1).astype(np.float64)
    W = Ridge(alpha=learner.ridge_, fit_intercept=False, solver="cholesky").fit(H, Y).coef_
    return softmax(Ht @ W.T, axis=1)


def ncm_reference(learner, H, y, Ht):
    mu = np.stack([H[y == c].mean(0) for c in learner.classes_])
    d2 = ((Ht[:, None, :] - mu[None]) ** 2).sum(-1)
    return softmax(-d2 / learner.temperature, axis=1)


CASES = [  # (method, settings, reference, samples in the base set)
    ("ncm", {"temperature": 2.0}, ncm_reference, 0),
    ("slda", {"shrinkage": 0.05, "shrinkage_estimator": "fixed"}, lda_reference, 0),
    ("slda", {}, lda_reference, 0),  # oas
    ("slda", {"streaming_update": False}, lda_reference, 100),
    ("rp_lda", {"proj_dim": 80, "shrinkage": 0.05, "shrinkage_estimator": "fixed"},
     lda_reference, 0),
    ("rp_lda", {"proj_dim": 80}, lda_reference, 0),  # oas
    ("ranpac", {"proj_dim": 80, "ridge_estimator": "fixed", "ridge": 2.0}, ridge_reference, 0),
    ("ranpac", {"proj_dim": 80}, ridge_reference, 0),  # gcv
]

REFERENCE = {"ncm": ncm_reference, "slda": lda_reference, "rp_lda": lda_reference,
             "ranpac": ridge_reference}


def run_stream(method, settings, Z, y, base, seed, on_answer, n=700, batches=True):
    """Learn Z[:n] (a base set of ``base`` samples first), one sample or a small batch at a
    time, and call ``on_answer(learner, seen)`` at random moments."""
    rng = np.random.default_rng(seed)
    learner = make_learner(method, **settings)
    learner.block = BLOCK
    i = 0
    if base:
        learner.fit_base(Z[:base], y[:base])
        i = base
    while i < n:
        k = int(rng.integers(2, 40)) if batches and rng.random() < 0.1 else 1
        if k == 1:
            learner.learn_one(Z[i], y[i])
        else:
            learner.learn_many(Z[i:i + k], y[i:i + k])
        i += k
        if rng.random() < 0.25:
            on_answer(learner, i)
    return learner


@pytest.mark.parametrize("method, settings, reference, base", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_answers_equal_the_batch_solution_at_random_moments(digits, method, settings,
                                                            reference, base):
    Z, y = digits
    Zt = Z[-200:]
    checked, kept_answers = [], []

    def on_answer(learner, seen):
        P = learner.predict_proba(Zt)
        H, Ht = features(learner, Z[:seen]), features(learner, Zt)
        frozen = {"frozen_until": base} if settings.get("streaming_update") is False else {}
        np.testing.assert_allclose(P, reference(learner, H, y[:seen], Ht, **frozen),
                                   rtol=1e-6, atol=1e-8)
        checked.append(seen)
        kept = getattr(learner._answer, "kept", None)
        if kept is not None:
            kept_answers.append(len(kept.V))

    run_stream(method, settings, Z, y, base, 1, on_answer)
    assert len(checked) > 40
    if method != "ncm":  # answers came from corrections on a kept anchor, not only refits
        assert sum(p > 0 for p in kept_answers) > 20 or settings.get("streaming_update") is \
            False


class Factorizations:
    """Counts the factorizations of a matrix at least ``size`` wide (the learner's width):
    Cholesky, eigendecomposition, pseudo-inverse."""

    def __init__(self, monkeypatch, size):
        self.calls = []
        for name in ("cholesky_ex", "cholesky", "eigh", "pinv", "inv"):
            real = getattr(torch.linalg, name)

            def counted(A, *args, __real=real, __name=name, **kwargs):
                if A.shape[-1] >= size:
                    self.calls.append(__name)
                return __real(A, *args, **kwargs)

            monkeypatch.setattr(torch.linalg, name, counted)


@pytest.mark.parametrize("method, settings", [
    ("slda", {}), ("slda", {"shrinkage": 0.05, "shrinkage_estimator": "fixed"}),
    ("rp_lda", {"proj_dim": 96}), ("ranpac", {"proj_dim": 96}),
    ("ranpac", {"proj_dim": 96, "ridge_estimator": "fixed"})])
def test_a_prediction_after_a_learn_factorizes_nothing(digits, monkeypatch, method, settings):
    Z, y = digits
    learner = make_learner(method, **settings)
    learner.block = BLOCK
    learner.learn_many(Z[:300], y[:300])
    width = settings.get("proj_dim", Z.shape[1])
    count = Factorizations(monkeypatch, width)
    learner.predict_proba(Z[-50:])
    assert count.calls, "the first answer after a batch refits (the counter sees it)"
    count.calls.clear()
    for i in range(300, 300 + width // 4):  # every answer after one learn: a catch-up
        learner.learn_one(Z[i], y[i])  # commits (every BLOCK samples) included
        learner.predict_proba(Z[-50:])
    assert count.calls == []
    learner.learn_one(Z[400], y[400])
    learner.predict_proba(Z[-50:])  # the corrections would pass d / 4 rows: a refit
    assert count.calls


@pytest.mark.parametrize("method, settings", [
    ("ncm", {}), ("slda", {}), ("rp_lda", {"proj_dim": 96}), ("ranpac", {"proj_dim": 96})])
def test_a_learn_after_a_prediction_brings_the_answer_current(digits, monkeypatch, method,
                                                              settings):
    """When a prediction was asked since the last learn, the next learn brings the kept answer
    current before it returns and publishes it: the prediction after it reads that answer (no
    catch-up, no factorization) without the learner's lock. A learn that no prediction
    preceded catches up nothing and publishes nothing: a stream learned without answers pays
    what it paid, and its next prediction catches up under the lock."""
    Z, y = digits
    learner = make_learner(method, **settings)
    learner.block = BLOCK
    learner.learn_many(Z[:300], y[:300])
    assert learner.published() is None
    learner.predict_proba(Z[-50:])
    count = Factorizations(monkeypatch, settings.get("proj_dim", Z.shape[1]))
    for i in range(300, 340):  # a commit every BLOCK samples included
        before = learner._answer
        learner.learn_one(Z[i], y[i])
        assert learner._answer is not before  # caught up inside the learn
        assert learner.published()._answer is learner._answer
        calls = len(count.calls)
        answers = []
        with lock_of(learner):  # held by this thread: a reader that took it would wait
            reader = threading.Thread(target=lambda out=answers: out.append(
                learner.predict_proba(Z[-50:])))
            reader.start()
            reader.join(60)
            assert not reader.is_alive()
        assert len(count.calls) == calls and learner.published()._answer is learner._answer
        np.testing.assert_allclose(answers[0], REFERENCE[method](  # with its shrinkage
            learner, features(learner, Z[:i + 1]), y[:i + 1], features(learner, Z[-50:])),
            rtol=1e-6, atol=1e-8)
    learner.learn_one(Z[340], y[340])  # after a prediction: caught up
    kept = learner._answer
    for i in range(341, 345):  # no prediction since: nothing caught up, nothing published
        learner.learn_one(Z[i], y[i])
        assert learner._answer is kept and learner.published() is None
    P = learner.predict_proba(Z[-50:])
    assert learner._answer is not kept and learner.published()._answer is learner._answer
    np.testing.assert_array_equal(learner.predict_proba(Z[-50:]), P)


def test_ncm_catches_up_without_taking_every_waiting_row_again(digits, monkeypatch):
    """NCM merges only the rows since the last answer: the group of rows it forms at an
    answer after one learn has one row, however many wait in the buffer, until d / 4 = 16
    rows were merged: then the means are taken again from the statistics (all waiting rows)."""
    Z, y = digits
    learner = make_learner("ncm")
    learner.learn_many(Z[:200], y[:200])  # 200 rows waiting (block 256)
    learner.predict_proba(Z[:5])
    sizes = []
    real = learner._group

    def group(Zr, yr):
        sizes.append(len(yr))
        return real(Zr, yr)

    monkeypatch.setattr(learner, "_group", group)
    for i in range(200, 220):
        learner.learn_one(Z[i], y[i])
        learner.predict_proba(Z[:5])
    assert sizes == [1] * 16 + [217] + [1] * 3


@pytest.mark.parametrize("method, settings", [
    ("slda", {"shrinkage": 0.2, "shrinkage_estimator": "fixed"}),
    ("rp_lda", {"proj_dim": 64, "shrinkage": 0.2, "shrinkage_estimator": "fixed"})])
def test_held_shrinkage_stays_within_its_stated_bound(digits, method, settings):
    """Between refits the ridge rho of S + rho I is held: with a fixed eps the coefficient in
    use is e = eps t0 / (eps t0 + (1 - eps) t) >= eps t0 / t, t0 the samples at the refit, with
    t - t0 <= d / 4 and t <= 9/8 t0: eps max((t - d / 4) / t, 8 / 9) <= e <= eps."""
    Z, y = digits
    eps, seen = 0.2, []

    def on_answer(learner, t):
        e = learner.shrinkage_
        d = features(learner, Z[:1]).shape[1]
        low = eps * max((t - anytime.pmax_for(d)) / t, 1 / anytime.GROWTH)
        assert low - 1e-12 <= e <= eps + 1e-12
        # corrections since the refit: at most d / 4 (RP-LDA's dual refit starts with the
        # rows that wait, fewer than a block)
        assert len(learner._answer.kept.V) <= max(anytime.pmax_for(d), BLOCK)
        seen.append(e)

    run_stream(method, settings, Z, y, 0, 2, on_answer, n=900, batches=False)
    assert min(seen) < eps * (1 - 1e-4)  # the bound was exercised: a held ridge moved e
    assert seen.count(eps) + sum(abs(e - eps) < 1e-12 for e in seen) > 0  # and refits


@pytest.mark.parametrize("method, settings", [("slda", {}), ("rp_lda", {"proj_dim": 64}),
                                              ("ranpac", {"proj_dim": 64}), ("ncm", {})])
def test_a_failed_learn_after_answers_leaves_state_and_answers(digits, method, settings):
    """A learn that raises inside its update, after answers were kept and a commit rotated the
    buffer, leaves the state bit for bit as a twin's that never failed, and the answer as it
    was before the call (the published one: all or nothing covers the answer too); a learner
    loaded from that state answers as one loaded from the twin's (a refit on the same state).
    (A kept answer caught up with the shrinkage held since its last refit: it may differ from
    a refit's within the held shrinkage's bound, see docs/anytime.md.)"""
    Z, y = digits
    Zt = Z[-100:]

    def build():
        learner = make_learner(method, **settings)
        learner.block = BLOCK
        for i in range(100):
            learner.learn_one(Z[i], y[i])
            if i % 7 == 0:
                learner.predict_proba(Zt)
        return learner

    learner, twin = build(), build()
    before = digest(learner.state_dict())
    answer = learner.predict_proba(Zt)
    commit = type(learner)._commit

    def failing(self, *args):
        commit(self, *args)
        raise RuntimeError("injected")

    learner._commit = failing.__get__(learner)
    with pytest.raises(RuntimeError, match="injected"):
        learner.learn_many(Z[100:150], y[100:150])  # commits a block, then fails
    del learner._commit
    assert digest(learner.state_dict()) == before
    np.testing.assert_array_equal(learner.predict_proba(Zt), answer)
    fresh = twin.clone().load_state_dict(twin.state_dict())
    loaded = learner.clone().load_state_dict(learner.state_dict())
    np.testing.assert_allclose(loaded.predict_proba(Zt), fresh.predict_proba(Zt),
                               rtol=1e-9, atol=1e-12)
    for z in (learner, twin):
        for i in range(100, 140):
            z.learn_one(Z[i], y[i])
            z.predict_proba(Zt)
    assert digest(learner.state_dict()) == digest(twin.state_dict())
    for z in (learner, twin):  # each the batch solution with the shrinkage it reports
        np.testing.assert_allclose(z.predict_proba(Zt), REFERENCE[method](
            z, features(z, Z[:140]), y[:140], features(z, Zt)), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("method, settings", [("slda", {}), ("rp_lda", {"proj_dim": 64}),
                                              ("ranpac", {"proj_dim": 64})])
def test_save_load_after_kept_answers(digits, method, settings):
    """The kept answer is not part of the state: a learner that answered many times saves the
    same state as one that never answered; a loaded copy answers as the silent twin (both
    refit on the same state), and then continues with the same state as the original, each
    answering the batch solution with the shrinkage or ridge it reports."""
    Z, y = digits
    Zt = Z[-100:]
    asked = make_learner(method, **settings)
    silent = make_learner(method, **settings)
    for i in range(300):
        for z in (asked, silent):
            z.learn_one(Z[i], y[i])
        if i % 3 == 0:
            asked.predict_proba(Zt)
    assert digest(asked.state_dict()) == digest(silent.state_dict())
    loaded = asked.clone().load_state_dict(asked.state_dict())
    assert loaded.get_params() == asked.get_params()
    np.testing.assert_allclose(loaded.predict_proba(Zt), silent.predict_proba(Zt),
                               rtol=1e-9, atol=1e-12)
    asked.predict_proba(Zt)
    for i in range(300, 340):
        for z in (asked, loaded):
            z.learn_one(Z[i], y[i])
            z.predict_proba(Zt)
    assert digest(asked.state_dict()) == digest(loaded.state_dict())
    for z in (asked, loaded):
        np.testing.assert_allclose(z.predict_proba(Zt), REFERENCE[method](
            z, features(z, Z[:340]), y[:340], features(z, Zt)), rtol=1e-6, atol=1e-8)


def test_kept_caught_up_equals_a_direct_solve():
    """The kernel alone: corrections on a Cholesky anchor, with right-hand sides that change
    through X^T E and explicitly, and new rows of R, equal (A0 + X^T X)^-1 R^T."""
    g = torch.Generator().manual_seed(0)
    d, K = 30, 4
    B = torch.randn(60, d, generator=g, dtype=torch.float64)
    A0 = B.T @ B + 0.5 * torch.eye(d, dtype=torch.float64)
    R = torch.randn(K, d, generator=g, dtype=torch.float64)
    kept = anytime.Kept.cholesky(A0.clone(), R, pmax=12)
    A = A0.clone()
    for m in (1, 3, 2, 4):
        X = torch.randn(m, d, generator=g, dtype=torch.float64)
        E = torch.randn(m, 2, generator=g, dtype=torch.float64)
        extra = torch.randn(1, d, generator=g, dtype=torch.float64)
        cols = torch.tensor([1, K])  # a known class and a new one
        R = torch.cat([R, torch.zeros(1, d, dtype=torch.float64)])
        R[cols] += (X.T @ E).T
        R[cols[1:]] += extra
        kept = kept.caught_up(X, R.clone(), cols, E, extra, torch.tensor([1]))
        A += X.T @ X
        K += 1
        torch.testing.assert_close(kept.W, torch.linalg.solve(A, R.T).T, rtol=1e-10,
                                   atol=1e-12)
    assert len(kept.V) == 10
    assert kept.caught_up(torch.zeros(3, d, dtype=torch.float64), R, torch.tensor([0]), None,
                          None, None) is None  # 13 > pmax corrections: the caller refits
