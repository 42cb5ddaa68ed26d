#!/usr/bin/env bash
# Issue 16, 2026-12-05 (3rd): EAGLE-1 and plain EAGLE-3 at 5760 steps (stream.sh D, Q, seed 0; same build as
# bench11.sh) in whole generations with infer.generate, on bench11.sh's 64 code + 60 chat held-out prompts,
# 128 new tokens, bf16, each head's default tree. No argument: greedy and T = 0.7 sampling seed 0, two
# processes side by side, one thread each; `sample`: seeds 1 and 2; `sample2`: seeds 3 and 4. After each
# sampling step the seeds run so far are pooled into bench12-pooled.md.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
common=(--target out/bt/target --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760 --vs eagle3-5760:eagle1-5760
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0)
case "$1" in
  "") .venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench12-greedy &
      .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed 0 --out $R/bench12-s0 &
      wait; exit ;;
  sample) new="1 2" last=2 ;;
  sample2) new="3 4" last=4 ;;
  *) echo "usage: bench12.sh [sample|sample2]" >&2; exit 2 ;;
esac
for s in $new; do .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench12-s$s & done
wait
.venv/bin/python results/eagle3-ablation/pool_seeds.py eagle3-5760 eagle1-5760 \
  $(for s in $(seq 0 $last); do echo $R/bench12-s$s; done) > $R/bench12-pooled.md
