"""Issue 34: a new class costs the same whatever was learned, and NCM / SLDA learn in exact
blocks. Work is counted (copies of the state, elements cloned), never timed."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ciosl.conformance import class_stream, fitted
from ciosl.learners import available_methods, bayes_head, finetune, make_learner, rplda
from ciosl.learners import slda as slda_module
from ciosl.learners.anytime import pmax_for
from ciosl.learners.base import Learner, digest
from ciosl.learners.ncm import NCM
from ciosl.learners.rplda import RPLDA
from ciosl.learners.slda import SLDA


@pytest.fixture
def counted(monkeypatch):
    """Counts of deepcopy calls, state_dict calls and tensor elements cloned."""
    n = {"deepcopy": 0, "state_dict": 0, "cloned": 0}
    deepcopy, state_dict, clone = copy.deepcopy, Learner.state_dict, torch.Tensor.clone

    def counting_deepcopy(*a, **k):
        n["deepcopy"] += 1
        return deepcopy(*a, **k)

    def counting_state_dict(self, *a, **k):
        n["state_dict"] += 1
        return state_dict(self, *a, **k)

    def counting_clone(self, *a, **k):
        n["cloned"] += self.numel()
        return clone(self, *a, **k)

    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    monkeypatch.setattr(Learner, "state_dict", counting_state_dict)
    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)

    def reset() -> dict:
        out = dict(n)
        n.update(deepcopy=0, state_dict=0, cloned=0)
        return out

    return reset


@pytest.mark.parametrize("method", sorted(available_methods()))
def test_a_new_class_copies_no_state(method, counted):
    """learn_one with a new label, and learn_many, never copy the whole state (no deepcopy,
    no state_dict) for any learner: the rollback is the learner's own undo record."""
    cls = available_methods()[method]
    assert cls._has_undo(), f"{method}: every built-in learner keeps an undo record"
    learner = fitted(cls, {})
    Z = np.random.default_rng(0).normal(size=(3, learner.dim_)).astype(np.float32)
    counted()
    learner.learn_one(Z[0], 999)
    learner.learn_many(Z[1:], [999, 1000])
    n = counted()
    assert n["deepcopy"] == 0 and n["state_dict"] == 0, n


def _grown(method: str, n_classes: int, **settings) -> Learner:
    rng = np.random.default_rng(1)
    learner = make_learner(method, **settings)
    Z = rng.normal(size=(n_classes, 8)).astype(np.float32)
    learner.fit_base(Z[:2], [0, 1])
    for k in range(2, n_classes):
        learner.learn_one(Z[k], k)
    return learner


@pytest.mark.parametrize("method", ["ncm", "slda", "rp_lda", "ranpac"])
def test_new_class_cost_does_not_grow_with_classes(method, counted):
    """A new class clones nothing in NCM, SLDA, RP-LDA and RanPAC (RP-LDA's statistics), with
    20 classes or 600: its rollback is a truncation (arrays grown by capacity doubling)."""
    settings = {"proj_dim": 16} if method in ("rp_lda", "ranpac") else {}
    z = np.ones(8, np.float32)
    for K in (20, 600):
        learner = _grown(method, K, **settings)
        if learner.n_pending in (0, learner.block - 1):  # keep the block from filling
            learner.learn_one(z, 0)
        counted()
        learner.learn_one(z, K + 5)
        n = counted()
        assert n == {"deepcopy": 0, "state_dict": 0, "cloned": 0}, (K, n)


@pytest.mark.parametrize("method", ["tinyer", "ciosl", "agem", "gdumb"])
def test_new_class_record_does_not_copy_the_memory(method, counted):
    """The undo record of a memory-based learner may copy its head (CIOSL's flat vectors;
    the MLP heads write theirs out of place instead), never its replay memory: the elements
    cloned for a new class are the same with a memory of 20 samples or of 400."""
    cloned = []
    for buffer in (20, 400):
        learner = _grown(method, 6, buffer=buffer)
        Z = np.random.default_rng(2).normal(size=(500, 8)).astype(np.float32)
        learner.learn_many(Z, np.arange(500) % 6)  # fills the larger memory
        assert learner.memory_size() == min(buffer, 506)
        counted()
        learner.learn_one(Z[0], 77)
        cloned.append(counted()["cloned"])
    assert cloned[0] == cloned[1], cloned


