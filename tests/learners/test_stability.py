"""Every method at its defaults on a user's own standardised features, where
near-constant columns reach |z| ~ 100: nothing diverges (gradient clipping, head.SGD), and a
divergence that still happens is a one-line CLI error.

The Bayesian heads (CIOSL, VCL, VCL+coreset, Coreset-only) are in scope too: before their
gradient was clipped, CIOSL with lambda1 = 0 and uniform selection diverged on such a stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ciosl.cli import main
from ciosl.data.orderings import limit_per_class
from ciosl.evaluation.experiment import ExperimentSpec, run_experiment
from ciosl.learners import make_learner
from ciosl.learners.head import SGD, clip_grad_norm_

IN_SCOPE = ["finetune", "ewc", "mas", "agem", "tinyer", "exstream", "remind", "ciosl", "vcl",
            "vcl_coreset", "coreset_only"]
CHECKED = ["gdumb", "offline", "ncm", "slda"]
N_PER_CLASS, KEEP = 2500, 150  # the file's train split; the run keeps KEEP per class


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    """A features file standardised the usual way (train mean and std, no floor): 4 Gaussian
    classes in 8 informative columns, plus 16 near-constant columns that are 0 except in one
    or two training samples each, which standardisation maps to |z| ~ 100 (sqrt(n) for one
    spike among n = 10000). The spikes sit in samples that ``--limit-per-class KEEP`` keeps."""
    rng = np.random.default_rng(0)
    n_classes, informative, rare = 4, 8, 16
    centers = rng.normal(size=(n_classes, informative)) * 2.0
    y = np.repeat(np.arange(n_classes), N_PER_CLASS)
    ty = np.repeat(np.arange(n_classes), 200)
    X = np.zeros((len(y), informative + rare))
    X[:, :informative] = centers[y] + rng.normal(size=(len(y), informative))
    T = np.zeros((len(ty), informative + rare))
    T[:, :informative] = centers[ty] + rng.normal(size=(len(ty), informative))
    kept = limit_per_class(y, KEEP)  # what the run below streams
    spikes = rng.choice(kept, size=24, replace=False)
    for k, i in enumerate(spikes):  # columns 8..23: one spike each, 8 of them a second one
        X[i, informative + k % rare] = rng.uniform(0.5, 2.0)
    mean, std = X.mean(0), X.std(0)
    Z, TZ = (X - mean) / std, (T - mean) / std
    assert np.abs(Z[kept]).max() > 90  # the near-constant columns reach |z| ~ 100
    path = tmp_path_factory.mktemp("feats") / "spiky.npz"
    np.savez(path, train_z=Z.astype(np.float32), train_y=y, test_z=TZ.astype(np.float32),
             test_y=ty)
    return path, float((Z[kept] ** 2).sum(1).max())


def run(path, method: str, cache, **settings) -> dict:
    return run_experiment(ExperimentSpec(
        dataset=f"features:{path}", ordering="iid", method=method, seeds=[0],
        limit_per_class=KEEP, offline_epochs=10, cache_dir=cache,
        settings={"base_epochs": "10", **{k: str(v) for k, v in settings.items()}}
        if method in IN_SCOPE else {k: str(v) for k, v in settings.items()}))


@pytest.mark.parametrize("method", IN_SCOPE + CHECKED)
def test_every_method_learns_spiky_standardised_features_at_its_defaults(spiky, method,
                                                                        tmp_path_factory):
    path, _ = spiky
    res = run(path, method, tmp_path_factory.getbasetemp() / "cache")
    accuracy = res["runs"][0]["accuracy"]  # after base init (10%) and at the end
    assert accuracy[-1] > 0.8, accuracy  # 4 classes: chance is 0.25
    assert res["omega_all"]["mean"] > 0.7


def test_ciosl_without_its_kl_and_with_uniform_replay_stays_stable(spiky, tmp_path_factory):
    """The variant that diverged when the (then inert) KL was all that held the step."""
    path, _ = spiky
    res = run(path, "ciosl", tmp_path_factory.getbasetemp() / "cache", lambda1=0,
              selection="uniform")
    assert res["runs"][0]["accuracy"][-1] > 0.8, res["runs"][0]["accuracy"]


def test_without_the_cap_the_same_features_break_one_sample_sgd(spiky, tmp_path_factory):
    """The fixture is not trivially easy: plain SGD at the paper's lr 0.01 fails on it."""
    path, max_sq = spiky
    assert 0.01 * max_sq > 100  # lr * ||x||^2 of the worst sample
    try:
        res = run(path, "finetune", tmp_path_factory.getbasetemp() / "cache",
                  max_grad_norm=float("inf"))
    except FloatingPointError as e:
        assert "diverged" in str(e)
    else:
        assert min(res["runs"][0]["accuracy"][1:]) < 0.5, res["runs"][0]["accuracy"]


