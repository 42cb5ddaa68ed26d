#!/usr/bin/env bash
# Issue 16, added 2026-12-04: after stream.sh E, P and T, the six heads trained on the mixed set (Medusa, EAGLE-1,
# plain EAGLE-3, EAGLE-3.1, EAGLE-3.1 with 6 TTT steps, P-EAGLE) side by side in one run on bench.sh's 64 code + 60 chat held-out prompts,
# 128 new tokens, bf16, 1 thread, each head's default tree: greedy once, then T = 0.7 with sampling seeds 3, 4
# and 5 (bench.sh used 0, 1 and 2, so EAGLE-3.1 - EAGLE-1 and EAGLE-1 - Medusa also pool over six seeds).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
common=(--target out/bt/target --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads medusa=$O/medusa --heads eagle1=$O/eagle1 --heads eagle3=$O/eagle3 --heads eagle31=$O/eagle31
  --heads eagle31-ttt6=$O/eagle31-ttt6 --heads peagle=$O/peagle
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0
  --vs eagle3:eagle1 --vs eagle31:eagle3 --vs eagle31-ttt6:eagle31 --vs peagle:eagle31
  --vs eagle31:eagle1 --vs eagle1:medusa)
[ "$1" = sample ] || { .venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench5-greedy || exit 1; }
for s in 3 4 5; do
  .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench5-s$s || exit 1
done
pool() { .venv/bin/python results/eagle3-ablation/pool_seeds.py "$@" || exit 1; }
{ for pair in eagle3:eagle1 eagle31:eagle3 eagle31-ttt6:eagle31 eagle31-ttt6:eagle1 peagle:eagle31 peagle:medusa; do
    pool ${pair%:*} ${pair#*:} $R/bench5-s3 $R/bench5-s4 $R/bench5-s5; done
  for pair in eagle31:eagle1 eagle1:medusa; do
    pool ${pair%:*} ${pair#*:} $R/bench-s0 $R/bench-s1 $R/bench-s2 $R/bench5-s3 $R/bench5-s4 $R/bench5-s5; done
} > $R/bench5-pooled.md
