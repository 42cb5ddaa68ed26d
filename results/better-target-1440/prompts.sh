#!/usr/bin/env bash
# The 124 held-out prompts of bench.sh and ceiling.sh (those of ../better-target/bench.sh): rows 16-79 of the
# demo's held-out code prompts and chat rows 140-199, never trained on by the target or the heads.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
P=out/bt/prompts
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
