#!/usr/bin/env bash
# Issue 16: the 1440-step EAGLE-1, EAGLE-3.1 and EAGLE-3.1 aux 4/8/11 heads (stream1440.sh A, B, E) on the
# 124 other held-out prompts of bench_720_more.sh (code rows 16-79, chat rows 140-199; bench_720_more.sh
# writes them to out/abl/prompts), greedy once and T=0.7 with three sampling seeds; pool_seeds.py pools
# the seeds by prompt.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl P=out/abl/prompts R=results/eagle3-ablation
common=(--target demo --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads eagle1=$O/b1440-eagle --heads eagle31=$O/b1440-eagle31 --heads eagle31-aux=$O/b1440-eagle31-aux
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0
  --vs eagle31:eagle1 --vs eagle31-aux:eagle1 --vs eagle31-aux:eagle31)
.venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench-1440-more-greedy
for s in 0 1 2; do
  .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench-1440-more-s$s
done
for a in eagle31 eagle31-aux; do
  .venv/bin/python $R/pool_seeds.py $a eagle1 $R/bench-1440-more-s0 $R/bench-1440-more-s1 $R/bench-1440-more-s2
done > $R/bench-1440-more-pooled.md
