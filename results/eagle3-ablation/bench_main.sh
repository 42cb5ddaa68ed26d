#!/usr/bin/env bash
# Issue 16: Medusa, EAGLE-1 and EAGLE-3.1 at one budget, 360 steps x 8 x 256 tokens (streamB.sh, streamC.sh),
# side by side with HF prompt lookup on 16 held-out code + 16 chat prompts, greedy and T=0.7, fp32, 1 thread.
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads medusa=$O/b360-medusa \
  --heads eagle1=$O/b360-eagle --heads eagle1-lr4e-3=$O/b360-eagle-lr4e-3 --heads eagle31=$O/b360-eagle31 \
  --heads eagle31-lr4e-3=$O/b360-eagle31-lr4e-3 --limit 16 --max-new-tokens 128 \
  --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 3 \
  --vs eagle31-lr4e-3:eagle1 --vs eagle31-lr4e-3:eagle1-lr4e-3 --vs eagle1:medusa --vs eagle31-lr4e-3:medusa \
  --vs "medusa:prompt-lookup (3)" --out results/eagle3-ablation/bench-main
