#!/usr/bin/env bash
# Issue 16: the heads of stream.sh side by side in one run, nothing else on the machine (bench-rerun/ is the
# first command again with --out results/peagle-depth/bench-rerun): 16 held-out code
# + 16 held-out chat prompts (never trained on by the target or the heads), 128 new tokens, greedy and
# T=0.7, bf16, 1 thread, HF prompt lookup as the other baseline. Trees: Medusa its default 32-draft tree;
# EAGLE-3.1 and P-EAGLE the EAGLE-2 default (top-k 8, 48 tokens, depth 6; P-EAGLE's depth is capped at its
# K, and peagle8's inference.json, written below, sets depth 8).
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/pd
.venv/bin/python -c "from infer.settings import write_settings; write_settings('$O/peagle8', {'depth': 8})" || exit 1
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 --heads medusa=$O/medusa \
  --heads eagle31=$O/eagle31 --heads peagle4=$O/peagle4 --heads peagle6=$O/peagle6 --heads peagle8=$O/peagle8 \
  --limit 16 --max-new-tokens 128 --modes greedy,sample --threads 1 --verify-cost '' --prompt-lookup 3 \
  --vs peagle6:peagle4 --vs peagle8:peagle6 --vs peagle6:eagle31 --vs peagle8:eagle31 --vs peagle6:medusa \
  --vs peagle8:medusa --vs eagle31:medusa --vs "medusa:prompt-lookup (3)" --out results/peagle-depth/bench
# peagle8 at depth 6 (the EAGLE-2 default: a copy of the heads without the inference.json) against depth 8,
# greedy, the same prompts, one run
rm -rf $O/peagle8-d6 && cp -r $O/peagle8 $O/peagle8-d6 && rm $O/peagle8-d6/inference.json || exit 1
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 --heads peagle8-d8=$O/peagle8 \
  --heads peagle8-d6=$O/peagle8-d6 --limit 16 --max-new-tokens 128 --modes greedy --threads 1 --verify-cost '' \
  --prompt-lookup 0 --vs peagle8-d8:peagle8-d6 --out results/peagle-depth/bench-depth
# after stream.sh C: K = 12 against K = 8 (each at depth K, its default now), with the default 48-token tree
# and a 64-token one, greedy and T=0.7, the same prompts, one run
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 --heads peagle8=$O/peagle8 --heads peagle12=$O/peagle12 \
  --total-tokens 48,64 --limit 16 --max-new-tokens 128 --modes greedy,sample --threads 1 --verify-cost '' \
  --prompt-lookup 0 --vs "peagle12 [48 tok]:peagle8 [48 tok]" --vs "peagle12 [64 tok]:peagle8 [64 tok]" \
  --vs "peagle8 [64 tok]:peagle8 [48 tok]" --out results/peagle-depth/bench-k12
# a wider root at T=0.7: EAGLE-3.1 and K = 8 with draft_top_k 16 (copies of the heads with that inference.json)
# against the default 8, the same 48 tokens, prompts and seeds, one run
for n in eagle31 peagle8; do rm -rf $O/$n-k16 && cp -r $O/$n $O/$n-k16 && rm -f $O/$n-k16/inference.json || exit 1; done
.venv/bin/python -c "from infer.settings import write_settings as w; w('$O/eagle31-k16', {'draft_top_k': 16}); w('$O/peagle8-k16', {'draft_top_k': 16})" || exit 1
.venv/bin/python scripts/benchmark.py --target demo --dtype bf16 --heads eagle31=$O/eagle31 --heads eagle31-k16=$O/eagle31-k16 \
  --heads peagle8=$O/peagle8 --heads peagle8-k16=$O/peagle8-k16 --limit 16 --max-new-tokens 128 --modes sample \
  --threads 1 --verify-cost '' --prompt-lookup 0 --vs eagle31-k16:eagle31 --vs peagle8-k16:peagle8 \
  --out results/peagle-depth/bench-topk16
