#!/usr/bin/env bash
# The bounded study of issue 27: CIOSL at the paper's own settings against today's defaults on
# the development streams, through the pretrained extractor; 5 paired seeds per stream.
#   bash docs/results/paper-vs-defaults/run.sh      (about 35 minutes on one core)
# A result already here is kept; an interrupted run resumes from its checkpoint.
# paper: lambda1 = 1, lambda2 = 0.3, distillation from the first step, prior scale 1, UAPN on
# every ordering but iid (uniform there); temperature and gradient clipping stay at the defaults
# in both (the paper has neither; without them the head diverges or its scales do not move).
set -euo pipefail
cd "$(dirname "$0")"
for stream in digits:iid digits:class_iid digits-instances:iid digits-instances:class_iid \
              digits-instances:instance digits-instances:class_instance; do
  d=${stream%%:*}; o=${stream##*:}
  sel=uapn; [ "$o" = iid ] && sel=uniform
  common=(--dataset "$d" --ordering "$o" --method ciosl --seeds 0,1,2,3,4
          --extractor efficientnet_lite0 --threads 1 --out . --resume --checkpoint-every 500)
  paper=(--set lambda1=1 --set lambda2=0.3 --set distill_when=always --set prior_scale=1
         --set selection=$sel)
  name=$d; [ "$d" = digits ] && name=digits-efficientnet_lite0
  ls "${name}_${o}_ciosl.json" >/dev/null 2>&1 || ciosl run "${common[@]}"
  ls "${name}_${o}_ciosl_"*"selection-${sel}.json" >/dev/null 2>&1 || ciosl run "${common[@]}" "${paper[@]}"
done
