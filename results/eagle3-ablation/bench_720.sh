#!/usr/bin/env bash
# Issue 16: the 720-step heads of stream720.sh side by side in one run, nothing else on the machine:
# 16 held-out code + 16 held-out chat prompts, 128 new tokens, greedy and T=0.7, bf16, 1 thread,
# each head's default tree (Medusa: its 32-draft tree; EAGLE: depth 6 / top-k 8 / 48 tokens; P-EAGLE:
# depth capped at K = 4), HF prompt lookup as the other baseline.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 --heads medusa=$O/b720-medusa \
  --heads eagle1=$O/b720-eagle --heads eagle3=$O/b720-eagle3 --heads eagle31=$O/b720-eagle31 \
  --heads eagle31-fullvocab=$O/b720-eagle31-fullvocab --heads p-eagle=$O/b720-peagle --limit 16 --max-new-tokens 128 \
  --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 3 \
  --vs eagle31:eagle1 --vs eagle3:eagle1 --vs eagle31-fullvocab:eagle1 --vs eagle1:medusa \
  --vs p-eagle:eagle31 --vs eagle31:medusa \
  --vs "medusa:prompt-lookup (3)" --out results/eagle3-ablation/bench-720
