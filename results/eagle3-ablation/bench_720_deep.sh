#!/usr/bin/env bash
# Issue 16: the 720-step EAGLE heads with a deeper EAGLE-2 tree (depth 10, top-k 8, 60 tokens; EAGLE-3's
# reference code drafts 60 tokens), greedy, same prompts and settings as bench_720.sh: on greedy code the
# default depth 6 caps τ at 7, which hides differences between heads.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 \
  --heads eagle1=$O/b720-eagle --heads eagle3=$O/b720-eagle3 --heads eagle31=$O/b720-eagle31 \
  --heads eagle31-fullvocab=$O/b720-eagle31-fullvocab --depth 10 --draft-top-k 8 --total-tokens 60 \
  --limit 16 --max-new-tokens 128 --modes greedy --threads 1 --verify-cost '' --prompt-lookup 0 \
  --vs eagle31:eagle1 --vs eagle3:eagle1 --vs eagle31-fullvocab:eagle1 --vs eagle31-fullvocab:eagle31 \
  --out results/eagle3-ablation/bench-720-deep
