#!/usr/bin/env bash
# Issue 16, 2026-12-06: the third head type and the paper's TTT length at the 5760-step budget of ceiling12.sh,
# on the SAME build. stream.sh U: Medusa at 5760 steps; S: plain EAGLE-3 with 7 TTT steps (the EAGLE-3 paper's)
# instead of the recipe's 4, otherwise stream.sh Q. Both seed 0, like ceiling12.sh's 5760-step heads, which are
# scored again here with them on identical contexts (scripts/tree_ceiling.py; each head's default tree).
# T: T = 0.7, G: greedy, D: greedy with ceiling12.sh's depth-10, 60-token tree (code and chat side by side, one
# thread each); M: Medusa at 5760 and 2880 steps in a run of their own (Medusa's default tree is another size),
# greedy then T = 0.7, code then chat on one thread (it ran beside stream.sh S). E: T = 0.7 with D's tree.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
base=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1)
eagle=(--heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
  --heads eagle3-5760-ttt7=$O/eagle3-5760-ttt7
  --vs eagle3-5760-ttt7:eagle1-5760 --vs eagle3-5760-ttt7:eagle3-5760 --vs eagle3-5760:eagle1-5760)
medusa=(--heads medusa-5760=$O/medusa-5760 --heads medusa-2880=$O/medusa-2880 --vs medusa-5760:medusa-2880)
bash results/better-target-1440/prompts.sh || exit 1
both() {  # TAG tree_ceiling args...: code and chat side by side, one thread each
  local tag=$1; shift
  .venv/bin/python scripts/tree_ceiling.py "${base[@]}" "$@" --prompts code=$P/code-16-79.jsonl --out $R/ceiling13-$tag-code &
  .venv/bin/python scripts/tree_ceiling.py "${base[@]}" "$@" --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling13-$tag-chat &
  wait
}
case "$1" in
  T) both t07 "${eagle[@]}" --modes sample ;;
  G) both greedy "${eagle[@]}" --modes greedy ;;
  D) both deep "${eagle[@]}" --modes greedy --depth 10 --total-tokens 60 ;;
  E) both deep-t07 "${eagle[@]}" --modes sample --depth 10 --total-tokens 60 ;;
  M) for set in code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl; do
       .venv/bin/python scripts/tree_ceiling.py "${base[@]}" "${medusa[@]}" --modes greedy,sample --prompts $set \
         --out $R/ceiling13-medusa-${set%%=*} || exit 1
     done ;;
  *) echo "usage: ceiling13.sh T|G|D|E|M" >&2; exit 2 ;;
esac