# ---------------------------------------------------------------------------- exact blocks
def _reference(Z: np.ndarray, y: np.ndarray, K: int):
    """Sample-by-sample Welford means, counts and pooled scatter (float64)."""
    d = Z.shape[1]
    mu, n, S = np.zeros((K, d)), np.zeros(K), np.zeros((d, d))
    for z, k in zip(Z.astype(np.float64), y, strict=True):
        diff = z - mu[k]
        S += n[k] / (n[k] + 1) * np.outer(diff, diff)
        mu[k] += diff / (n[k] + 1)
        n[k] += 1
    return mu, n, S


def _lda_proba(Zt, mu, S, t, eps):
    A = (1 - eps) * S / max(t, 1) + eps * np.eye(len(S))
    W = mu @ np.linalg.pinv(A, hermitian=True)
    s = Zt.astype(np.float64) @ W.T - 0.5 * (W * mu).sum(1)
    s -= s.max(1, keepdims=True)
    return np.exp(s) / np.exp(s).sum(1, keepdims=True)


class SmallBlockSLDA(SLDA):
    name = ""  # not registered
    block = 7


class SmallBlockNCM(NCM):
    name = ""
    block = 5


def test_slda_and_ncm_blocks_equal_the_sample_by_sample_rule_at_every_moment():
    rng = np.random.default_rng(3)
    K, d = 4, 6
    centres = rng.normal(0, 4, (K, d))
    y = rng.integers(0, K, 60)
    Z = (centres[y] + rng.normal(size=(60, d))).astype(np.float32)
    Zt = rng.normal(0, 4, (10, d)).astype(np.float32)
    slda, ncm = SmallBlockSLDA(shrinkage_estimator="fixed"), SmallBlockNCM()
    for i in range(len(y)):
        slda.learn_one(Z[i], int(y[i]))
        ncm.learn_one(Z[i], int(y[i]))
        seen = sorted(set(y[:i + 1].tolist()), key=y[:i + 1].tolist().index)  # classes_ order
        mu, n, S = _reference(Z[:i + 1], y[:i + 1], K)
        mu = mu[seen]
        np.testing.assert_allclose(slda.mu.numpy(), mu, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(ncm.mu.numpy(), mu, rtol=1e-10, atol=1e-10)
        assert slda.counts.tolist() == n[seen].astype(int).tolist()
        np.testing.assert_allclose(slda.scatter.numpy(), S, rtol=1e-9, atol=1e-9)
        # the exact LDA rule with the shrinkage in use: eps = 1e-4 as chosen at the last
        # refit, the ridge held since (docs/anytime.md: at most d / 4 = 8 samples ago here)
        P = slda.predict_proba(Zt)
        e, t = slda.shrinkage_, i + 1
        assert 1e-4 * (t - pmax_for(d)) / t - 1e-15 <= e <= 1e-4 + 1e-15
        np.testing.assert_allclose(P, _lda_proba(Zt, mu, S, t, e), rtol=1e-6, atol=1e-9)
        logits = 2 * Zt.astype(np.float64) @ mu.T - (mu ** 2).sum(1)
        P = np.exp(logits - logits.max(1, keepdims=True))
        np.testing.assert_allclose(ncm.predict_proba(Zt), P / P.sum(1, keepdims=True),
                                   rtol=1e-6, atol=1e-9)
    assert slda.n_cov == 56 and slda.n_pending == 4  # eight blocks committed, four waiting


@pytest.mark.parametrize("cls", [SmallBlockSLDA, SmallBlockNCM, SLDA, NCM])
def test_save_and_load_in_the_middle_of_a_block(cls, tmp_path):
    """A learner saved with rows waiting answers and continues bit for bit."""
    Zb, yb, Zs, ys = class_stream()
    learner = cls().fit_base(Zb, yb.tolist())
    for z, k in zip(Zs[:13], ys[:13], strict=True):
        learner.learn_one(z, int(k))
    assert 0 < learner.n_pending < learner.block
    twin = cls().load_state_dict(learner.state_dict())
    np.testing.assert_array_equal(twin.predict_proba(Zs), learner.predict_proba(Zs))
    for a in (learner, twin):
        for z, k in zip(Zs[13:], ys[13:], strict=True):
            a.learn_one(z, int(k))
    assert digest(twin.state_dict()) == digest(learner.state_dict())
    np.testing.assert_array_equal(twin.predict_proba(Zs), learner.predict_proba(Zs))


def test_blocked_slda_matches_sklearn_lda():
    """Many committed blocks (block 7) and rows waiting: the same as scikit-learn's LDA."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    rng = np.random.default_rng(4)
    K, d, n = 3, 5, 201  # balanced: sklearn's prior-weighted covariance is then the pooled one
    y = rng.permutation(np.repeat(np.arange(K), n // K))
    Z = (rng.normal(0, 3, (K, d))[y] + rng.normal(size=(n, d))).astype(np.float32)
    learner = SmallBlockSLDA(shrinkage=0.0, shrinkage_estimator="fixed")
    learner.fit_base(Z[:30], y[:30].tolist())
    for z, k in zip(Z[30:], y[30:], strict=True):
        learner.learn_one(z, int(k))
    assert learner.n_pending  # some rows still wait
    lda = LinearDiscriminantAnalysis(solver="lsqr", priors=np.ones(K) / K).fit(Z, y)
    order = np.argsort(learner.classes_)
    np.testing.assert_allclose(learner.mu.numpy()[order], lda.means_, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(learner.covariance.numpy(), lda.covariance_, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(learner.predict_proba(Z)[:, order], lda.predict_proba(Z),
                               rtol=1e-4, atol=1e-6)


def test_old_saved_ncm_and_slda_states_still_load():
    """States written before blocks (no waiting rows) load and answer as before."""
    rng = np.random.default_rng(5)
    Z = rng.normal(size=(20, 4)).astype(np.float32)
    y = [0, 1] * 10
    for method in ("ncm", "slda"):
        learner = make_learner(method)
        learner.fit_base(Z, y)
        assert learner.n_pending == (20 if method == "ncm" else 0)  # SLDA commits a base set
        sd = learner.state_dict()  # as written before blocks: every sample in the statistics
        for key in ("pending_z", "pending_y"):
            del sd["state"][key]
        sd["state"]["mu"], sd["state"]["counts"] = learner.mu.clone(), learner.counts.clone()
        if method == "slda":
            sd["state"]["scatter"], sd["state"]["n_cov"] = learner.scatter.clone(), 20
        old = make_learner(method).load_state_dict(sd)
        np.testing.assert_array_equal(old.predict_proba(Z), learner.predict_proba(Z))


def test_evaluation_predicts_in_bounded_chunks(monkeypatch):
    """The run loop's checked_predict asks for at most PREDICT_CELLS probabilities at once
    (many classes times many test rows would not fit), with the same answers."""
    import ciosl.conformance as conformance

    Zb, yb, Zs, ys = class_stream()
    learner = NCM().fit_base(Zb, yb.tolist())
    whole = conformance.checked_predict(learner, Zs)
    calls = []
    predict_proba = learner.predict_proba
    monkeypatch.setattr(learner, "predict_proba", lambda Z: calls.append(len(Z)) or
                        predict_proba(Z))
    monkeypatch.setattr(conformance, "PREDICT_CELLS", 7 * len(learner.classes_))
    np.testing.assert_array_equal(conformance.checked_predict(learner, Zs), whole)
    assert calls == [7] * (len(Zs) // 7) + ([len(Zs) % 7] if len(Zs) % 7 else [])


def _new_class_over_known(learner: Learner, K: int, mode: type) -> tuple[int, int]:
    """What ``mode`` (``_Written`` or ``_Fresh``) counts for a learn_one of a new class beyond
    one of a known class, at the same moment, on a learner of K classes (a doubling, if one is
    due, happens first), and the output layer's elements after it."""
    z = np.ones(8, np.float32)
    learner.learn_one(z, K)
    counted = {}
    for kind, y in (("known", 3), ("new", K + 1)):
        with mode() as m:
            learner.learn_one(z, y)
        counted[kind] = m.n
    assert learner.net.params[-2].shape[0] == K + 2
    return counted["new"] - counted["known"], (K + 2) * (learner.net.params[-2].shape[1] + 1)


@pytest.mark.parametrize("method", ["finetune", "tinyer", "agem", "remind", "exstream"])
def test_mlp_new_class_extra_work_is_its_output_layer(method):
    """A new class grows the MLP head's output layer and its momentum by one concatenation each
    (the state rule: new tensors, never a write into the published ones): the elements a new
    class's learn_one writes beyond a known class's, at the same moment, are at most 4 times the
    output layer's elements (weights, bias; their momentum) at 20 classes and at 600 -- nothing
    of the hidden layers (8 x 256 + 256 x 256 elements, more than 4 output layers of 20
    classes) -- and grow with the classes (it is the output layer's arithmetic)."""
    settings = {"agem": {"n_replay": 0}}.get(method, {})  # no projection: the same step
    extra = []
    for K in (20, 600):
        more, layer = _new_class_over_known(_grown(method, K, base_epochs=1, **settings), K,
                                            _Written)
        extra.append(more)
        assert layer <= more <= 4 * layer, (K, extra, layer)
    assert extra[1] > extra[0]


def test_rng_snapshot_is_skipped_only_for_learners_that_draw_nothing():
    """NCM, SLDA and RP-LDA draw no random number: their calls keep no generator snapshot.
    A subclass that overrides a step may draw: its generators are saved and restored."""
    assert not NCM._draws_random() and not SLDA._draws_random()
    assert available_methods()["finetune"]._draws_random()

    class Drawing(SLDA):
        def _learn_one(self, z, yi):
            self.rng.random()  # draws, then fails after the draw
            if yi >= 2:
                raise RuntimeError("injected")
            super()._learn_one(z, yi)

    assert Drawing._draws_random()
    learner = Drawing()
    Z = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    learner.fit_base(Z[:2], [0, 1])
    before = learner.rng.bit_generator.state
    with pytest.raises(RuntimeError, match="injected"):
        learner.learn_one(Z[2], 5)
    assert learner.rng.bit_generator.state == before


class SmallBlockRPLDA(RPLDA):
    name = ""
    block = 6


@pytest.mark.parametrize("cls, fail", [
    (SmallBlockNCM, "fold"), (SmallBlockSLDA, "gram"), (SmallBlockSLDA, "fold"),
    (SmallBlockRPLDA, "gram")])
@pytest.mark.parametrize("first", [True, False])
def test_a_known_class_sample_whose_block_commit_fails_leaves_the_learner_as_before(
        cls, fail, first, monkeypatch):
    """A known-class ``learn_one`` keeps no undo record (that would be a copy per sample); the
    commit of a full block it triggers computes and allocates everything before it moves a
    statistic. A failure there (injected where the commit allocates its last temporaries or
    adds the block's rows) leaves the learner bit for bit as before, and it learns on as a twin
    that never failed. ``first``: the failing commit is the learner's first (RP-LDA fixes its
    shift there) or a later one."""
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(40, 5)).astype(np.float32)
    y = np.arange(40) % 3
    learner, twin = cls(proj_dim=16) if cls is SmallBlockRPLDA else cls(), None
    twin = copy.deepcopy(learner)
    start = cls.block - 1 if first else 3 * cls.block - 1  # a full block after one more sample
    for a in (learner, twin):
        for i in range(start):
            a.learn_one(Z[i], int(y[i]))
    assert learner.n_pending == cls.block - 1 and int(y[start]) in learner.classes_
    before = digest(learner.state_dict())

    def boom(*args, **kwargs):
        raise MemoryError("injected")
    if fail == "fold":
        monkeypatch.setattr(learner, "_fold", boom)
    else:
        monkeypatch.setattr(rplda, "add_gram_", boom)
        monkeypatch.setattr(slda_module, "add_gram_", boom)
    with pytest.raises(MemoryError, match="injected"):
        learner.learn_one(Z[start], int(y[start]))
    monkeypatch.undo()
    assert digest(learner.state_dict()) == before
    for i in range(start, len(y)):
        learner.learn_one(Z[i], int(y[i]))
        twin.learn_one(Z[i], int(y[i]))
    assert digest(learner.state_dict()) == digest(twin.state_dict())
    np.testing.assert_array_equal(learner.predict_proba(Z), twin.predict_proba(Z))


