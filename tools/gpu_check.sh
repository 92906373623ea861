#!/usr/bin/env bash
# The one script a GPU machine runs (docs/gpu.md): unpacks the carried Debian libraries
# (.gpu_debs, from `make gpu-debs`) into a prefix, configures with CUDA on, builds the GPU tests
# (the gtest binaries labelled gpu), runs them, and writes under OUTDIR:
#   env.txt (date, card, driver, compilers), deps.log, configure.log, build.log, tests.log, and
#   summary.txt (each step's status and time, the tests passed / failed / skipped, which skipped),
# printing the summary last. Then the device hooks, the Python package and the benchmark, each with
# its log: verify_cuda (the verifier on the CUDA kernels), generate_cuda (tools/gpu_generate_check.sh:
#   the tiny checkpoints' tokens on the GPU against the CPU) and curves (tools/gpu_curves.py: 20-step
#   curves on the GPU against the CPU), run when the shardwise binary has `verify --device` /
#   `generate --device` / `train --device`, and reported "not built yet" otherwise (the binary is built only when the CLI's
#   sources have a --device option); pyvenv, pybuild, pytests (the Python package built with CUDA
#   over the same build folder, the carried wheels of .gpu_debs/wheels installed offline, and its
#   GPU tests, python/tests_gpu: torch CUDA tensors in and out without copies, and a checkpoint
#   crossing between the GPU and the host bit for bit, both ways); bench
#   (bench/gpu_vs_torch.py: PyTorch eager and torch.compile against `shardwise train --device
#   cuda`), its table appended to summary.txt.
# Sized for 8 minutes on 16 cores (GPU_CHECK_BUDGET=470 s for all steps): the GPU tests' build stops
# at 200 s, their run at 60; the binary's build, the hooks and the Python package get what is left
# before the benchmark's GPU_BENCH_BUDGET (150 s), which gets what is left after them.
#   tools/gpu_check.sh OUTDIR   (env: GPU_DEBS=.gpu_debs GPU_BUILD=/tmp/shardwise-gpu JOBS=nproc
#                                GPU_BUILD_TIMEOUT=200 GPU_CHECK_BUDGET=470 GPU_BENCH_BUDGET=150
#                                GPU_PY_BUILD_TIMEOUT=300 PYTHON=python3)
set -uo pipefail
out=${1:?usage: tools/gpu_check.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
debs=${GPU_DEBS:-$root/.gpu_debs}
build=${GPU_BUILD:-/tmp/shardwise-gpu}
jobs=${JOBS:-$(nproc)}
budget=${GPU_CHECK_BUDGET:-470}
bench_budget=${GPU_BENCH_BUDGET:-150}
python=${PYTHON:-python3}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"

step() {  # step NAME COMMAND...: its output in OUTDIR/NAME.log, its status and time in the summary
  local name=$1 t=$SECONDS rc
  shift
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see $name.log)"), $((SECONDS - t)) s" >> "$summary"
  return $rc
}
finish() {
  echo "total: $SECONDS s" >> "$summary"
  echo "== gpu_check summary ($out)"
  cat "$out/env.txt" "$summary"
  exit "${1:-0}"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if command -v nvidia-smi > /dev/null; then
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  echo "nvcc: $(nvcc --version 2>&1 | tail -1)"
  echo "g++: $(g++ --version 2>&1 | head -1)"
  echo "cmake: $(cmake --version 2>&1 | head -1); ninja $(ninja --version 2>&1)"
} > "$out/env.txt"

step deps "$root/tools/gpu_deps.sh" unpack "$debs" "$build/prefix" || finish 1
# shellcheck disable=SC1091
source "$build/prefix/env.sh"
step configure "$root/tools/gpu_deps.sh" configure "$root" "$build/cmake" || finish 1
grep -E 'shardwise: (cuda layer|nccl backend)' "$out/configure.log" | sed 's/^-- //' >> "$summary"
targets=(test_cuda)
grep -q '^build tests/test_comm_nccl:' "$build/cmake/build.ninja" && targets+=(test_comm_nccl)
step build timeout "${GPU_BUILD_TIMEOUT:-200}" cmake --build "$build/cmake" -j "$jobs" --target "${targets[@]}" || finish 1
step tests timeout 60 ctest --test-dir "$build/cmake" -L gpu --output-on-failure --timeout 50 -j 4
tests_rc=$?
{
  grep -E 'tests passed|tests failed' "$out/tests.log" || echo "no ctest result line"
  skipped=$(grep -E '\*\*\*Skipped|Not Run' "$out/tests.log" | sed 's/^ *//' || true)
  [ -n "$skipped" ] && { echo "skipped (on a GPU machine each is a finding):"; echo "$skipped"; }
  grep -E '\*\*\*Failed|\*\*\*Exception|Timeout' "$out/tests.log" | sed 's/^ */failed: /' || true
} >> "$summary"

