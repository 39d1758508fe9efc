"""The streaming / online / batch regimes: what reaches the learner, in which order, and the
mini-batch updates of the methods that have one."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ciosl.data.orderings import make_ordering
from ciosl.data.types import FeatureSet
from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from ciosl.evaluation.protocol import Regime, _chunks, run_stream
from ciosl.learners import available_methods, make_learner


@pytest.fixture
def fs():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(6, 8)) * 5
    y = np.repeat(np.arange(6), 30)
    ty = np.repeat(np.arange(6), 5)
    z = (centers[y] + rng.normal(size=(len(y), 8))).astype(np.float32)
    tz = (centers[ty] + rng.normal(size=(len(ty), 8))).astype(np.float32)
    return FeatureSet("blobs", "none", z, y, tz, ty, tuple("abcdef"), key="blobs-regimes")


def ordering_of(fs, kind="class_iid"):
    return make_ordering(kind, fs.train_y, seed=3, base_fraction=0.1, classes_per_step=2)


class Spy:
    """Wraps a learner; records the stream indices (through the features) of every call."""

    def __init__(self, learner, fs):
        self.inner, self.calls, self.tested_at = learner, [], []
        self._row = {fs.train_z[i].tobytes(): i for i in range(len(fs.train_z))}

    def learn_one(self, z, y):
        self.calls.append(("one", [self._row[np.asarray(z, np.float32).tobytes()]]))
        self.inner.learn_one(z, y)

    def learn_many(self, Z, y):
        self.calls.append(("many", [self._row[np.asarray(z, np.float32).tobytes()] for z in Z]))
        self.inner.learn_many(Z, y)

    def predict(self, Z):
        self.tested_at.append(sum(len(c[1]) for c in self.calls))
        return self.inner.predict(Z)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_chunks_never_straddle_events():
    events, n = [0, 7, 20, 33], 33
    online = _chunks(Regime("online", batch_size=4), events, n, 0)
    assert online == [4, 7, 11, 15, 19, 20, 24, 28, 32, 33]
    assert _chunks(Regime("batch"), events, n, 0) == [7, 20, 33]
    assert _chunks(Regime(), events, n, 5) == [5, 7, 10, 15, 20, 25, 30, 33]
    with pytest.raises(ValueError, match="valid choices: streaming, online, batch"):
        Regime("offline")
    with pytest.raises(ValueError, match=">= 1"):
        Regime("online", batch_size=0)


def test_streaming_and_online_feed_the_stream_once_in_order(fs):
    o = ordering_of(fs)
    spy = Spy(make_learner("ncm"), fs)
    run_stream(spy, fs, o)
    assert all(kind == "one" for kind, _ in spy.calls)
    assert [i for _, idx in spy.calls for i in idx] == list(o.stream)

    spy = Spy(make_learner("ncm"), fs)
    run_stream(spy, fs, o, regime=Regime("online", batch_size=4))
    assert all(kind == "many" and 1 <= len(idx) <= 4 for kind, idx in spy.calls)
    assert [i for _, idx in spy.calls for i in idx] == list(o.stream)
    # the learner is tested exactly at the events, as in the streaming regime
    assert spy.tested_at == [int(e) for e in o.events]


def test_batch_regime_visits_each_task_for_its_epochs(fs):
    o = ordering_of(fs)
    spy = Spy(make_learner("tinyer"), fs)
    res = run_stream(spy, fs, o, regime=Regime("batch", batch_size=5, epochs=3))
    seen = [i for _, idx in spy.calls for i in idx]
    assert len(seen) == 3 * len(o.stream)
    events = [int(e) for e in o.events]
    pos = 0
    for lo, hi in zip(events, events[1:], strict=False):
        task = list(o.stream[lo:hi])
        visit = seen[pos:pos + 3 * len(task)]
        pos += 3 * len(task)
        for e in range(3):  # each epoch is a permutation of the task
            assert sorted(visit[e * len(task):(e + 1) * len(task)]) == sorted(task)
        assert visit[:len(task)] != task or len(task) < 3  # shuffled
    assert len(res["accuracy"]) == len(events)


SMALL = {"buffer": 40, "pq_subvectors": 4, "pq_nbits": 4}


@pytest.mark.parametrize("method", sorted(available_methods()))
def test_a_batch_of_one_is_a_streaming_step(method, fs):
    """learn_many of one sample == learn_one, for every method (whether it has a mini-batch
    update or not): the batch update generalizes the streaming one."""
    cls = available_methods()[method]
    known = {s.name for s in cls.settings()}
    settings = {k: v for k, v in SMALL.items() if k in known}
    a, b = cls(**settings), cls(**settings)
    o = ordering_of(fs)
    for learner in (a, b):
        learner.fit_base(fs.train_z[o.base], fs.train_y[o.base])
    for i in o.stream[:60]:
        a.learn_one(fs.train_z[i], fs.train_y[i])
        b.learn_many(fs.train_z[i:i + 1], fs.train_y[i:i + 1])
    np.testing.assert_array_equal(a.predict_proba(fs.test_z), b.predict_proba(fs.test_z))
    assert a.classes_ == b.classes_ and a.n_seen_ == b.n_seen_


def test_mini_batch_updates_exist_where_the_regime_comparison_needs_them():
    methods = available_methods()
    for name in ("finetune", "tinyer", "exstream", "remind", "agem", "ciosl", "vcl",
                 "vcl_coreset", "coreset_only", "ncm", "slda", "rp_lda"):  # (closed forms:
        assert methods[name]._has_batch_update(), name  # exact blocks)
    for name in ("ewc", "mas"):  # sample by sample (per-sample importance, own _learn_one)
        assert not methods[name]._has_batch_update(), name


def test_finetune_mini_batch_step_is_sgd_on_the_batch_mean(fs):
    learner = make_learner("finetune", momentum=0.0, weight_decay=0.0, lr=0.1,
                           max_grad_norm=float("inf"))  # plain SGD
    learner.fit_base(fs.train_z[:30], fs.train_y[:30])  # class 0 only
    Z, y = fs.train_z[25:35], fs.train_y[25:35]  # classes 0 and 1 (a new one)
    learner._encode_new([1])  # the new output unit, to copy the parameters with it
    before = [p.detach().clone().requires_grad_(True) for p in learner.net.params]
    learner.learn_many(Z, y)
    h = torch.from_numpy(Z)
    for W_k, b_k in zip(before[:-2:2], before[1:-2:2], strict=True):  # hidden ReLU layers
        h = torch.relu(h @ W_k.T + b_k)
    W, bias = before[-2], before[-1]
    loss = F.cross_entropy(h @ W.T + bias, torch.from_numpy(y))
    grads = torch.autograd.grad(loss, before)
    for p, p0, g in zip(learner.net.params, before, grads, strict=True):
        torch.testing.assert_close(p.detach(), p0.detach() - 0.1 * g, rtol=1e-5, atol=1e-6)


def test_online_run_resumes_identically_and_is_recorded(fs, tmp_path):
    o = ordering_of(fs)
    reg = Regime("online", batch_size=7)
    full = run_stream(make_learner("tinyer", buffer=30), fs, o, regime=reg)
    states = []
    run_stream(make_learner("tinyer", buffer=30), fs, o, regime=reg, checkpoint_every=25,
               on_checkpoint=lambda s: states.append(copy.deepcopy(s)))
    mid = states[len(states) // 2]
    assert 0 < mid["position"] < len(o.stream) and mid["position"] % 1 == 0
    resumed = run_stream(make_learner("tinyer", buffer=30), fs, o, regime=reg, resume=mid)
    assert resumed["accuracy"] == full["accuracy"]


def test_regime_in_results_and_refusals(tmp_path):
    spec = dict(dataset="digits", ordering="class_iid", seeds=[0], limit_per_class=20,
                out_dir=tmp_path, cache_dir=tmp_path)
    res = run_experiment(ExperimentSpec(**spec, method="tinyer", regime="batch", epochs=2))
    assert res["path"].endswith("digits_class_iid_tinyer_limit_per_class=20+epochs=2_batch.json")
    assert res["regime"] == {"name": "batch", "batch_size": 10, "epochs": 2}
    assert res["violates_single_pass"] is True
    res = run_experiment(ExperimentSpec(**spec, method="tinyer", regime="online"))
    assert res["path"].endswith("_online.json") and res["violates_single_pass"] is False
    for method in ("slda", "ncm", "gdumb", "offline"):
        with pytest.raises(ValueError, match=f"'{method}' does not support the batch regime"):
            run_experiment(ExperimentSpec(**spec, method=method, regime="batch"))


@pytest.mark.parametrize("method", [n for n, c in available_methods().items()
                                    if not c._has_batch_update()])
def test_learn_many_without_a_batch_update_is_learn_one_in_order(method, fs):
    """A learner without a mini-batch update learns a batch one sample at a time, in order:
    the same state, bit for bit, as learn_one on each sample (new labels in the batch grow the
    model where learn_one would); a subclass with a learn_one of its own gets it called."""
    from ciosl.serial import digest

    settings = {"base_epochs": 1} if method in ("ewc", "mas") else {}
    a, b = (make_learner(method, **settings) for _ in range(2))
    for t in (a, b):
        t.fit_base(fs.train_z[:60:3], fs.train_y[:60:3].tolist())  # classes 0 and 1
    order = np.random.default_rng(1).permutation(len(fs.train_y))[:24]
    a.learn_many(fs.train_z[order], [int(fs.train_y[i]) for i in order])
    for i in order:
        b.learn_one(fs.train_z[i], int(fs.train_y[i]))
    assert a.classes_ == b.classes_ and a.n_seen_ == b.n_seen_
    assert digest(a.state_dict()) == digest(b.state_dict())

    calls = []

    class Own(type(a)):
        def learn_one(self, z, y):
            calls.append(y)
            super().learn_one(z, y)

    own = Own(**settings)
    own.fit_base(fs.train_z[:60:3], fs.train_y[:60:3].tolist())
    own.learn_many(fs.train_z[order[:5]], [int(fs.train_y[i]) for i in order[:5]])
    assert calls == [int(fs.train_y[i]) for i in order[:5]]