class _Written(TorchDispatchMode):
    """Elements written by every tensor operation run under it (views write nothing)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.n += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


def _twelve_classes(method: str, settings: dict, Z: np.ndarray) -> Learner:
    """A learner after a base init on 2 classes (rows 0-15 of Z) and 10 more, one sample each."""
    learner = make_learner(method, base_epochs=1, **settings)
    learner.fit_base(Z[:16], [0, 1] * 8)
    for k in range(2, 12):
        learner.learn_one(Z[16 + k], k)
    return learner


def _new_class_extra(learner: Learner, z: np.ndarray) -> int:
    """Elements a learn_one of a new class (12, then 13) writes beyond one of a known class (3,
    then 4) at the same moment; the second of each is measured (the first warms up)."""
    written = {}
    for kind, y in (("known", 3), ("new", 12), ("known", 4), ("new", 13)):
        with _Written() as w:
            learner.learn_one(z, y)
        written[kind] = w.n
    return written["new"] - written["known"]


@pytest.mark.parametrize("method", ["tinyer", "remind"])
def test_new_class_extra_work_does_not_grow_with_the_hidden_layers(method, monkeypatch):
    """The elements a new class's learn_one writes (clones, copies, allocations, the step)
    beyond those of a known class's, at the same moment, are the same whether the first hidden
    layer has 32 units or 256: the undo record of a new class makes no pass over the hidden
    layers or their momentum (a step replaces them by new tensors). The last
    hidden layer (the width of a new output row) and the replay batch stay the same."""
    settings = {"tinyer": {"buffer": 8, "n_replay": 4},
                "remind": {"buffer": 8, "n_replay": 4, "pq_subvectors": 4, "pq_nbits": 3}}
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(64, 8)).astype(np.float32)
    extra = []
    for width in (32, 256):
        monkeypatch.setattr(finetune, "HIDDEN", (width, 16))
        learner = _twelve_classes(method, settings[method], Z)  # the memory (8 items) is full
        assert learner.net.params[0].shape[0] == width
        extra.append(_new_class_extra(learner, Z[40]))
    assert extra[0] == extra[1], extra


@pytest.mark.parametrize("method", ["ciosl", "vcl"])
def test_bayesian_head_new_class_extra_work_is_six_passes_over_the_flat_vectors(method,
                                                                                monkeypatch):
    """The elements a new class's learn_one writes beyond a known class's, at the same moment,
    are six concatenations of the (P,) flat vectors (the means, the Fisher EMA, the prior's
    means and precisions, pi_0 and the momentum: new tensors, the state rule) plus work that
    does not depend on the hidden layers. Checked with a first hidden layer of 32 units and of
    256 (P grows ~6x); the last hidden layer (the width of a new output row) and the replay
    batch stay the same."""
    settings = {"ciosl": {"buffer": 8, "n_replay": 4, "n_distill": 4}, "vcl": {}}
    rng = np.random.default_rng(3)
    Z = rng.normal(size=(64, 8)).astype(np.float32)
    extra, sizes = [], []
    for width in (32, 256):
        monkeypatch.setattr(bayes_head, "HIDDEN", (width, 16))
        learner = _twelve_classes(method, settings[method], Z)
        assert learner.net.shapes[0] == (width, 8)
        sizes.append(learner.net.P)
        extra.append(_new_class_extra(learner, Z[40]) - 6 * learner.net.P)
    assert extra[0] == extra[1], extra
    assert 0 < extra[0] < sizes[0], (extra, sizes)  # no seventh pass over the smaller network


class _Fresh(TorchDispatchMode):
    """Elements of the tensors freshly allocated by every operation run under it: results that
    share no storage with an input (views, in-place and ``out=`` results are not fresh)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        self.n += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)
                      and t.untyped_storage().data_ptr() not in inputs)
        return out


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_ewc_new_class_allocates_its_output_layer_only(method):
    """A new class re-anchors EWC and MAS (theta* := theta, Omega := Omega_run) by reference:
    the elements of fresh tensors a new class's learn_one allocates beyond those of a known
    class's that also re-anchors (``refresh_every=1``), at the same moment, are at most 4 times
    the output layer (the grown layer, its momentum, the running importance and the curvature
    get one row each: a concatenation of the layer), at 20 classes and at 600 -- no clone of
    the hidden layers' anchor or importance (8 x 256 + 256 x 256 elements)."""
    for K in (20, 600):
        more, layer = _new_class_over_known(_grown(method, K, base_epochs=1, refresh_every=1),
                                            K, _Fresh)
        assert layer <= more <= 4 * layer, (K, more, layer)


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_ewc_step_at_the_anchor_computes_no_penalty(method):
    """The first step after a refresh is at the anchor (theta = theta*): its penalty gradient
    c (theta - theta*) is 0 and is not computed -- the step allocates two tensors of each
    parameter's size fewer (theta - theta* and the penalised gradient) than the next one, and
    its refresh one more (the new curvature; the anchor and the frozen importance are
    references)."""
    learner = _grown(method, 30, base_epochs=1, refresh_every=2)
    z = np.ones(8, np.float32)
    fresh = {True: [], False: []}
    for _ in range(4):  # refresh_every=2: every other step re-anchors first
        due = learner._since_refresh >= learner.refresh_every
        with _Fresh() as f:
            learner.learn_one(z, 3)
        fresh[due].append(f.n)
    P = sum(p.numel() for p in learner.net.params)
    assert len(set(fresh[True])) == len(set(fresh[False])) == 1 and len(fresh[True]) == 2, fresh
    assert fresh[False][0] - fresh[True][0] == 2 * P - P, (fresh, P)


