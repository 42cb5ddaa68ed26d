#!/usr/bin/env bash
# Issue 16: Medusa, EAGLE-1 and EAGLE-3.1 at one training budget (120 steps x 8 x 256 tokens) on the same
# self-distilled demo data, fp32, one thread each, run one after another.
cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
common="target.dtype=fp32 data.path=out/demo-regen/train.jsonl data.eval_path=out/demo-regen/eval.jsonl train.max_steps=120 train.eval_every=60 train.save_every=0 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
for h in medusa-regen eagle eagle31; do
  echo "=== $h $(date -u)"
  .venv/bin/python train/train_heads.py --config configs/demo-$h.yaml $common output_dir=out/side/$h > out/side/train-$h.log 2>&1
  echo "=== $h rc=$? $(date -u)"
done
