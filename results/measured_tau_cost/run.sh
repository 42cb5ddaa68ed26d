#!/usr/bin/env bash
# Cost of the measured-τ eval (issue 17 #3) on configs/demo-medusa-tiny.yaml at its default eval interval
# (train.eval_every 10: evals at steps 10, 20 and the final one at 26): the default (4 prompts x 32 new
# tokens), 4 x 64, and off, interleaved, 3 runs each. Run from the repo root:
#   bash results/measured_tau_cost/run.sh > results/measured_tau_cost/log.txt
set -euo pipefail
for rep in 1 2 3; do
  for setting in "eval.measured_tau_prompts=4" "eval.measured_tau_new_tokens=64" "eval.measured_tau_prompts=0"; do
    rm -rf /tmp/mtau-cost
    start=$(date +%s.%N)
    out=$(OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python train/train_heads.py --config configs/demo-medusa-tiny.yaml \
      output_dir=/tmp/mtau-cost "$setting" 2>/dev/null)
    end=$(date +%s.%N)
    evals=$( (echo "$out" | grep -o "in [0-9.]* s" || true) | awk '{s += $2} END {printf "%.2f", s}')
    echo "rep $rep $setting wall_s $(echo "$end - $start" | bc) measured_tau_eval_s ${evals:-0}"
    echo "$out" | grep "^step .*: eval" || true
  done
done
