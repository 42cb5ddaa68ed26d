#!/usr/bin/env bash
# Issue 16: Medusa, EAGLE-1 and EAGLE-3.1 trained on ONE set that holds both formats the benchmark serves:
# the 4000 greedy text rows and the 3000 greedy chat answers of ../better-target-1440/ in one directory
# (train.data reads each file in its own format), 1440 steps x 8 sequences (up to 320 tokens) each, seed 0,
# on the better-trained target of ../better-target/, frozen in the demo's "fast" dtype. From a selfspec checkout:
#   PYTHONPATH=$PWD .venv/bin/python results/better-target/build_target.py out/bt/target
#   THREADS=2 bash results/better-target-1440/stream.sh R; THREADS=2 bash results/better-target-1440/stream.sh C
#   bash results/mixed-1440/stream.sh X                                                   # the mixed directories
#   bash results/mixed-1440/stream.sh A & bash results/mixed-1440/stream.sh B; wait       # one thread each
#   bash results/mixed-1440/stream.sh M
#   bash results/mixed-1440/stream.sh E & bash results/mixed-1440/stream.sh P; wait       # added 2026-12-04
#   bash results/mixed-1440/stream.sh T                                                   # beside ceiling5.sh
#   bash results/mixed-1440/stream.sh B & bash results/mixed-1440/stream.sh H; wait       # added 2026-12-04 (2nd)
#   bash results/mixed-1440/stream.sh e & bash results/mixed-1440/stream.sh h; wait       # (3rd), 720 steps
#   bash results/mixed-1440/stream.sh A & bash results/mixed-1440/stream.sh B; wait       # (4th), then seed 1:
#   bash results/mixed-1440/stream.sh a & bash results/mixed-1440/stream.sh b; wait       # beside ceiling9.sh
#   bash results/mixed-1440/stream.sh E & bash results/mixed-1440/stream.sh c; wait
#   bash results/mixed-1440/stream.sh L & bash results/mixed-1440/stream.sh K; wait       # added 2026-12-05: twice the
#   bash results/mixed-1440/stream.sh l & bash results/mixed-1440/stream.sh k; wait       # budget, beside ceiling10.sh
#   bash results/mixed-1440/stream.sh J & bash results/mixed-1440/stream.sh j; wait       # added 2026-12-05 (2nd), same
#   bash results/mixed-1440/stream.sh N &                                                 # build; ceiling11.sh G, T
#   bash results/mixed-1440/ceiling11.sh G; bash results/mixed-1440/ceiling11.sh T; wait  # run beside N
#   bash results/mixed-1440/stream.sh D & bash results/mixed-1440/stream.sh Q; wait       # added 2026-12-05 (3rd), same build
#   bash results/mixed-1440/stream.sh U & bash results/mixed-1440/stream.sh S; wait       # added 2026-12-06, same build
#   bash results/mixed-1440/stream.sh V & bash results/mixed-1440/stream.sh d; wait       # added 2026-12-06 (2nd), same build
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${THREADS:-1} OMP_WAIT_POLICY=PASSIVE
T=out/bt/target X=out/bt/mixed O=out/mix1440
common="target.name_or_path=$T target.dtype=fast data.path=$X/train data.eval_path=$X/eval data.max_length=320 train.save_every=0 train.eval_every=720 eval.measured_tau_prompts=8 eval.measured_tau_new_tokens=128 eval.measured_tau_prompts_file=demo eval.measured_tau_prompts_skip=100 overwrite=true"
mkdir -p $O/logs
run() {  # name config steps overrides...
  local name=$1 cfg=$2 steps=$3; shift 3
  echo "=== $name start $(date -u +%T)"
  .venv/bin/python train/train_heads.py --config configs/$cfg.yaml $common train.max_steps=$steps \
    output_dir=$O/$name "$@" > $O/logs/$name.log 2>&1
  echo "=== $name rc=$? end $(date -u +%T)"
}
case "$1" in
  X) for s in train eval; do
       mkdir -p $X/$s && cp out/bt/regen-4k/$s.jsonl $X/$s/text.jsonl && cp out/bt/regen-chat/$s.jsonl $X/$s/chat.jsonl || exit 1
     done
     wc -l $X/*/*.jsonl ;;
  A) run eagle31 demo-eagle31 1440 ;;
  B) run eagle1 demo-eagle 1440 train.lr=4e-3 ;;
  M) run medusa demo-medusa-regen 1440 ;;
  E) run eagle3 demo-eagle3 1440 heads.options.lm_head_init=target ;;  # plain EAGLE-3: EAGLE-3.1 less its two options
  P) run peagle demo-peagle 1440 ;;                                     # P-EAGLE: EAGLE-3.1 drafting 8 depths in one forward
  H) run eagle3-aux-hi demo-eagle3 1440 heads.options.lm_head_init=target 'heads.options.aux_layer_ids=[4,8,11]' ;;  # plain EAGLE-3, higher aux layers
  e) run eagle3-720 demo-eagle3 720 heads.options.lm_head_init=target ;;
  h) run eagle3-aux-hi-720 demo-eagle3 720 heads.options.lm_head_init=target 'heads.options.aux_layer_ids=[4,8,11]' ;;
  a) run eagle31-s1 demo-eagle31 1440 train.seed=1 ;;                  # A and B with another init and data order
  b) run eagle1-s1 demo-eagle 1440 train.lr=4e-3 train.seed=1 ;;
  c) run eagle3-s1 demo-eagle3 1440 heads.options.lm_head_init=target train.seed=1 ;;
  L) run eagle1-2880 demo-eagle 2880 train.lr=4e-3 train.eval_every=2880 ;;   # B and E at twice the steps (3.3 epochs),
  K) run eagle3-2880 demo-eagle3 2880 heads.options.lm_head_init=target train.eval_every=2880 ;;  # scored once, at the end
  l) run eagle1-2880-s1 demo-eagle 2880 train.lr=4e-3 train.eval_every=2880 train.seed=1 ;;
  k) run eagle3-2880-s1 demo-eagle3 2880 heads.options.lm_head_init=target train.eval_every=2880 train.seed=1 ;;
  J) run eagle31-2880 demo-eagle31 2880 train.eval_every=2880 ;;       # A at twice the steps, seeds 0 and 1,
  j) run eagle31-2880-s1 demo-eagle31 2880 train.eval_every=2880 train.seed=1 ;;  # on the build of L, K, l, k
  N) run medusa-2880 demo-medusa-regen 2880 train.eval_every=2880 ;;    # M at twice the steps
  D) run eagle1-5760 demo-eagle 5760 train.lr=4e-3 train.eval_every=5760 ;;   # L and K at four times the steps (6.6 epochs),
  Q) run eagle3-5760 demo-eagle3 5760 heads.options.lm_head_init=target train.eval_every=5760 ;;  # seed 0, on the build of L, K
  U) run medusa-5760 demo-medusa-regen 5760 train.eval_every=5760 ;;  # N at twice the steps: the third head type at D's budget
  S) run eagle3-5760-ttt7 demo-eagle3 5760 heads.options.lm_head_init=target train.eval_every=5760 heads.options.ttt_steps=7 ;;  # Q with the paper's 7 TTT steps
  V) run eagle31-5760 demo-eagle31 5760 train.eval_every=5760 ;;     # J at four times the steps: the recipe's EAGLE-3 head at D's budget
  d) run eagle1-5760-s1 demo-eagle 5760 train.lr=4e-3 train.eval_every=5760 train.seed=1 ;;  # D with seed 1
  T) run eagle31-ttt6 demo-eagle31 1440 heads.options.ttt_steps=6 ;;    # EAGLE-3.1 unrolled over the default tree's 6 depths
esac
