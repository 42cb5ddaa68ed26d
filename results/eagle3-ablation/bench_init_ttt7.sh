#!/usr/bin/env bash
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads eagle31-ttt7=out/abl/b360-eagle31-lr4e-3-ttt7   --heads eagle31-lminit=out/abl/b360-eagle31-lr4e-3-lminit --limit 16 --max-new-tokens 128   --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 0 --out results/eagle3-ablation/bench-init-ttt7
