#!/usr/bin/env bash
# Issue 16: how far each 1440-step head's trees (bench_1440x.sh's five) are from the best tree of their size
# (scripts/tree_ceiling.py), on the same 124 held-out prompts as bench_1440x.sh, at every 16th position of
# the target's own 128-token continuation (greedy, and sampled at T = 0.7 with seed 0): each head's default
# tree (depth 6, top-k 8, 48 tokens), then greedy with the deeper tree of the 720-step section (depth 10,
# 60 tokens), where greedy code is not capped at 7.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl P=out/abl/prompts R=results/eagle3-ablation
common=(--target demo --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl --limit 64
  --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1=$O/b1440-eagle --heads eagle31=$O/b1440-eagle31
  --heads eagle1-t07=$O/b1440t07-eagle --heads eagle31-t07=$O/b1440t07-eagle31 --heads eagle31-ttt7=$O/b1440-eagle31-ttt7
  --vs eagle31:eagle1 --vs eagle31-t07:eagle1-t07 --vs eagle31-t07:eagle31 --vs eagle1-t07:eagle1
  --vs eagle31-ttt7:eagle1 --vs eagle31-ttt7:eagle31)
.venv/bin/python scripts/tree_ceiling.py "${common[@]}" --out $R/ceiling-1440x
.venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes greedy --depth 10 --total-tokens 60 \
  --out $R/ceiling-1440x-deep