# The device hooks: the shardwise binary is built only when the CLI's sources name a --device
# option, in the time left before the benchmark's share; each hook runs when the binary has it.
bin=$build/cmake/bin/shardwise
left() { echo $((budget - SECONDS - bench_budget)); }
if grep -rq --include='*.cc' '"--device"' "$root"/src/shardwise/cli; then
  if [ "$(left)" -ge 60 ]; then
    step build_cli timeout $(($(left) - 30)) cmake --build "$build/cmake" -j "$jobs" --target shardwise || tests_rc=1
  else
    echo "build_cli: skipped, $(left) s left before the benchmark" >> "$summary"
  fi
fi
has_device() {  # has_device COMMAND: whether `shardwise COMMAND --help` lists --device
  [ -x "$bin" ] && "$bin" "$1" --help 2>/dev/null | grep -qE '^ *--device\b'
}
hook() {  # hook NAME COMMAND WHY-NOT PATTERN RUN...: the step when `shardwise COMMAND` has --device;
  # the last 8 lines of its log matching PATTERN go into the summary
  local name=$1 cmd=$2 why=$3 pattern=$4
  shift 4
  if ! has_device "$cmd"; then
    echo "$name: not built yet ($why)" >> "$summary"
  elif [ "$(left)" -lt 10 ]; then
    echo "$name: skipped, $(left) s left before the benchmark" >> "$summary"
  else
    step "$name" timeout "$(left)" "$@" || tests_rc=1
    grep -E "$pattern" "$out/$name.log" | tail -8 >> "$summary"
  fi
}
# verify's summary line counts the checks run on the GPU and those skipped, with why (ops without a
# CUDA kernel, attributes the bindings refuse); its FAIL lines name each failing op.
hook verify_cuda verify "shardwise verify has no --device option" '^(total:|FAIL )' \
  "$bin" verify --device cuda --quiet
hook generate_cuda generate "shardwise generate has no --device option" '^(gpt2|llama)_tiny:' \
  "$root/tools/gpu_generate_check.sh" "$bin" "$root" cuda
hook curves train "shardwise train has no --device option" 'ok|FAILED|failures' \
  "$python" "$root/tools/gpu_curves.py" "$bin" --b cuda

# The Python package, built over the same build folder (scikit-build-core reuses it), its GPU tests
# and the fake-device ones.
py=$build/pyvenv/bin/python
py_build_limit() { local l=$(($(left) - 30)) c=${GPU_PY_BUILD_TIMEOUT:-300}; echo $((l < c ? l : c)); }
py_rc=1
if [ "$(left)" -lt 90 ]; then
  echo "python: skipped, $(left) s left before the benchmark" >> "$summary"
  py_rc=0
else
  step pyvenv "$root/tools/gpu_deps.sh" pyvenv "$debs" "$build/pyvenv" &&
    grep 'from the system' "$out/pyvenv.log" | sed 's/^gpu_deps: /python: /' >> "$summary"
  # The package's build needs the Python headers (python3-dev); pybuild.log says when they are missing.
  if [ -x "$py" ] && step pybuild timeout "$(py_build_limit)" "$py" -m pip install --no-index \
       --no-build-isolation --no-deps -Cbuild-dir="$build/cmake" -Ccmake.define.SHARDWISE_WITH_CUDA=ON "$root"; then
    (cd "$build" && step pytests timeout 60 "$py" -m pytest -q -rs -p no:cacheprovider "$root/python/tests_gpu" \
       "$root/python/tests/test_device_arrays.py")
    py_rc=$?
    {
      tail -1 "$out/pytests.log" | sed 's/^/python tests: /'
      # test_device_arrays.py's one test for packages without CUDA skips here by design.
      grep -E '^SKIPPED.*tests_gpu' "$out/pytests.log" | sed 's/^/python skipped (on a GPU machine each is a finding): /' || true
      grep -E '^FAILED' "$out/pytests.log" | sed 's/^/python failed: /' || true
    } >> "$summary"
  fi
fi

# The benchmark against PyTorch, in what is left of the budget (its rows stop, saying so, past it).
bench_left=$((budget - SECONDS))
if ! "$python" -c 'import torch' > /dev/null 2>&1; then
  echo "bench: skipped, no PyTorch in $python" >> "$summary"
elif [ "$bench_left" -lt 20 ]; then
  echo "bench: skipped, $bench_left s left of the $budget s budget" >> "$summary"
else
  step bench timeout $((bench_left + 15)) "$python" "$root/bench/gpu_vs_torch.py" --budget "$bench_left" \
    --shardwise "$bin" --summary "$out/bench.txt" || tests_rc=1
  cat "$out/bench.txt" >> "$summary" 2> /dev/null
fi
[ "$tests_rc" -eq 0 ] && [ "$py_rc" -eq 0 ]
finish $?
