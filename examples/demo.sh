#!/usr/bin/env bash
# `make demo` until the trainer exists: what the SPMD rules decide for the layers of a
# Megatron-style MLP on a dp=2 x tp=2 mesh, then the numerical proof of every rule.
set -euo pipefail
sw=${1:-build/bin/shardwise}
step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

step "Every SPMD rule and the ops it covers" "$sw" rules
step "Column-parallel linear: activations sharded on batch (dp), weight on its output dim (tp)" \
  "$sw" infer matmul --mesh dp=2,tp=2 --shapes 8x16,16x32 --placements "S(0),R;R,S(1)"
step "Row-parallel linear: the contraction dim is sharded, so the output is a Partial(sum)" \
  "$sw" infer matmul --mesh dp=2,tp=2 --shapes 8x32,32x16 --placements "S(0),S(1);R,S(0)"
step "Residual add of two partial sums stays partial: one all-reduce later instead of two" \
  "$sw" infer add --mesh dp=2,tp=2 --shapes 8x16,8x16 --placements "S(0),P(sum);S(0),P(sum)"
step "GELU cannot take a partial sum: the rule asks for the all-reduce first" \
  "$sw" infer gelu --mesh dp=2,tp=2 --shapes 8x16 --placements "S(0),P(sum)"
step "Mean over a sharded axis that splits evenly gives Partial(avg)" \
  "$sw" infer mean --mesh dp=2,tp=2 --shapes 8x16 --placements "S(0),S(1)" --attrs "axis=[1]"
step "Gradient of the row-parallel linear: dW is a Partial(sum) over dp" \
  "$sw" infer matmul --part grad --mesh dp=2,tp=2 --shapes 8x32,32x16 --placements "S(0),S(1);R,S(0);S(0),R"
step "Numerical proof: every rule on meshes [2], [3], [2,2], [2,3], every input placement" \
  "$sw" verify
