#!/usr/bin/env bash
# Issue 16, added 2026-12-04: ceiling5.sh for EAGLE-3.1 unrolled over 6 TTT steps (stream.sh T) beside the
# 4-step EAGLE-3.1 and EAGLE-1, on the same identical contexts, without sampling noise (scripts/tree_ceiling.py;
# each head's default tree: depth 6, 47 drafts). T: T = 0.7 (code and chat side by side, one thread each); G: greedy.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31 --heads eagle31-ttt6=$O/eagle31-ttt6
  --vs eagle31-ttt6:eagle31 --vs eagle31-ttt6:eagle1)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts code=$P/code-16-79.jsonl --out $R/ceiling6-t07-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling6-t07-chat &
     wait ;;
  G) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
       --modes greedy --out $R/ceiling6-greedy ;;
  *) echo "usage: ceiling6.sh T|G" >&2; exit 2 ;;
esac
