#!/usr/bin/env bash
# Issue 16, a 4x budget: EAGLE-1 and EAGLE-3.1 at 1440 steps x 8 x 256 tokens on all 4000 regenerated demo
# train rows (the 720-step runs used the first 2000), seed 0, the rest as in stream720.sh. Run from a
# selfspec checkout after regenerating out/demo-regen-4k (the section's commands in README.md):
# `bash results/eagle3-ablation/stream1440.sh A` and `... B` side by side, one torch thread each.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
common="target.dtype=fast data.path=out/demo-regen-4k/train.jsonl data.eval_path=out/demo-regen-4k/eval.jsonl train.save_every=0 train.eval_every=480 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p out/abl/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=out/abl/$name "$@" > out/abl/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  A) run b1440-eagle31 demo-eagle31 1440 ;;
  B) run b1440-eagle demo-eagle 1440 train.lr=4e-3 ;;
  # after A and B, at the same budget: Medusa and plain EAGLE-3 (lm_head from the target, as in stream720.sh)
  C) run b1440-medusa demo-medusa-regen 1440 ;;
  D) run b1440-eagle3 demo-eagle3 1440 heads.options.lm_head_init=target ;;
  # EAGLE-3.1 with the aux layers nearer the top (the 120- and 360-step ablations put them slightly ahead)
  E) run b1440-eagle31-aux demo-eagle31 1440 "heads.options.aux_layer_ids=[4,8,11]" ;;
  # EAGLE-3.1 with the paper's 7 TTT steps
  F) run b1440-eagle31-ttt7 demo-eagle31 1440 heads.options.ttt_steps=7 ;;
esac
