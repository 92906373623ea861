#!/usr/bin/env bash
# `make demo`: how the GPT runs on a dp=2 x tp=2 mesh (its collectives), then training it on the
# embedded addition task for 1.5-6 minutes on 2 cores (README: measured; the loss falls, the held-out exact-match accuracy
# rises) into a run directory of its own, runs/demo-<time>, which keeps the metrics, the loss curve
# and the last step's checkpoint; then `shardwise generate` answers a few sums from that checkpoint
# and each answer is checked.
# Usage: demo.sh [SHARDWISE [TRAIN OPTIONS...]], e.g. `... build/bin/shardwise --steps 30` (the
# test's quick run).
set -euo pipefail
sw=${1:-build/bin/shardwise}
shift $(($# < 1 ? $# : 1))
here=$(dirname "$0")
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

# The run directory, named as `shardwise train` names one (runs/<config>-<time>, -2, -3, ... when
# taken) and chosen here so that the generation below finds this run's checkpoint.
stamp=$(date +%Y%m%d-%H%M%S)
run=runs/demo-$stamp
mkdir -p runs
for k in $(seq 2 100); do mkdir "$run" 2>/dev/null && break; run=runs/demo-$stamp-$k; done
ln -sfn "$(basename "$run")" runs/latest

step "What each rank runs: Megatron tensor parallelism + data parallelism, collectives per step" \
  "$sw" plan --config "$here/demo.toml" --summary
step "Training: 4 ranks as threads, dp=2 x tp=2, the embedded 3-digit addition task" \
  "$sw" train --config "$here/demo.toml" --run-dir "$run" "$@"

ckpt=$run/checkpoints/$(cat "$run/checkpoints/latest")
# Operands are uniform in 0-999 in training, so a short one (999+1, 48+952) is rare: after the full
# run the model gets the 3-digit sums here right and those two wrong.
sums=(123+456= 505+505= 864+519= 251+749= 372+418= 777+333= 999+1= 48+952=)
prompts=()
for s in "${sums[@]}"; do prompts+=(--prompt "$s"); done
printf '\n\033[1m== %s\033[0m\n$ %s\n' "Generation: the checkpoint answers a few sums (greedy; problems it may or may not have trained on)" \
  "$sw generate --checkpoint $ckpt --max-new-tokens 5 --prompt ${sums[0]} ..."
answers=$("$sw" generate --checkpoint "$ckpt" --max-new-tokens 5 "${prompts[@]}" 2>/dev/null)
right=0
while IFS= read -r line; do
  problem=${line%%=*}
  answer=${line#*=}
  expected=$((${problem%+*} + ${problem#*+}))
  if [ "$answer" = "$expected" ]; then
    right=$((right + 1)); printf '  %-14s right\n' "$line"
  else
    printf '  %-14s wrong (%s)\n' "$line" "$expected"
  fi
done <<< "$answers"
printf '%d of %d right. The run: %s (metrics.jsonl, loss_curve.svg, %s)\n' "$right" "${#sums[@]}" "$run" "$ckpt"
