#!/usr/bin/env bash
# Issue 16: EAGLE-3.1 at 360 steps, lr 4e-3, the draft lm_head initialised from the target's rows (lm_head_init: target).
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS=1
run b360-eagle31-lr4e-3-lminit demo-eagle31 360 train.lr=4e-3 heads.options.lm_head_init=target
