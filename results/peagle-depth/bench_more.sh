#!/usr/bin/env bash
# Issue 16: after stream.sh D, EAGLE-1, EAGLE-3.1, P-EAGLE K = 8 and Medusa (720 steps each) on more held-out
# prompts, in one run: rows 16-79 of the demo's held-out prompts as code and rows 140-199 as chat (the sets of
# ../eagle3-ablation/bench_720_more.sh), 128 new tokens, greedy and T=0.7, bf16, 1 thread, each head's default tree.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/pd P=out/pd/prompts
mkdir -p $P
.venv/bin/python - <<'PY' || exit 1
import json
import demo
from bench.prompt_sets import demo_chat_prompts
from infer.prompts import read_prompts

src = demo.ensure_demo_data(size="full")["prompts"]
with open("out/pd/prompts/code-16-79.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in read_prompts(src)[16:80])
demo_chat_prompts(src, "out/pd/prompts/chat-140-199.jsonl", n=60, offset=140)
PY
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 \
  --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
  --heads medusa=$O/medusa --heads eagle1=$O/eagle1 --heads eagle31=$O/eagle31 --heads peagle8=$O/peagle8 \
  --limit 64 --max-new-tokens 128 --modes greedy,sample --threads 1 --verify-cost "" --prompt-lookup 0 \
  --vs eagle31:eagle1 --vs eagle1:medusa --vs peagle8:eagle31 --vs peagle8:eagle1 --vs peagle8:medusa \
  --out results/peagle-depth/bench-more
