#!/usr/bin/env bash
# The step-time model against measured steps on this machine (docs/planner.md; issue 33's first
# proof): `shardwise calibrate --mpi` first (this machine as it is now: calibrate takes medians; the
# MPI collectives between 2 processes too), then for each configuration `shardwise plan --predict`
# on that calibration (`--backend mpi` for the MPI rows) and a short `shardwise train`
# (threads, or MPI processes under mpirun), whose step time is the median difference of
# metrics.jsonl's elapsed_s between consecutive steps after the first 3. One kernel thread a rank
# (OPENBLAS_NUM_THREADS=1), as calibrate measures it. Each row records the load average (1 min) when
# its run started: the machine is shared, and a loaded machine slows runs of several ranks most.
# Then the `--auto` check: `plan --auto` over 2 devices for the GPT-2 job the 2-rank rows share
# (hidden 128, global batch 8), its pick measured like the rows, against the fastest measured row of
# that job.
# Prints per row: predicted, measured, error (predicted / measured - 1), load; then the median
# absolute error, Spearman's rank correlation of predicted and measured, and the --auto line.
#
#   bash bench/predict_vs_measured.sh [BUILD_DIR=build] [STEPS=10] [--no-calibrate]
set -euo pipefail
B=${1:-build}; STEPS=${2:-10}; CAL=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
sw="$B/bin/shardwise"
mpirun_cmd="mpirun --allow-run-as-root --oversubscribe --bind-to none"
base="--layers 2 --heads 4 --seq 128 --data $root/tests/data/fables.txt --eval-every 0 --progress none --warmup 0"
gpt="--hidden 128 --global-batch 8"  # the --auto job: 2-rank rows with this are its candidates
llama="--model llama --kv-heads 2 --hidden 128"
# "launcher|options": launcher "threads" or "mpi"
configs=(
  "threads|--mesh dp=1 --hidden 128 --global-batch 4"
  "threads|--mesh dp=1 --hidden 256 --global-batch 4"
  "threads|--mesh dp=1 --hidden 128 --global-batch 4 --recompute full"
  "threads|--mesh dp=2 $gpt"
  "threads|--mesh dp=2 $gpt --accumulation 2"
  "threads|--mesh dp=2 $gpt --sharding-stage 1"
  "threads|--mesh dp=2 $gpt --sharding-stage 2"
  "threads|--mesh dp=2 $gpt --sharding-stage 3"
  "threads|--mesh tp=2 $gpt"
  "threads|--mesh tp=2 $gpt --sp"
  "threads|--mesh pp=2 $gpt --accumulation 4 --schedule fthenb"
  "threads|--mesh pp=2 $gpt --accumulation 4 --schedule 1f1b"
  "threads|--mesh dp=2,tp=2 $gpt"
  "threads|--mesh dp=1 $llama --global-batch 4"
  "threads|--mesh tp=2 $llama --global-batch 4"
  "threads|--mesh dp=2 $llama --global-batch 8 --micro-batch 2"
  "threads|--mesh ep=2 $llama --experts 4 --global-batch 8"
  "mpi|--mesh dp=2 $gpt"
  "mpi|--mesh dp=2,tp=2 $gpt"
)
export OPENBLAS_NUM_THREADS=1
if [ "$CAL" != "--no-calibrate" ] || ! "$sw" calibrate --show > /dev/null 2>&1; then
  echo "calibrate at $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$sw" calibrate --mpi | tail -3
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# measure LAUNCHER OPTIONS: the median step of a short run (seconds)
measure() {
  local ranks
  ranks=$(python3 -c "import sys,math; m=sys.argv[1]; print(math.prod(int(p.split('=')[1]) for p in m.split(',')))" \
          "$(echo "$2" | sed -E 's/.*--mesh ([^ ]+).*/\1/')")
  rm -rf "$dir/run"
  # shellcheck disable=SC2086
  if [ "$1" = mpi ]; then
    $mpirun_cmd -np "$ranks" "$sw" train $base $2 --steps "$STEPS" --run-dir "$dir/run" > /dev/null
  else
    "$sw" train $base $2 --steps "$STEPS" --run-dir "$dir/run" > /dev/null
  fi
  python3 - "$dir/run/metrics.jsonl" <<'PY'
import json, statistics, sys
t = [json.loads(l)["elapsed_s"] for l in open(sys.argv[1]) if '"elapsed_s"' in l]
print(statistics.median([b - a for a, b in zip(t[3:], t[4:])]))
PY
}
rows="$dir/rows.tsv"
printf "%-8s %-82s %11s %11s %8s %5s\n" "ranks as" "configuration" "predicted s" "measured s" "error" "load"
for entry in "${configs[@]}"; do
  launcher=${entry%%|*}; c=${entry#*|}
  backend=$([ "$launcher" = mpi ] && echo mpi || echo threads)
  # shellcheck disable=SC2086
  pred=$("$sw" plan --predict --json --backend "$backend" $base $c | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])')
  load=$(cut -d' ' -f1 /proc/loadavg)
  meas=$(measure "$launcher" "$c")
  printf "%s\t%s\t%s\t%s\t%s\n" "$launcher" "$c" "$pred" "$meas" "$load" >> "$rows"
  printf "%-8s %-82s %11.5f %11.5f %8s %5s\n" "$launcher" "$c" "$pred" "$meas" \
    "$(python3 -c "print(f'{$pred / $meas - 1:+.1%}')")" "$load"
done
# --auto over 2 devices for the GPT-2 job, its pick measured.
# shellcheck disable=SC2086
pick=$("$sw" plan --auto --devices 2 --json --top 1 $base $gpt | python3 -c 'import json,sys; print(json.load(sys.stdin)["candidates"][0]["train_options"])')
auto_meas=$(measure threads "$pick $gpt")
python3 - "$rows" "$pick" "$auto_meas" "$gpt" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
pred = [float(r[2]) for r in rows]; meas = [float(r[3]) for r in rows]
err = [abs(p / m - 1) for p, m in zip(pred, meas)]
def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i]); r = [0.0] * len(v); i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]: j += 1
        for k in range(i, j + 1): r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r
rp, rm = ranks(pred), ranks(meas)
mp, mm = statistics.mean(rp), statistics.mean(rm)
cov = sum((a - mp) * (b - mm) for a, b in zip(rp, rm))
rho = cov / (sum((a - mp) ** 2 for a in rp) * sum((b - mm) ** 2 for b in rm)) ** 0.5
print(f"configurations: {len(rows)}; median absolute error: {statistics.median(err):.1%}; Spearman rank correlation: {rho:.3f}")
job = sys.argv[4]
two = [(float(r[3]), r[1]) for r in rows if r[0] == "threads" and job in r[1] and "," not in r[1].split("--mesh ")[1].split()[0]
       and r[1].split("--mesh ")[1].split()[0].endswith("=2")]
best = min(two)
auto = float(sys.argv[3])
print(f"--auto (2 devices, {job}) picks: {sys.argv[2]}; measured {auto:.5f} s; fastest measured row of the job: "
      f"{best[0]:.5f} s ({best[1]}); the pick is {auto / best[0] - 1:+.1%} from it")
PY
echo "done at $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)"