def test_clip_grad_norm_scales_the_joint_norm_like_torch():
    grads = [torch.full((2, 2), 3.0), None, torch.full((1,), 4.0)]  # joint norm sqrt(36 + 16)
    assert clip_grad_norm_(grads, 1.0) == pytest.approx(52 ** 0.5)
    assert float(torch.cat([grads[0].flatten(), grads[2]]).norm()) == pytest.approx(1.0)
    small = [torch.full((3,), 0.1)]
    clip_grad_norm_(small, 1.0)
    assert torch.equal(small[0], torch.full((3,), 0.1))  # already small: untouched
    clip_grad_norm_(small, float("inf"))
    assert torch.equal(small[0], torch.full((3,), 0.1))
    # SGD(max_grad_norm) = torch.nn.utils.clip_grad_norm_ then torch.optim.SGD
    torch.manual_seed(0)
    p0 = [torch.randn(5, 3), torch.randn(5)]
    g = [[torch.randn(5, 3) * 10, torch.randn(5) * 10] for _ in range(3)]
    mine = [t.clone().requires_grad_(True) for t in p0]
    ref = [t.clone().requires_grad_(True) for t in p0]
    opt = SGD(mine, lr=0.01, momentum=0.9, weight_decay=1e-5, max_grad_norm=1.0)
    topt = torch.optim.SGD(ref, lr=0.01, momentum=0.9, weight_decay=1e-5)
    for step in g:
        for q, gi in zip(ref, step, strict=True):
            q.grad = gi.clone()
        torch.nn.utils.clip_grad_norm_(ref, 1.0)
        mine = opt.step(mine, [gi.clone() for gi in step])
        topt.step()
    for p, q in zip(mine, ref, strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_a_divergence_is_a_one_line_cli_error(tmp_path, capsys):
    """lr 50 without the cap diverges on digits: `ciosl run` says so in one line (no
    traceback) and exits 2."""
    rc = main(["run", "--dataset", "digits", "--ordering", "iid", "--method", "finetune",
               "--runs", "1", "--set", "lr=50", "--set", "max_grad_norm=inf",
               "--out", str(tmp_path), "--cache", str(tmp_path / "cache"), "--quiet",
               "--limit-per-class", "30"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines[0].startswith("error: finetune: training diverged") and "lr=50" in err
    assert "max_grad_norm=inf" in err
    assert not list(tmp_path.glob("*.json"))


def test_gradient_clipping_is_a_setting_of_every_mlp_head_baseline():
    for method in IN_SCOPE:
        learner = make_learner(method)
        # the Bayesian heads clip the means' gradient at 3 (bayes_head.BAYES_MAX_GRAD_NORM)
        cap = 3.0 if method in ("ciosl", "vcl", "vcl_coreset", "coreset_only") else 1.0
        assert learner.get_params()["max_grad_norm"] == cap
        learner.fit_base(np.eye(4, dtype=np.float32), [0, 1, 0, 1])
        if cap == 1.0:  # the MLP heads' SGD clips; the Bayesian heads clip in their own step
            assert learner.opt.max_grad_norm == cap
        with pytest.raises(ValueError, match="max_grad_norm (must be )?> 0"):
            make_learner(method, max_grad_norm=0.0)
