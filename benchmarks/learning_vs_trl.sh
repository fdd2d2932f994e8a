#!/usr/bin/env bash
# The same GRPO run in TRL and here, side by side (see docs/learning_vs_trl.md).
#
#   SFT=runs/arith_grpo bash benchmarks/learning_vs_trl.sh            # the full comparison
#   SFT=... SEEDS="0" STEPS=4 SAVE_EVERY=2 NUM_PROBLEMS=100 EVAL_SEEDS="0" \
#     OUT=docs/learning_vs_trl_pipeline_check PIPELINE_CHECK=1 bash benchmarks/learning_vs_trl.sh
#
# SFT: a run workdir or SFT phase checkpoint (the default run's). Our side runs in $VENV, TRL's
# in $VENV_TRL; the two training runs of a seed go one after the other, never at once.
# RESUME=1 keeps the stages of earlier invocations that ended (a long run can span several
# sittings). Every stage is pinned (taskset) to CPUS, by default the last core this shell may
# run on; each training process gets one thread per pinned core (ANCHOR_THREADS overrides):
# torch.set_num_threads on TRL's side, single-threaded XLA:CPU devices, one per core, on ours
# (learning_vs_trl.py child_env). `learning_vs_trl.py timed` records each training run's load
# average and a matmul probe before, during and after it; the report refuses to write the JSON
# when the load average passed 1.5 per pinned core (a loaded machine's wall times are noise).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/work/venv}
if [[ -z "${_LVT_PINNED:-}" ]]; then
  CPUS=${CPUS:-$("$VENV/bin/python" -c 'import os; print(max(os.sched_getaffinity(0)))')}
  _LVT_PINNED=1 exec taskset -c "$CPUS" bash "$0" "$@"
fi
: "${SFT:?set SFT to the SFT checkpoint (a run workdir or its checkpoints/sft)}"
VENV_TRL=${VENV_TRL:-/work/venv_trl}
WORK=${WORK:-runs/learning_vs_trl}
SEEDS=${SEEDS:-"0 1 2"}
STEPS=${STEPS:-200}
SAVE_EVERY=${SAVE_EVERY:-50}
NUM_PROBLEMS=${NUM_PROBLEMS:-200}
NUM_SAMPLES=${NUM_SAMPLES:-4}
EVAL_SEEDS=${EVAL_SEEDS:-"0 1 2"}
OUT=${OUT:-docs/learning_vs_trl}
OVERRIDES=${OVERRIDES:-"{}"}  # JSON {dotted config key: value}, applied to both sides
LABEL=${LABEL:-"GRPO, ours vs TRL: same SFT start, prompts, reward and hyper-parameters"}
read -ra seeds <<< "$SEEDS"
read -ra eval_seeds <<< "$EVAL_SEEDS"
PY=("$VENV/bin/python" benchmarks/learning_vs_trl.py)
PY_TRL=("$VENV_TRL/bin/python" benchmarks/learning_vs_trl.py)

mkdir -p "$WORK"
if [[ -z "${RESUME:-}" || ! -e "$WORK/sft_hf/config.json" ]]; then
  "$VENV/bin/jaxrl-reason" export --checkpoint "$SFT" --out "$WORK/sft_hf"
fi
"${PY[@]}" plan --workdir "$WORK" --model "$WORK/sft_hf" --steps "$STEPS" \
  --save_every "$SAVE_EVERY" \
  --seeds "${seeds[@]}" --overrides "$OVERRIDES"
# shellcheck disable=SC2207  # flags without spaces: --config.rl.batch_prompts=8 ...
ours_flags=($(cat "$WORK/ours_flags.txt"))

for seed in "${seeds[@]}"; do
  d="$WORK/seed$seed"
  mkdir -p "$d"
  # Each stage of a seed leaves a marker when it ends; a rerun with RESUME=1 skips the stages
  # that ended and redoes an interrupted one from scratch (its wall time is measured whole).
  [[ -n "${RESUME:-}" ]] || rm -f "$d"/*.done "$d"/*.timed.json "$d/eval.json"
  if [[ ! -e "$d/ours.done" ]]; then
    rm -rf "$d/ours" "$d/ours_hf" "$d/ours_hf.done" "$d/ours.timed.json"
    # Ours: RL straight from the exported SFT directory (our HF import), checkpoints every
    # SAVE_EVERY steps; the train command's own before/after evaluation is cut to one problem
    # (every checkpoint is evaluated below, alike for both sides).
    "${PY[@]}" timed --side ours --seed "$seed" --record "$d/ours.timed.json" -- \
      "$VENV/bin/jaxrl-reason" train --config configs/arith_grpo.py --workdir "$d/ours" \
      --config.hf_model="$WORK/sft_hf" --config.seed="$seed" --config.rl.steps="$STEPS" \
      --config.checkpoint.every_steps="$SAVE_EVERY" --config.checkpoint.max_to_keep=1000 \
      --config.eval.num_problems=1 --config.eval.num_samples=1 --config.eval.seeds='(0,)' \
      --config.log.progress_bar=False ${ours_flags[@]+"${ours_flags[@]}"} > "$d/ours.log" 2>&1
    touch "$d/ours.done"
  fi
  if [[ ! -e "$d/trl.done" ]]; then
    rm -rf "$d/trl" "$d/trl.timed.json"
    "${PY[@]}" timed --side trl --seed "$seed" --record "$d/trl.timed.json" -- \
      "${PY_TRL[@]}" trl --workdir "$WORK" --model "$WORK/sft_hf" --out "$d/trl" --seed "$seed" \
      > "$d/trl.log" 2>&1
    touch "$d/trl.done"
  fi
  if [[ ! -e "$d/ours_hf.done" ]]; then
    rm -rf "$d/ours_hf"
    "${PY[@]}" export-rl --workdir "$d/ours" --out "$d/ours_hf"
    touch "$d/ours_hf.done"
  fi
  models=("sft=$WORK/sft_hf")
  for ((k = SAVE_EVERY; k <= STEPS; k += SAVE_EVERY)); do
    models+=("ours_step_$k=$d/ours_hf/step_$k" "trl_step_$k=$d/trl/checkpoint-$k")
  done
  if [[ ! -e "$d/eval.json" ]]; then
    "${PY[@]}" eval --models "${models[@]}" --out "$d/eval.json.tmp" \
      --num_problems "$NUM_PROBLEMS" \
      --overrides "$OVERRIDES" \
      --num_samples "$NUM_SAMPLES" --eval_seeds "${eval_seeds[@]}"
    mv "$d/eval.json.tmp" "$d/eval.json"
  fi
done

"${PY[@]}" report --workdir "$WORK" --out "$OUT.json" --plot "$OUT.png" --label "$LABEL" \
  ${PIPELINE_CHECK:+--pipeline_check}
