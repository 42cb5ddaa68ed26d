#!/usr/bin/env bash
# Issue 16: Medusa, EAGLE-1 and EAGLE-3.1 on the better-trained demo target of ../better-target/ at twice the
# budget of that run, on twice the rows: 1440 steps x 8 x 256 tokens on 4000 greedy self-distilled rows (all
# of the demo's train split), seed 0, the target frozen in the demo's "fast" dtype. From a selfspec checkout:
#   PYTHONPATH=$PWD .venv/bin/python results/better-target/build_target.py out/bt/target
#   THREADS=2 bash results/better-target-1440/stream.sh R                                              # the rows
#   bash results/better-target-1440/stream.sh A & bash results/better-target-1440/stream.sh B; wait    # one thread each
#   bash results/better-target-1440/stream.sh M
# and the same EAGLE heads on 3000 + 200 of the target's own chat answers (the demo's train-chat / eval-chat
# conversations, demo.ensure_demo_chat_data; 192 new tokens, as configs/demo-medusa-chat.yaml):
#   bash results/better-target-1440/stream.sh C
#   bash results/better-target-1440/stream.sh E & bash results/better-target-1440/stream.sh F; wait
#   bash results/better-target-1440/stream.sh N                                                       # Medusa on them
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${THREADS:-1} OMP_WAIT_POLICY=PASSIVE
T=out/bt/target D=out/bt/regen-4k DC=out/bt/regen-chat O=out/bt1440
common="target.name_or_path=$T target.dtype=fast data.path=$D/train.jsonl data.eval_path=$D/eval.jsonl train.save_every=0 train.eval_every=720 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p $O/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=$O/$name "$@" > $O/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  R) for split in eval:200 train:4000; do
       .venv/bin/python scripts/regenerate_data.py --target $T --dtype fast --data demo --split ${split%:*} \
         --limit ${split#*:} --out $D/${split%:*}.jsonl --prompt-tokens 32 --max-new-tokens 224 --batch-size 64 \
         --threads ${THREADS:-1} || exit 1
     done ;;
  C) for split in eval-chat:200 train-chat:3000; do
       .venv/bin/python scripts/regenerate_data.py --target $T --dtype fast --data demo --split ${split%:*} \
         --limit ${split#*:} --out $DC/${split%-chat:*}.jsonl --max-new-tokens 192 --batch-size 32 \
         --threads ${THREADS:-1} || exit 1
     done ;;
  E) run eagle31-chat demo-eagle31 1440 data.path=$DC/train.jsonl data.eval_path=$DC/eval.jsonl data.max_length=320 ;;
  F) run eagle1-chat demo-eagle 1440 train.lr=4e-3 data.path=$DC/train.jsonl data.eval_path=$DC/eval.jsonl data.max_length=320 ;;
  N) run medusa-chat demo-medusa-chat 1440 data.path=$DC/train.jsonl data.eval_path=$DC/eval.jsonl ;;
  A) run eagle31 demo-eagle31 1440 ;;
  B) run eagle1 demo-eagle 1440 train.lr=4e-3 ;;
  M) run medusa demo-medusa-regen 1440 ;;
esac
