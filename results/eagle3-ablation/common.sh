cd <selfspec checkout>
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
common="target.dtype=fp32 data.path=out/demo-regen/train.jsonl data.eval_path=out/demo-regen/eval.jsonl train.save_every=0 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps train.eval_every=$((steps<=120 ? 120 : 120)) output_dir=out/abl/$name "$@" > out/abl/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
