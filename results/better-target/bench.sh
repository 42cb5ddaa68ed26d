#!/usr/bin/env bash
# Issue 16: after stream.sh A and B, Medusa, EAGLE-1 and EAGLE-3.1 on the better-trained target, in one run:
# the 64 code + 60 chat held-out prompts of ../peagle-depth/bench_more.sh (rows 16-79 of the demo's held-out
# prompts, chat rows 140-199; never trained on by the target or the heads), 128 new tokens, greedy and T=0.7,
# bf16, 1 thread, each head's default tree.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/bt P=out/bt/prompts
mkdir -p $P
.venv/bin/python - <<'PY' || exit 1
import json
import demo
from bench.prompt_sets import demo_chat_prompts
from infer.prompts import read_prompts

src = demo.ensure_demo_data(size="full")["prompts"]
with open("out/bt/prompts/code-16-79.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in read_prompts(src)[16:80])
demo_chat_prompts(src, "out/bt/prompts/chat-140-199.jsonl", n=60, offset=140)
PY
.venv/bin/python scripts/benchmark.py --target $O/target --dtype bf16 \
  --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
  --heads medusa=$O/medusa --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31 \
  --limit 64 --max-new-tokens 128 --modes greedy,sample --threads 1 --verify-cost "" --prompt-lookup 0 \
  --vs eagle31:eagle1 --vs eagle1:medusa --vs eagle31:medusa \
  --out results/better-target/bench
