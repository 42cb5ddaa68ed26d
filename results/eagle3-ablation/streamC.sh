#!/usr/bin/env bash
# Issue 16: the 360-step runs at lr 4e-3 (the ablation's best EAGLE-3.1 lr), EAGLE-3.1 and EAGLE-1.
source "$(dirname "$0")/common.sh"
run b360-eagle31-lr4e-3 demo-eagle31 360 train.lr=4e-3 &
sleep 5
while pgrep -f "output_dir=out/abl/e31-aux4-8-11" > /dev/null; do sleep 20; done
run b360-eagle-lr4e-3 demo-eagle 360 train.lr=4e-3
wait
