#!/usr/bin/env bash
# Issue 16, a 2x budget on the Intel Xeon box (native bf16, so the demo's dtype "fast" = bf16 for the
# target): Medusa, EAGLE-1, EAGLE-3 and EAGLE-3.1 at 720 steps x 8 x 256 tokens on the same regenerated
# data, seed 0. Run from a selfspec checkout: `bash results/eagle3-ablation/stream720.sh A` and B side by side,
# one torch thread each, then C and D side by side.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
common="target.dtype=fast data.path=out/demo-regen/train.jsonl data.eval_path=out/demo-regen/eval.jsonl train.save_every=0 train.eval_every=240 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p out/abl/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=out/abl/$name "$@" > out/abl/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  A) run b720-eagle31 demo-eagle31 720
     run b720-medusa demo-medusa-regen 720 ;;
  B) run b720-eagle demo-eagle 720 train.lr=4e-3
     run b720-eagle3 demo-eagle3 720 heads.options.lm_head_init=target ;;
  # after A and B: the full vocabulary (A's draft vocab of 2048 covers 99.0% of the training labels) and
  # P-EAGLE, both on the EAGLE-3.1 recipe
  C) run b720-eagle31-fullvocab demo-eagle31 720 heads.options.draft_vocab_size=null ;;
  D) run b720-peagle demo-eagle31 720 heads.options.parallel_draft=4 ;;
esac
