#!/usr/bin/env bash
# Issue 16 budget: Medusa, EAGLE-1, EAGLE-3.1 at 360 steps x 8 x 256 on the same data, fp32, 1 thread.
source "$(dirname "$0")/common.sh"
run b360-eagle31 demo-eagle31 360
run b360-eagle demo-eagle 360
run b360-medusa demo-medusa-regen 360
