#!/usr/bin/env bash
# `make llama-demo`: a SentencePiece tokenizer trained on tests/data/fables.txt, a small Llama
# trained on the fables through it (examples/llama_tiny.toml, tp=2), then `shardwise generate`
# continues "The fox" with the checkpoint and prints the decoded text.
# Usage: llama_tiny.sh [SHARDWISE [RUN_DIR [TRAIN OPTIONS...]]], e.g. `... build/bin/shardwise
# /tmp/run --steps 2` (the test's quick run). RUN_DIR (default runs/llama_tiny) gets the tokenizer,
# the metrics and the checkpoints; earlier checkpoints there are removed first.
set -euo pipefail
sw=${1:-build/bin/shardwise}
run=${2:-runs/llama_tiny}
shift $(($# < 2 ? $# : 2))
here=$(cd "$(dirname "$0")" && pwd)
fables=$here/../tests/data/fables.txt
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

mkdir -p "$run"
rm -rf "$run/checkpoints" "$run/metrics.jsonl"
step "A SentencePiece tokenizer of 512 pieces, trained on the fables" \
  "$sw" tokenize --train-model --in "$fables" --vocab-size 512 --model-prefix "$run/tokenizer"
step "Training a Llama (4 heads over 2 kv heads, untied head) on the fables, tp=2" \
  "$sw" train --config "$here/llama_tiny.toml" --data "$fables" --tokenizer "$run/tokenizer.model" \
  --run-dir "$run" --progress none "$@"
ckpt=$run/checkpoints/$(cat "$run/checkpoints/latest")
step "Generation: the checkpoint continues \"The fox\" (greedy, KV cache of the kv heads, tp=2)" \
  "$sw" generate --checkpoint "$ckpt" --tokenizer "$run/tokenizer.model" --prompt "The fox" \
  --max-new-tokens 48 --mesh tp=2
