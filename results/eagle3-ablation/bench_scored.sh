#!/usr/bin/env bash
# Issue 16: the 360-step heads again after EAGLE-2 tree scores moved to the decoding temperature (greedy 0.5), same prompts and settings as bench_main.sh, nothing else on the machine.
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads medusa=$O/b360-medusa \
  --heads eagle1=$O/b360-eagle --heads eagle1-lr4e-3=$O/b360-eagle-lr4e-3 \
  --heads eagle31-lr4e-3=$O/b360-eagle31-lr4e-3 --heads eagle31-aux=$O/b360-eagle31-lr4e-3-aux \
  --limit 16 --max-new-tokens 128 \
  --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 3 \
  --vs eagle31-lr4e-3:eagle1 --vs eagle31-lr4e-3:eagle1-lr4e-3 --vs eagle1:medusa --vs eagle31-lr4e-3:medusa \
  --vs "medusa:prompt-lookup (3)" --out results/eagle3-ablation/bench-scored