@pytest.mark.parametrize("method", ["ewc", "mas"])
def test_ewc_refresh_copies_neither_the_parameters_nor_the_importance(method):
    """A refresh anchors by reference: theta* is the parameters' tensors and the frozen
    importance the running importance's (no step writes either in place), and only the
    curvature is computed: the refresh allocates exactly one tensor of the model's size. The
    next step replaces the parameters and the running importance, leaving the anchor and the
    frozen importance as they were."""
    learner = _grown(method, 12, base_epochs=1)
    with _Fresh() as f:
        learner._refresh()
    P = sum(p.numel() for p in learner.net.params)
    assert f.n == P
    assert all(a.data_ptr() == p.data_ptr() for a, p in zip(learner.anchor, learner.net.params,
                                                               strict=True))
    assert all(f is o for f, o in zip(learner.omega_frozen, learner.omega, strict=True))
    W0, omega0 = learner.net.params[-2].detach().clone(), learner.omega[-2].clone()
    learner.learn_one(np.ones(8, np.float32), 3)
    assert torch.equal(learner.anchor[-2], W0) and torch.equal(learner.omega_frozen[-2], omega0)
    assert not torch.equal(learner.net.params[-2], learner.anchor[-2])  # the step moved it


@pytest.mark.parametrize("method", ["ewc", "mas", "ciosl"])
def test_rollback_puts_the_same_tensors_back(method):
    """After a rolled-back new-class call, the head's parameters, its momentum (and EWC's
    stores) are the very tensors they were before the call: rollback is putting references
    back, with no copy."""
    from ciosl.conformance import InjectedFailure, failing_after

    learner = _grown(method, 6, base_epochs=1)
    z = np.ones(8, np.float32)
    net = learner.net
    tensors = lambda: [*(net.params if hasattr(net, "params") else [net.mu]),  # noqa: E731
                       *(b for b in learner.opt.buffers if b is not None),
                       *getattr(learner, "omega", []), *getattr(learner, "anchor", [])]
    before = tensors()
    with failing_after(learner, "_learn_one"), pytest.raises(InjectedFailure):
        learner.learn_one(z, 6)
    after = tensors()
    assert len(after) == len(before) and all(a is b for a, b in zip(after, before, strict=True))
