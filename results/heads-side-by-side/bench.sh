#!/usr/bin/env bash
# Issue 16: the three heads trained at one budget (train.sh), side by side on held-out demo prompts.
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads medusa=out/side/medusa-regen \
  --heads eagle=out/side/eagle --heads eagle31=out/side/eagle31 --limit 16 --max-new-tokens 128 \
  --modes greedy,sample --threads 1 --verify-cost '' --vs eagle31:eagle --vs eagle:medusa --vs eagle31:medusa \
  --out results/heads-side-by-side/bench
