#!/usr/bin/env bash
# Issue 16, 2026-12-06 (2nd): the recipe's EAGLE-3 head (EAGLE-3.1 options, configs/demo-eagle31.yaml) at the
# 5760-step budget of ceiling12.sh / ceiling13.sh, and a second training seed of EAGLE-1 there, on the SAME build:
# stream.sh V (EAGLE-3.1, seed 0) and d (EAGLE-1, seed 1), scored on identical contexts with ceiling12.sh's seed-0
# EAGLE-1 and plain EAGLE-3 heads (scripts/tree_ceiling.py; each head's default tree). Medusa at 5760 steps was
# scored on these contexts by ceiling13.sh M. G: greedy, T: T = 0.7 (code and chat side by side, one thread each).
# Seed-pooled differences: results/mixed-1440/pool_heads.py on the results.json files.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
base=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1)
heads=(--heads eagle1-5760=$O/eagle1-5760 --heads eagle1-5760-s1=$O/eagle1-5760-s1 --heads eagle3-5760=$O/eagle3-5760
  --heads eagle31-5760=$O/eagle31-5760
  --vs eagle31-5760:eagle1-5760 --vs eagle31-5760:eagle1-5760-s1 --vs eagle31-5760:eagle3-5760
  --vs eagle3-5760:eagle1-5760-s1 --vs eagle1-5760-s1:eagle1-5760)
bash results/better-target-1440/prompts.sh || exit 1
both() {  # TAG tree_ceiling args...: code and chat side by side, one thread each
  local tag=$1; shift
  .venv/bin/python scripts/tree_ceiling.py "${base[@]}" "$@" --prompts code=$P/code-16-79.jsonl --out $R/ceiling14-$tag-code &
  .venv/bin/python scripts/tree_ceiling.py "${base[@]}" "$@" --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling14-$tag-chat &
  wait
}
case "$1" in
  G) both greedy "${heads[@]}" --modes greedy ;;
  T) both t07 "${heads[@]}" --modes sample ;;
  *) echo "usage: ceiling14.sh G|T" >&2; exit 2 ;;
esac
