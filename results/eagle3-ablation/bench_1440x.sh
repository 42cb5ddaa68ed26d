#!/usr/bin/env bash
# Issue 16: the 1440-step EAGLE-1 and EAGLE-3.1 heads trained on greedy rows (stream1440.sh A, B) and on
# T = 0.7-sampled rows (stream1440_sampled.sh G, H) and EAGLE-3.1 with 7 TTT steps (stream1440.sh F), side by side on the 124 held-out prompts of
# bench_1440_more.sh (code rows 16-79, chat rows 140-199; bench_720_more.sh writes them to out/abl/prompts),
# greedy once and T = 0.7 with two sampling seeds, pooled by prompt (pool_seeds.py).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl P=out/abl/prompts R=results/eagle3-ablation
common=(--target demo --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads eagle1=$O/b1440-eagle --heads eagle31=$O/b1440-eagle31
  --heads eagle1-t07=$O/b1440t07-eagle --heads eagle31-t07=$O/b1440t07-eagle31 --heads eagle31-ttt7=$O/b1440-eagle31-ttt7
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0
  --vs eagle31:eagle1 --vs eagle31-t07:eagle1-t07 --vs eagle31-t07:eagle31 --vs eagle1-t07:eagle1 --vs eagle31-ttt7:eagle1 --vs eagle31-ttt7:eagle31)
.venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench-1440x-greedy
for s in 0 1; do
  .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench-1440x-s$s
done
for pair in eagle31:eagle1 eagle31-t07:eagle1-t07 eagle31-t07:eagle31 eagle1-t07:eagle1 eagle31-ttt7:eagle1; do
  .venv/bin/python $R/pool_seeds.py ${pair%:*} ${pair#*:} $R/bench-1440x-s0 $R/bench-1440x-s1
done > $R/bench-1440x-pooled.md
