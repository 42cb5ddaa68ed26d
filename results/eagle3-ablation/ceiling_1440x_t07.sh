#!/usr/bin/env bash
# Issue 16: the T = 0.7 part of ceiling_1440x.sh again, after the fix that gives scripts/tree_ceiling.py the
# warpers infer.generate samples with (T = 0.7 *and* transformers' default top-k 50; the first run scored the
# trees at T = 0.7 without top-k). Code and chat run side by side, one thread each.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl P=out/abl/prompts R=results/eagle3-ablation
common=(--target demo --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1 --modes sample
  --heads eagle1=$O/b1440-eagle --heads eagle31=$O/b1440-eagle31
  --heads eagle1-t07=$O/b1440t07-eagle --heads eagle31-t07=$O/b1440t07-eagle31 --heads eagle31-ttt7=$O/b1440-eagle31-ttt7
  --vs eagle31:eagle1 --vs eagle31-t07:eagle1-t07 --vs eagle31-t07:eagle31 --vs eagle1-t07:eagle1
  --vs eagle31-ttt7:eagle1 --vs eagle31-ttt7:eagle31)
.venv/bin/python scripts/tree_ceiling.py "${common[@]}" --prompts code=$P/code-16-79.jsonl --out $R/ceiling-1440x-t07-code &
.venv/bin/python scripts/tree_ceiling.py "${common[@]}" --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling-1440x-t07-chat &
wait
