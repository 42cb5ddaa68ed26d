#!/usr/bin/env bash
# Issue 16, added 2026-12-04: ceiling5.sh for plain EAGLE-3 fusing higher target layers (aux 4/8/11, stream.sh H)
# beside EAGLE-1 (retrained, stream.sh B), on identical contexts, without sampling noise (scripts/tree_ceiling.py;
# each head's default tree: depth 6, 47 drafts). The rebuilt target differed from ceiling5's (README), so only
# the paired difference counts. T: T = 0.7 (code and chat side by side, one thread each); G: greedy.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1=$O/eagle1 --heads eagle3-aux-hi=$O/eagle3-aux-hi --vs eagle3-aux-hi:eagle1)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts code=$P/code-16-79.jsonl --out $R/ceiling7-t07-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes sample --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling7-t07-chat &
     wait ;;
  G) .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
       --modes greedy --out $R/ceiling7-greedy ;;
  *) echo "usage: ceiling7.sh T|G" >&2; exit 2 ;;
esac
