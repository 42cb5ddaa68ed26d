#!/usr/bin/env bash
# Issue 16: Medusa, EAGLE-1 and EAGLE-3.1 on the better-trained demo target (build_target.py), at the budget of
# ../peagle-depth/stream.sh: 720 steps x 8 x 256 tokens on 2000 greedy self-distilled rows, seed 0, the target
# frozen in the demo's "fast" dtype. Run from a selfspec checkout:
#   PYTHONPATH=$PWD .venv/bin/python results/better-target/build_target.py out/bt/target
#   bash results/better-target/stream.sh R                                                  # the rows
#   bash results/better-target/stream.sh A & bash results/better-target/stream.sh B; wait   # one thread each
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
T=out/bt/target D=out/bt/regen-2k
common="target.name_or_path=$T target.dtype=fast data.path=$D/train.jsonl data.eval_path=$D/eval.jsonl train.save_every=0 train.eval_every=360 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p out/bt/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=out/bt/$name "$@" > out/bt/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  R) for split in eval:200 train:2000; do
       .venv/bin/python scripts/regenerate_data.py --target $T --dtype fast --data demo --split ${split%:*} \
         --limit ${split#*:} --out $D/${split%:*}.jsonl --prompt-tokens 32 --max-new-tokens 224 --batch-size 64 \
         --threads ${THREADS:-1} || exit 1
     done ;;
  A) run eagle31 demo-eagle31 720
     run medusa demo-medusa-regen 720 ;;
  B) run eagle1 demo-eagle 720 train.lr=4e-3 ;;
esac
