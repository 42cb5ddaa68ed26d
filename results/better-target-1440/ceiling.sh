#!/usr/bin/env bash
# Issue 16: how far the 1440-step EAGLE-1 and EAGLE-3.1 heads of stream.sh (text rows; -chat: chat answers) are from the best tree of their
# size on the better-trained target (scripts/tree_ceiling.py), on bench.sh's 124 held-out prompts, at every
# 16th position of the target's own 128-token continuation: T = 0.7 (code and chat side by side, one thread
# each) and greedy with each head's default tree (depth 6, 47 drafts), then greedy with a depth-10,
# 60-token tree, where a 7-token cap does not hide differences.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/bt1440 P=out/bt/prompts R=results/better-target-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31 --heads eagle1-chat=$O/eagle1-chat --heads eagle31-chat=$O/eagle31-chat
  --vs eagle31:eagle1 --vs eagle31-chat:eagle1-chat --vs eagle31-chat:eagle31 --vs eagle1-chat:eagle1)
bash $R/prompts.sh || exit 1
both=(--prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl)
case "$1" in
  T) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts code=$P/code-16-79.jsonl --out $R/ceiling-t07-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling-t07-chat &
     wait ;;
  G) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" "${both[@]}" --modes greedy --out $R/ceiling-greedy ;;
  D) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" "${both[@]}" --modes greedy --depth 10 --total-tokens 60 \
       --out $R/ceiling-greedy-deep ;;
esac
