#!/usr/bin/env bash
# Issue 16 ablation: every 120-step EAGLE-3 variant on 16 held-out code + 16 chat prompts, greedy τ (timings not the point).
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads eagle31=out/side/eagle31 \
  --heads eagle3=$O/eagle3 --heads ttt7=$O/e31-ttt7 --heads fullvocab=$O/e31-fullvocab --heads lr1e-3=$O/e31-lr1e-3 \
  --heads lr4e-3=$O/e31-lr4e-3 --heads aux4-8-11=$O/e31-aux4-8-11 --heads peagle=$O/peagle \
  --limit 16 --max-new-tokens 128 --modes greedy --threads 1 --verify-cost "" --prompt-lookup 0 --no-time-split \
  --out results/eagle3-ablation/bench-ablation
