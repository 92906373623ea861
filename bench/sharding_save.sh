#!/usr/bin/env bash
# One checkpoint save of a stage-1 v2 Trainer on the 105.6 M-parameter GPT-2 of sharding_memory.sh
# (14 layers, hidden 768, vocab 8192, seq 128), ranks as threads of one process: the storage cache's
# extra peak bytes during the save and its time, two builds interleaved A B A B (issue 15 point 4).
#
#   bash bench/sharding_save.sh BUILD_A BUILD_B [MESHES] [ROUNDS] [DIR]
#
# BUILD_A / BUILD_B: build directories holding bench/bench_sharding_save (e.g. the commit before the
# range writer and this one). Each run also reports the process's peak RSS (/usr/bin/time -v).
A=$1; B=$2; MESHES=${3:-"dp=2 dp=4"}; ROUNDS=${4:-3}; DIR=${5:-/tmp/shardwise-sharding-save}
model="--layers 14 --hidden 768 --heads 12 --seq 128 --vocab 8192"
for mesh in $MESHES; do
  for round in $(seq 1 "$ROUNDS"); do
    for build in "$A" "$B"; do
      out=$( { OPENBLAS_NUM_THREADS=1 nice /usr/bin/time -v "$build/bench/bench_sharding_save" --mesh "$mesh" \
               --stage 1 --layout v2 --dir "$DIR" $model; } 2>&1 )
      echo "round $round $build: $(echo "$out" | grep 'save extra peak') peak_rss_kib=$(echo "$out" | grep 'Maximum resident' | grep -o '[0-9]*$')"
    done
  done
done
