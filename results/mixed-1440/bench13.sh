#!/usr/bin/env bash
# Issue 16, 2026-12-06: the three head types at 5760 steps (stream.sh D, Q, U; seed 0, one build) in whole
# greedy generations with infer.generate, on bench12.sh's 64 code + 60 chat held-out prompts, 128 new tokens,
# bf16, each head's default tree; one process on one thread, code then chat (it ran beside stream.sh S).
# No argument: greedy; `sample`: T = 0.7, sampling seed 0.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
case "$1" in
  "") mode=(--modes greedy) out=$R/bench13-greedy ;;
  sample) mode=(--modes sample --seed 0) out=$R/bench13-s0 ;;
  *) echo "usage: bench13.sh [sample]" >&2; exit 2 ;;
esac
common=(--target out/bt/target --dtype bf16 "${mode[@]}" --limit 64 --max-new-tokens 128 --threads 1
  --verify-cost "" --prompt-lookup 0
  --heads medusa-5760=$O/medusa-5760 --heads eagle1-5760=$O/eagle1-5760 --heads eagle3-5760=$O/eagle3-5760
  --vs eagle1-5760:medusa-5760 --vs eagle3-5760:eagle1-5760 --vs eagle3-5760:medusa-5760)
.venv/bin/python scripts/benchmark.py "${common[@]}" --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
  --out $out
