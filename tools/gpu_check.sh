#!/usr/bin/env bash
# The one script a GPU machine runs (docs/gpu.md): unpacks the carried Debian libraries
# (.gpu_debs, from `make gpu-debs`) into a prefix, configures with CUDA on, builds the GPU tests
# (the gtest binaries labelled gpu), runs them, then builds the Python package with CUDA into a venv
# (the carried wheels, .gpu_debs/wheels, installed offline) and runs its GPU tests
# (python/tests_gpu: torch CUDA tensors in and out without copies), and writes under OUTDIR:
#   env.txt (date, card, driver, compilers), deps.log, configure.log, build.log, tests.log,
#   pyvenv.log, pybuild.log, pytests.log, and summary.txt (each step's status and time, the tests
#   passed / failed / skipped, which skipped), printing the summary last. Sized for 8 minutes on 16
# cores (the build stops at 5, the tests at 2) plus at most 6 for the Python package (its build, of
# every layer below it, stops at 5, its tests at 1).
#   tools/gpu_check.sh OUTDIR   (env: GPU_DEBS=.gpu_debs GPU_BUILD=/tmp/shardwise-gpu JOBS=nproc GPU_BUILD_TIMEOUT=300
#                                GPU_PY_BUILD_TIMEOUT=300)
set -uo pipefail
out=${1:?usage: tools/gpu_check.sh OUTDIR}
root=$(cd "$(dirname "$0")/.." && pwd)
debs=${GPU_DEBS:-$root/.gpu_debs}
build=${GPU_BUILD:-/tmp/shardwise-gpu}
jobs=${JOBS:-$(nproc)}
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
step build timeout "${GPU_BUILD_TIMEOUT:-300}" cmake --build "$build/cmake" -j "$jobs" --target "${targets[@]}" || finish 1
step tests timeout 120 ctest --test-dir "$build/cmake" -L gpu --output-on-failure --timeout 60 -j 4
tests_rc=$?
{
  grep -E 'tests passed|tests failed' "$out/tests.log" || echo "no ctest result line"
  skipped=$(grep -E '\*\*\*Skipped|Not Run' "$out/tests.log" | sed 's/^ *//' || true)
  [ -n "$skipped" ] && { echo "skipped (on a GPU machine each is a finding):"; echo "$skipped"; }
  grep -E '\*\*\*Failed|\*\*\*Exception|Timeout' "$out/tests.log" | sed 's/^ */failed: /' || true
} >> "$summary"

# The Python package, built over the same build folder (scikit-build-core reuses it), its GPU tests
# and the fake-device ones.
py=$build/pyvenv/bin/python
py_rc=1
step pyvenv "$root/tools/gpu_deps.sh" pyvenv "$debs" "$build/pyvenv" &&
  grep 'from the system' "$out/pyvenv.log" | sed 's/^gpu_deps: /python: /' >> "$summary"
# The package's build needs the Python headers (python3-dev); pybuild.log says when they are missing.
if [ -x "$py" ] && step pybuild timeout "${GPU_PY_BUILD_TIMEOUT:-300}" "$py" -m pip install --no-index \
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
[ "$tests_rc" -eq 0 ] && [ "$py_rc" -eq 0 ]
finish $?
