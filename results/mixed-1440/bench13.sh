#!/usr/bin/env bash
# Issue 16, 2026-12-06: the three head types at 5760 steps (stream.sh D, Q, U; seed 0, one build) in whole
# greedy generations with infer.generate, on bench12.sh's 64 code + 60 chat held-out prompts, 128 new tokens,
# bf16, each head's default tree; one process on one thread, code then chat (it ran beside stream.sh S).
# No argument: greedy; `sample`: T = 0.7, sampling seed 0. `deep`: greedy, EAGLE-1 and plain EAGLE-3 with 4
# and with 7 TTT steps (stream.sh S) with ceiling13.sh D's depth-10, 60-token tree, code and chat side by
# side, one thread each; `deep-sample`: the same at T = 0.7, sampling seed 0.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
base=(--target out/bt/target --dtype bf16 --limit 64 --max-new-tokens 128 --threads 1 --verify-cost ""
  --prompt-lookup 0)
three=(--heads medusa-5760=$O/medusa-5760 --heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
  --vs eagle1-5760:medusa-5760 --vs eagle3-5760:eagle1-5760 --vs eagle3-5760:medusa-5760)
both_sets=(--prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl)
case "$1" in
  "") .venv/bin/python scripts/benchmark.py "${base[@]}" "${three[@]}" "${both_sets[@]}" --modes greedy \
        --out $R/bench13-greedy ;;
  sample) .venv/bin/python scripts/benchmark.py "${base[@]}" "${three[@]}" "${both_sets[@]}" --modes sample \
        --seed 0 --out $R/bench13-s0 ;;
  deep|deep-sample) deep=(--heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
          --heads eagle3-5760-ttt7=$O/eagle3-5760-ttt7 --vs eagle3-5760-ttt7:eagle1-5760
          --vs eagle3-5760-ttt7:eagle3-5760 --vs eagle3-5760:eagle1-5760
          --depth 10 --draft-top-k 8 --total-tokens 60)
     if [ "$1" = deep ]; then deep+=(--modes greedy) tag=deep; else deep+=(--modes sample --seed 0) tag=deep-s0; fi
     .venv/bin/python scripts/benchmark.py "${base[@]}" "${deep[@]}" --prompts code=$P/code-16-79.jsonl \
       --out $R/bench13-$tag-code &
     .venv/bin/python scripts/benchmark.py "${base[@]}" "${deep[@]}" --prompts chat=$P/chat-140-199.jsonl \
       --out $R/bench13-$tag-chat &
     wait ;;
  *) echo "usage: bench13.sh [sample|deep|deep-sample]" >&2; exit 2 ;;
esac
