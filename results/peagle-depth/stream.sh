#!/usr/bin/env bash
# Issue 16: does a deeper P-EAGLE (K = 6 or 8 depths in its one draft forward, against the K = 4 of the
# 720-step section of results/eagle3-ablation/) turn its cheap draft into more tokens/s than sequential
# EAGLE-3.1 and Medusa? Same budget for every head: 720 steps x 8 x 256 tokens on 2000 greedy self-distilled
# demo rows, seed 0, target frozen in the demo's "fast" dtype. Run from a selfspec checkout:
#   bash results/peagle-depth/stream.sh R            # regenerate the rows (out/demo-regen-2k)
#   bash results/peagle-depth/stream.sh A & bash results/peagle-depth/stream.sh B; wait   # one thread each
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
D=out/demo-regen-2k
common="target.dtype=fast data.path=$D/train.jsonl data.eval_path=$D/eval.jsonl train.save_every=0 train.eval_every=360 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p out/pd/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=out/pd/$name "$@" > out/pd/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  R) for split in eval:200 train:2000; do
       .venv/bin/python scripts/regenerate_data.py --target demo --dtype fast --data demo --split ${split%:*} \
         --limit ${split#*:} --out $D/${split%:*}.jsonl --prompt-tokens 32 --max-new-tokens 224 --batch-size 64 \
         --threads ${THREADS:-1} || exit 1
     done ;;
  A) run peagle6 demo-eagle31 720 heads.options.parallel_draft=6
     run peagle4 demo-eagle31 720 heads.options.parallel_draft=4
     run medusa demo-medusa-regen 720 ;;
  B) run eagle31 demo-eagle31 720
     run peagle8 demo-eagle31 720 heads.options.parallel_draft=8 ;;
  # after A and B: one more depth, trained alone with two threads
  C) OMP_NUM_THREADS=2 run peagle12 demo-eagle31 720 heads.options.parallel_draft=12 ;;
  # EAGLE-1 for bench_more.sh, alone, two threads
  D) OMP_NUM_THREADS=2 run eagle1 demo-eagle 720 train.lr=4e-3 ;;
esac
