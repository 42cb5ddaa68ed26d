#!/bin/bash
# The commands behind results/static-batch1/ (from the repository root; BASE: a copy of infer/ and heads/
# at commit b465f3a, the code before this change, e.g. `git archive b465f3a infer heads | tar -x -C $BASE`).
set -e
S=scripts/bench_batch1_sliding.py
O=results/static-batch1
PY="env HF_HUB_OFFLINE=1 /work/main/.venv/bin/python"
run() {  # run CODE ATTN ROUND
  if [ "$1" = before ]; then P=$BASE; else P=$PWD; fi
  PYTHONPATH=$P $PY $S --attn $2 --window 16 --new-tokens 256 --repeats 3 --out $O/generate-$2-$1-r$3.json
}
for round in 1 2 3 4; do  # the two code versions alternate, each first in every other round (the load drifts)
  for attn in sdpa eager; do
    if [ $((round % 2)) = 1 ]; then run before $attn $round; run after $attn $round
    else run after $attn $round; run before $attn $round; fi
  done
done
for attn in sdpa eager; do
  for prompt in 32 1024; do
    PYTHONPATH=$PWD $PY $S --layouts --attn $attn --window 16 --prompt $prompt --new-tokens 256 --repeats 5 \
      --out $O/layouts-$attn-prompt$prompt.json
  done
done
