#!/usr/bin/env bash
# Issue 16: EAGLE-3.1 at 360 steps with the two best single factors of the ablation combined (lr 4e-3, aux 4/8/11), 2 threads.
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS=2
run b360-eagle31-lr4e-3-aux demo-eagle31 360 train.lr=4e-3 "heads.options.aux_layer_ids=[4,8,11]"
cd <selfspec checkout>
.venv/bin/python scripts/benchmark.py --target demo --dtype fp32 --heads eagle31-lr4e-3-aux=out/abl/b360-eagle31-lr4e-3-aux \
  --limit 16 --max-new-tokens 128 --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 0 \
  --out results/eagle3-ablation/bench-aux
