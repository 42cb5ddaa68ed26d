#!/usr/bin/env bash
# Issue 16: after stream.sh A, B, M, E and F, the 1440-step Medusa, EAGLE-1 and EAGLE-3.1 heads on the
# better-trained target (EAGLE also trained on chat answers: -chat) side by side, on the 64 code + 60 chat held-out prompts of ../better-target/bench.sh (rows 16-79 of
# the demo's held-out prompts, chat rows 140-199; never trained on by the target or the heads), 128 new
# tokens, bf16, 1 thread, each head's default tree: greedy once, then T = 0.7 with two sampling seeds,
# pooled by prompt (../eagle3-ablation/pool_seeds.py).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/bt1440 P=out/bt/prompts R=results/better-target-1440
bash $R/prompts.sh || exit 1
common=(--target out/bt/target --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads medusa=$O/medusa --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31
  --heads eagle1-chat=$O/eagle1-chat --heads eagle31-chat=$O/eagle31-chat
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0
  --vs eagle31:eagle1 --vs eagle1:medusa --vs eagle31:medusa --vs eagle31-chat:eagle1-chat --vs eagle31-chat:eagle31
  --vs eagle1-chat:eagle1)
.venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench-greedy || exit 1
for s in ${SEEDS:-0 1}; do
  .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench-s$s || exit 1
done
for pair in eagle31:eagle1 eagle1:medusa eagle31:medusa eagle31-chat:eagle1-chat eagle31-chat:eagle31 eagle1-chat:eagle1; do
  .venv/bin/python results/eagle3-ablation/pool_seeds.py ${pair%:*} ${pair#*:} $(for s in ${SEEDS:-0 1}; do echo $R/bench-s$s; done) || exit 1
done > $R/bench-pooled.md
