#!/usr/bin/env bash
# Issue 16 ablation: EAGLE-3(.1) factors at 120 steps x 8 x 256 on the self-distilled demo data, fp32, 1 thread.
source "$(dirname "$0")/common.sh"
P="target.name_or_path=demo data.max_length=256 heads.options.draft_vocab_size=2048 train.num_epochs=1"
run peagle demo-eagle3-parallel 120 $P
run eagle3 demo-eagle3 120
run e31-ttt7 demo-eagle31 120 heads.options.ttt_steps=7
run e31-fullvocab demo-eagle31 120 heads.options.draft_vocab_size=null
run e31-lr1e-3 demo-eagle31 120 train.lr=1e-3
run e31-lr4e-3 demo-eagle31 120 train.lr=4e-3
run e31-aux4-8-11 demo-eagle31 120 "heads.options.aux_layer_ids=[4,8,11]"
