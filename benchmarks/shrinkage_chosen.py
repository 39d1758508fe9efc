"""The shrinkage (slda, rp_lda) and ridge (ranpac) each closed-form learner chooses at the end of a
stream: every training sample learned (the final statistics do not depend on the ordering), then
``shrinkage_`` / ``ridge_`` read off. rp_lda and ranpac draw their projection from ``--seed``.

    python benchmarks/shrinkage_chosen.py --dataset digits-instances --extractor efficientnet_lite0
    python benchmarks/shrinkage_chosen.py --dataset digits --extractor pixels

Extra settings for a learner: ``--set rp_lda:proj_dim=8192`` (repeatable). The ridge is also
printed relative to the mean Gram eigenvalue (lambda / (tr G / D), the scale of ranpac's grid).
"""

from __future__ import annotations

import argparse

import numpy as np

from ciosl.data.features import get_features
from ciosl.learners.base import get_method, make_learner, parse_value

METHODS = ("slda", "rp_lda", "ranpac")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--extractor", default="efficientnet_lite0")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="METHOD:KEY=VALUE")
    args = ap.parse_args()
    fs = get_features(args.dataset, args.extractor)
    Z, y = np.asarray(fs.train_z), np.asarray(fs.train_y)
    print(f"{args.dataset} on {args.extractor}: {len(Z)} training samples, d = {Z.shape[1]}")
    for name in args.methods.split(","):
        settings = {"seed": args.seed} if "seed" in get_method(name)().get_params() else {}
        for item in args.set:
            method, _, kv = item.partition(":")
            if method == name:
                key, _, text = kv.partition("=")
                setting = next(s for s in get_method(name).settings() if s.name == key)
                settings[key] = parse_value(setting, text)
        learner = make_learner(name, **settings)
        learner.learn_many(Z, y)
        acc = learner.score(np.asarray(fs.test_z), np.asarray(fs.test_y))
        if name == "ranpac":
            ridge = learner.ridge_
            tr = sum(float(np.square(learner.transform(Z[i:i + 2000])).sum())
                     for i in range(0, len(Z), 2000))  # tr G
            D = learner.proj_dim
            print(f"  {name} {settings}: ridge_ = {ridge:.4g} (lambda / (tr G / D) = "
                  f"{ridge * D / tr:.3g}), final accuracy {acc:.4f}")
        else:
            print(f"  {name} {settings}: shrinkage_ = {learner.shrinkage_:.4g}, "
                  f"final accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
