#!/usr/bin/env bash
# Issue 16, 2026-12-05 (3rd): does plain EAGLE-3's lead over EAGLE-1 grow with the training budget? EAGLE-1
# and plain EAGLE-3 at 5760 steps (stream.sh D, Q: seed 0, four times ceiling9.sh's 1440 steps, 6.6 epochs),
# on the SAME build as ceiling10.sh's 2880-step heads, scored together with the 2880-step seed-0 heads on
# identical contexts (scripts/tree_ceiling.py; each head's default tree: depth 6, 47 drafts).
# T: T = 0.7, G: greedy (code and chat side by side, one thread each); D: greedy with a depth-10, 60-token
# tree (bench_720_deep.sh's), since both 5760-step heads sit near the depth-6 cap on greedy code.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
common=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1
  --heads eagle1-2880=$O/eagle1-2880 --heads eagle3-2880=$O/eagle3-2880
  --heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
  --vs eagle3-5760:eagle1-5760 --vs eagle3-2880:eagle1-2880
  --vs eagle1-5760:eagle1-2880 --vs eagle3-5760:eagle3-2880)
bash results/better-target-1440/prompts.sh || exit 1
both() {  # TAG tree_ceiling args...: code and chat side by side, one thread each
  local tag=$1; shift
  .venv/bin/python scripts/tree_ceiling.py "${common[@]}" "$@" --prompts code=$P/code-16-79.jsonl --out $R/ceiling12-$tag-code &
  .venv/bin/python scripts/tree_ceiling.py "${common[@]}" "$@" --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling12-$tag-chat &
  wait
}
case "$1" in
  T) both t07 --modes sample ;;
  G) both greedy --modes greedy ;;
  D) both deep --modes greedy --depth 10 --total-tokens 60 ;;
  *) echo "usage: ceiling12.sh T|G|D" >&2; exit 2 ;;
esac
