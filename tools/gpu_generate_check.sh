#!/usr/bin/env bash
# `shardwise generate --device DEVICE` against `--device cpu` on the GPT-2 and Llama tiny
# checkpoints of tests/golden/hf (two prompts of different lengths, greedy, 8 new tokens), on one rank
# and on a pp=2 mesh (two threads, each stage's KV cache on the device): one line per model and mesh,
# "ok" when the tokens agree, "FAILED" with both outputs otherwise; exit 1 on any failure.
# tools/gpu_check.sh's generate_cuda step runs it with DEVICE cuda; `fake` runs it here.
#   tools/gpu_generate_check.sh SHARDWISE_BIN REPO_ROOT [DEVICE]
set -u
bin=$1 root=$2 device=${3:-cuda}
rc=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for model in gpt2_tiny llama_tiny; do
  for mesh in dp=1 pp=2; do
    args=(generate --checkpoint "$root/tests/golden/hf/$model" --prompt-ids '5,17,42,8;3,4' --max-new-tokens 8 --eos-id -1
          --mesh "$mesh")
    if ! cpu=$("$bin" "${args[@]}" --device cpu 2>"$err"); then
      echo "$model: FAILED on cpu on $mesh: $(cat "$err")"; rc=1; continue
    fi
    if ! dev=$("$bin" "${args[@]}" --device "$device" 2>"$err"); then
      echo "$model: FAILED on $device on $mesh: $(cat "$err")"; rc=1; continue
    fi
    if [ "$dev" = "$cpu" ]; then
      echo "$model: ok on $mesh, the same tokens on $device as on cpu: $(tr '\n' ' ' <<< "$dev")"
    else
      echo "$model: FAILED on $mesh, other tokens on $device: $(tr '\n' ' ' <<< "$dev")against cpu: $(tr '\n' ' ' <<< "$cpu")"
      rc=1
    fi
  done
done
exit $rc
