#!/usr/bin/env bash
# Issue 16: EAGLE-3.1 at 360 steps, lr 4e-3 with the paper's 7 TTT steps, 2 threads (after tree scores at the decoding temperature).
source "$(dirname "$0")/common.sh"
export OMP_NUM_THREADS=2
run b360-eagle31-lr4e-3-ttt7 demo-eagle31 360 train.lr=4e-3 heads.options.ttt_steps=7
