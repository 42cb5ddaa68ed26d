#!/usr/bin/env bash
# Issue 16, 2026-12-05 (2nd): EAGLE-3.1 (configs/demo-eagle31.yaml) and Medusa at the 2880-step budget of
# ceiling10.sh (stream.sh J, j: EAGLE-3.1 seeds 0 and 1; N: Medusa, seed 0 only), on the SAME build as
# ceiling10.sh's EAGLE-1 and plain EAGLE-3 heads, so the six EAGLE heads are scored here on identical contexts
# (scripts/tree_ceiling.py; each head's default tree: depth 6, 47 drafts). Medusa's default tree is another
# size (the best tree needs one size), so M scores it in a run of its own on the same prompts and continuations.
# T: T = 0.7, G: greedy (code and chat side by side, one thread each); M: Medusa, greedy then T = 0.7.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
base=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --stride 16 --threads 1)
common=("${base[@]}"
  --heads eagle1-2880=$O/eagle1-2880 --heads eagle1-2880-s1=$O/eagle1-2880-s1
  --heads eagle3-2880=$O/eagle3-2880 --heads eagle3-2880-s1=$O/eagle3-2880-s1
  --heads eagle31-2880=$O/eagle31-2880 --heads eagle31-2880-s1=$O/eagle31-2880-s1
  --vs eagle31-2880:eagle1-2880 --vs eagle31-2880-s1:eagle1-2880-s1
  --vs eagle31-2880:eagle3-2880 --vs eagle31-2880-s1:eagle3-2880-s1
  --vs eagle3-2880:eagle1-2880 --vs eagle31-2880-s1:eagle31-2880)
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  T|G) mode=$([ "$1" = T ] && echo sample || echo greedy) tag=$([ "$1" = T ] && echo t07 || echo greedy)
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes $mode --prompts code=$P/code-16-79.jsonl --out $R/ceiling11-$tag-code &
     .venv/bin/python scripts/tree_ceiling.py "${common[@]}" --modes $mode --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling11-$tag-chat &
     wait ;;
  M) med=("${base[@]}" --heads medusa-2880=$O/medusa-2880 --modes greedy,sample)
     .venv/bin/python scripts/tree_ceiling.py "${med[@]}" --prompts code=$P/code-16-79.jsonl --out $R/ceiling11-medusa-code &
     .venv/bin/python scripts/tree_ceiling.py "${med[@]}" --prompts chat=$P/chat-140-199.jsonl --out $R/ceiling11-medusa-chat &
     wait ;;
  *) echo "usage: ceiling11.sh T|G|M" >&2; exit 2 ;;
esac
