#!/usr/bin/env bash
# Issue 16: EAGLE-3.1 against EAGLE-1 (720 steps), T=0.7 then greedy, on more held-out prompts than bench_720.sh
# used, for a tighter interval on τ A - τ B: rows 16-79 of the demo's held-out prompts as code (bench_720.sh
# used rows 0-15) and rows 140-199 as chat (it used 100-115; training's checkpoint choice read 100-107).
# Same settings otherwise: 128 new tokens, bf16, 1 thread, per-prompt seeds.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/abl P=out/abl/prompts
mkdir -p $P
.venv/bin/python - <<'PY'
import json
import demo
from bench.prompt_sets import demo_chat_prompts
from infer.prompts import read_prompts

src = demo.ensure_demo_data(size="full")["prompts"]
with open("out/abl/prompts/code-16-79.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in read_prompts(src)[16:80])
demo_chat_prompts(src, "out/abl/prompts/chat-140-199.jsonl", n=60, offset=140)
PY
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 \
  --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
  --heads eagle1=$O/b720-eagle --heads eagle31=$O/b720-eagle31 \
  --limit 64 --max-new-tokens 128 --modes sample --threads 1 --verify-cost "" --prompt-lookup 0 \
  --vs eagle31:eagle1 --out results/eagle3-ablation/bench-720-more
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 \
  --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl \
  --heads eagle1=$O/b720-eagle --heads eagle31=$O/b720-eagle31 \
  --limit 64 --max-new-tokens 128 --modes greedy --threads 1 --verify-cost "" --prompt-lookup 0 \
  --vs eagle31:eagle1 --out results/eagle3-ablation/bench-720-more-greedy
