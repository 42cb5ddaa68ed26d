#!/usr/bin/env bash
# Issue 16, added 2026-12-04 (3rd): plain EAGLE-3 with its default aux layers (2/6/9, stream.sh e) and with
# higher ones (4/8/11, stream.sh h), both trained for 720 steps on one rebuilt target, on identical
# contexts without sampling noise (scripts/tree_ceiling.py; each head's default tree: depth 6, 47 drafts).
# fp32: the AMD CPU this ran on has no native bf16. T: T = 0.7, G: greedy (code and chat side by
# side, one thread each).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype fp32 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle3=$O/eagle3-720 --heads eagle3-aux-hi=$O/eagle3-aux-hi-720 --vs eagle3-aux-hi:eagle3)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts code=$P/code-16-79.jsonl --out $R/ceiling8-t07-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling8-t07-chat &
     wait ;;
  G) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes greedy --prompts code=$P/code-16-79.jsonl --out $R/ceiling8-greedy-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes greedy --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling8-greedy-chat &
     wait ;;
  *) echo "usage: ceiling8.sh T|G" >&2; exit 2 ;;
esac
