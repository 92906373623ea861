#!/usr/bin/env bash
# `make demo`: how the GPT runs on a dp=2 x tp=2 mesh (its collectives), then training it on the
# embedded addition task for about two minutes: the loss falls and the held-out exact-match
# accuracy rises; the log and the loss curve land in runs/demo/.
set -euo pipefail
sw=${1:-build/bin/shardwise}
here=$(dirname "$0")
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "What each rank runs: Megatron tensor parallelism + data parallelism, collectives per step" \
  "$sw" plan --config "$here/demo.toml" --summary
step "Training: 4 ranks as threads, dp=2 x tp=2, the embedded 3-digit addition task" \
  "$sw" train --config "$here/demo.toml"
