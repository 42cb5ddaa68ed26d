#!/usr/bin/env bash
# Issue 16, 2026-12-06 (2nd): all four head types at 5760 steps (stream.sh U, D, Q, V; seed 0, one build) in whole
# generations with infer.generate, on bench12.sh's 64 code + 60 chat held-out prompts, 128 new tokens, bf16, each
# head's default tree; code and chat side by side, one thread each. No argument: greedy; `sample`: T = 0.7,
# sampling seed 0 (SEED=n for another); `pool`: τ differences over sampling seeds 0-4 (results/eagle3-ablation/
# pool_seeds.py, a cluster bootstrap over prompts) into bench14-pooled.md.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
base=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --threads 1 --verify-cost ""
  --prompt-lookup 0)
four=(--heads medusa-5760=$O/medusa-5760 --heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
  --heads eagle31-5760=$O/eagle31-5760
  --vs eagle31-5760:eagle1-5760 --vs eagle31-5760:eagle3-5760 --vs eagle1-5760:medusa-5760)
if [ "$1" = pool ]; then
  for set in code chat; do
    for p in eagle31-5760:eagle1-5760 eagle31-5760:eagle3-5760 eagle1-5760:medusa-5760; do
      .venv/bin/python results/eagle3-ablation/pool_seeds.py ${p%:*} ${p#*:} \
        $(for s in 0 1 2 3 4; do echo $R/bench14-s$s-$set; done) || exit 1
      echo
    done
  done > $R/bench14-pooled.md
  exit
fi
case "$1" in
  "") mode=(--modes greedy) tag=greedy ;;
  sample) mode=(--modes sample --seed "${SEED:-0}") tag=s${SEED:-0} ;;
  *) echo "usage: bench14.sh [sample|pool]" >&2; exit 2 ;;
esac
.venv/bin/python scripts/benchmark.py "${base[@]}" "${four[@]}" "${mode[@]}" --prompts code=$P/code-16-79.jsonl \
  --out $R/bench14-$tag-code &
.venv/bin/python scripts/benchmark.py "${base[@]}" "${four[@]}" "${mode[@]}" --prompts chat=$P/chat-140-199.jsonl \
  --out $R/bench14-$tag-chat &
wait
