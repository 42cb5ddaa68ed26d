#!/usr/bin/env bash
# Issue 16, 2026-12-05: does plain EAGLE-3 overtake EAGLE-1 at twice the training budget? EAGLE-1 and plain
# EAGLE-3 at 2880 steps (stream.sh L, K, l, k: seeds 0 and 1), on one more rebuild of the target and data of
# ceiling9.sh, scored on identical contexts without sampling noise (scripts/tree_ceiling.py; each head's
# default tree: depth 6, 47 drafts). pool_heads.py averages each head type over its seeds.
# T: T = 0.7, G: greedy (code and chat side by side, one thread each).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1-2880=$O/eagle1-2880 --heads eagle1-2880-s1=$O/eagle1-2880-s1
  --heads eagle3-2880=$O/eagle3-2880 --heads eagle3-2880-s1=$O/eagle3-2880-s1
  --vs eagle1-2880-s1:eagle1-2880 --vs eagle3-2880-s1:eagle3-2880
  --vs eagle3-2880:eagle1-2880 --vs eagle3-2880-s1:eagle1-2880-s1)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T|G) mode=$([ "$1" = T ] && echo sample || echo greedy) tag=$([ "$1" = T ] && echo t07 || echo greedy)
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes $mode --prompts code=$P/code-16-79.jsonl --out $R/ceiling10-$tag-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes $mode --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling10-$tag-chat &
     wait ;;
  *) echo "usage: ceiling10.sh T|G" >&2; exit 2 ;;
esac
