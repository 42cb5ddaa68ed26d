#!/usr/bin/env bash
# Issue 16, added 2026-12-04: ceiling.sh with plain EAGLE-3 beside EAGLE-1 and EAGLE-3.1, on identical contexts,
# without sampling noise (scripts/tree_ceiling.py; each head's default tree: depth 6, 47 drafts). P-EAGLE is not
# here: its default tree is depth 8, and the best-tree bound needs one tree size for all heads.
# T: T = 0.7 (code and chat side by side, one thread each); G: greedy.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1=$O/eagle1 --heads eagle3=$O/eagle3 --heads eagle31=$O/eagle31
  --vs eagle3:eagle1 --vs eagle31:eagle3 --vs eagle31:eagle1)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts code=$P/code-16-79.jsonl --out $R/ceiling5-t07-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling5-t07-chat &
     wait ;;
  G) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
       --modes greedy --out $R/ceiling5-greedy ;;
esac
