#!/usr/bin/env bash
# Issue 16, 2026-12-05 (2nd): Medusa, EAGLE-1, plain EAGLE-3 and EAGLE-3.1, all at the 2880-step budget and
# all on one build (seed 0 of each, stream.sh N, L, K, J), in whole generations with infer.generate, on
# bench.sh's 64 code + 60 chat held-out prompts, 128 new tokens, bf16, each head's default tree: greedy and
# T = 0.7 (sampling seed 0) as two processes side by side, one thread each (methods interleave per prompt
# inside each process, so the paired ratios compare like with like). `bench11.sh sample` then runs sampling
# seeds 1 and 2 side by side and pools seeds 0-2 into bench11-pooled.md; `bench11.sh sample2` adds seeds 3 and 4
# and pools seeds 0-4 into bench11-pooled-0-4.md.
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
O=out/mix1440 P=out/bt/prompts R=results/mixed-1440
bash results/better-target-1440/prompts.sh || exit 1
pairs="eagle31-2880:eagle1-2880 eagle3-2880:eagle1-2880 eagle1-2880:medusa-2880 eagle31-2880:eagle3-2880"
common=(--target out/bt/target --dtype bf16 --prompts code=$P/code-16-79.jsonl chat=$P/chat-140-199.jsonl
  --heads medusa-2880=$O/medusa-2880 --heads eagle1-2880=$O/eagle1-2880
  --heads eagle3-2880=$O/eagle3-2880 --heads eagle31-2880=$O/eagle31-2880
  --limit 64 --max-new-tokens 128 --threads 1 --verify-cost "" --prompt-lookup 0)
for p in $pairs; do common+=(--vs $p); done
new=
case "$1" in  # sample: seeds 1, 2, pooled with 0; sample2: seeds 3, 4, pooled with 0-2
  sample) new="1 2" last=2 pooled=$R/bench11-pooled.md ;;
  sample2) new="3 4" last=4 pooled=$R/bench11-pooled-0-4.md ;;
esac
if [ -n "$new" ]; then
  for s in $new; do .venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed $s --out $R/bench11-s$s & done
  wait
  dirs=$(for s in $(seq 0 $last); do echo $R/bench11-s$s; done)
  for p in $pairs; do
    .venv/bin/python results/eagle3-ablation/pool_seeds.py ${p%:*} ${p#*:} $dirs || exit 1
  done > $pooled
  exit
fi
.venv/bin/python scripts/benchmark.py "${common[@]}" --modes greedy --out $R/bench11-greedy &
.venv/bin/python scripts/benchmark.py "${common[@]}" --modes sample --seed 0 --out $R/bench11-s0 &
wait
