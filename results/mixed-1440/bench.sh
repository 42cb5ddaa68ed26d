#!/usr/bin/env bash
# Issue 16: after stream.sh A, B and M, the three heads trained on the mixed text + chat set side by side on
# the 64 code + 60 chat held-out prompts of ../better-target-1440/prompts.sh (never trained on by the target
# or the heads), 128 new tokens, bf16, 1 thread, each head's default tree: greedy once, then T = 0.7 with
# three sampling seeds, pooled by prompt (../eagle3-ablation/pool_seeds.py).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
common=(--target out/bt/target --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads medusa=$O/medusa --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0
  --vs eagle31:eagle1 --vs eagle1:medusa --vs eagle31:medusa)
[ "$1" = sample ] || { .venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench-greedy || exit 1; }
for s in ${SEEDS:-0 1 2}; do
  .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench-s$s || exit 1
done
for pair in eagle31:eagle1 eagle1:medusa eagle31:medusa; do
  .venv/bin/python results/eagle3-ablation/pool_seeds.py ${pair%:*} ${pair#*:} $(for s in ${SEEDS:-0 1 2}; do echo $R/bench-s$s; done) || exit 1
done > $R/bench-pooled.md
