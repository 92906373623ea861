#!/usr/bin/env bash
# The project's Debian libraries for the GPU machine, which fetches nothing (docs/gpu.md):
#   tools/gpu_deps.sh download [DEBDIR]     apt-get download tools/gpu_debs.txt's packages (default .gpu_debs)
#   tools/gpu_deps.sh wheels [DEBDIR]       pip download tools/gpu_wheels.txt's pure-Python wheels into DEBDIR/wheels
#   tools/gpu_deps.sh pyvenv DEBDIR VENV    a venv seeing the system's packages (torch) with those wheels
#                                           installed offline (pip install --no-index --find-links)
#   tools/gpu_deps.sh unpack DEBDIR PREFIX  dpkg -x each .deb into PREFIX (never /) and write PREFIX/env.sh,
#                                           which sets the search paths into PREFIX and SHARDWISE_DEPS_CMAKE_ARGS
#   tools/gpu_deps.sh check PREFIX          every shared library the build links finds each library it
#                                           needs in PREFIX or in the base set every CUDA image has (libc,
#                                           libstdc++, libgcc_s, libz); names what is missing
#   tools/gpu_deps.sh selftest DEBDIR BUILD unpack into BUILD/prefix, check, configure the project with
#                                           CUDA on and this machine's own copies hidden from CMake,
#                                           build the CUDA layer and an object that reads each library; fail
#                                           if a compile or link line still names a system copy
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
arch=x86_64-linux-gnu

download() {
  local dir=${1:-.gpu_debs}
  mkdir -p "$dir"
  local pkgs
  pkgs=$(grep -v '^#' "$here/gpu_debs.txt" | grep -v '^$')
  (cd "$dir" && apt-get download -q $pkgs)
  echo "gpu_deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir"
}

wheels() {
  local dir=${1:-.gpu_debs}/wheels
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --platform any --python-version 3.10 \
    --implementation py --abi none -d "$dir" -r "$here/gpu_wheels.txt"
  local wrong="" w
  for w in "$dir"/*; do
    case "$w" in *-none-any.whl) ;; *) wrong="$wrong $(basename "$w")" ;; esac
  done
  [ -z "$wrong" ] || { echo "gpu_deps: not pure-Python wheels: $wrong" >&2; exit 1; }
  echo "gpu_deps: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
}

pyvenv() {
  local debdir=$1 venv=$2
  ls "$debdir"/wheels/*.whl >/dev/null 2>&1 || { echo "gpu_deps: no wheels in $debdir/wheels (run: make gpu-debs)" >&2; exit 2; }
  "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-index --find-links "$debdir/wheels" -r "$here/gpu_wheels.txt"
  "$venv/bin/python" - <<'PY'
import importlib.util, sys
import nanobind, pytest, scikit_build_core
have = {m: importlib.util.find_spec(m) is not None for m in ("numpy", "torch")}
print(f"gpu_deps: venv {sys.prefix}: nanobind {nanobind.__version__}, scikit-build-core {scikit_build_core.__version__}, "
      f"pytest {pytest.__version__}; from the system: " + ", ".join(f"{m} {'yes' if h else 'MISSING'}" for m, h in have.items()))
PY
}

unpack() {
  local debdir=$1 prefix=$2
  [ "$(cd "$prefix" 2>/dev/null && pwd || echo "$prefix")" != / ] || { echo "gpu_deps: refusing to unpack into /" >&2; exit 2; }
  ls "$debdir"/*.deb >/dev/null 2>&1 || { echo "gpu_deps: no .deb files in $debdir (run: tools/gpu_deps.sh download)" >&2; exit 2; }
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  for deb in "$debdir"/*.deb; do dpkg -x "$deb" "$prefix"; done
  local lib=$prefix/usr/lib/$arch
  cat > "$prefix/env.sh" <<ENV
# Written by tools/gpu_deps.sh unpack: the libraries unpacked into $prefix.
export PATH="$prefix/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread:$lib/openmpi/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export PKG_CONFIG_LIBDIR="$lib/pkgconfig:$prefix/usr/share/pkgconfig"
export SHARDWISE_DEPS_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$prefix/usr -DCMAKE_LIBRARY_PATH=$lib/openblas-pthread \
-DPKG_CONFIG_EXECUTABLE=$prefix/usr/bin/pkgconf -DMPI_CXX_HEADER_DIR=$lib/openmpi/include -DMPI_CXX_LIB_NAMES=mpi \
-DMPI_mpi_LIBRARY=$lib/openmpi/lib/libmpi.so -DCMAKE_BUILD_RPATH=$lib;$lib/openmpi/lib"
ENV
  echo "gpu_deps: unpacked $(ls "$debdir"/*.deb | wc -l) packages into $prefix (source $prefix/env.sh)"
}

check() {
  local prefix=$1 lib=$1/usr/lib/$arch missing=0
  local base=" libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libz.so.1 libpthread.so.0 libdl.so.2 librt.so.1 ld-linux-x86-64.so.2 "
  local roots=("$lib/openmpi/lib/libmpi.so" "$lib/libcrypto.so" "$lib/libxxhash.so" "$lib/libsentencepiece.so"
               "$lib/libsentencepiece_train.so" "$lib/libfmt.so" "$lib/openblas-pthread/libopenblas.so.0"
               "$prefix/usr/bin/pkgconf")
  local seen=" " queue=("${roots[@]}")
  while [ ${#queue[@]} -gt 0 ]; do
    local f=${queue[0]}
    queue=("${queue[@]:1}")
    [ -e "$f" ] || { echo "gpu_deps check: $f is missing from the prefix" >&2; missing=1; continue; }
    for need in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$base" in *" $need "*) continue ;; esac
      case "$seen" in *" $need "*) continue ;; esac
      seen="$seen$need "
      local found=""
      for d in "$lib" "$lib/openblas-pthread" "$lib/openmpi/lib"; do
        [ -e "$d/$need" ] && { found="$d/$need"; break; }
      done
      if [ -z "$found" ]; then
        echo "gpu_deps check: $need (needed by $(basename "$f")) is in neither the prefix nor the base set" >&2
        missing=1
      else
        queue+=("$found")
      fi
    done
  done
  [ $missing -eq 0 ] && echo "gpu_deps check: every library the build links resolves in $prefix or the base set"
  return $missing
}

# The configure of the GPU machine (tools/gpu_check.sh) and of the self-test: the prefix's
# env.sh sourced first; extra arguments go to cmake.
configure() {
  local src=$1 build=$2
  shift 2
  # shellcheck disable=SC2086  # SHARDWISE_DEPS_CMAKE_ARGS is a list of words without spaces
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDWISE_BUILD_BENCH=OFF \
    -DSHARDWISE_WITH_CUDA=ON $SHARDWISE_DEPS_CMAKE_ARGS "$@"
}

selftest() {
  local debdir=$1 build=$2
  rm -rf "$build/prefix"
  unpack "$debdir" "$build/prefix"
  check "$build/prefix"
  # shellcheck disable=SC1091
  source "$build/prefix/env.sh"
  rm -rf "$build/cmake"
  configure "$here/.." "$build/cmake" -DCMAKE_IGNORE_PREFIX_PATH="/usr;/;/usr/local" -DCMAKE_IGNORE_PATH="/usr/bin;/bin" \
    -DCMAKE_CXX_COMPILER="$(command -v g++)" -DCMAKE_MAKE_PROGRAM="$(command -v ninja)" \
    -DCMAKE_AR="$(command -v ar)" -DCMAKE_RANLIB="$(command -v ranlib)" \
    ${CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache}
  # The CUDA layer (nvcc, fmt) as a target; then one object per library's headers (MPI, xxHash and
  # OpenSSL, SentencePiece, GoogleTest), compiled alone (through ninja they would first build every
  # layer below them).
  nice cmake --build "$build/cmake" -j "${JOBS:-2}" --target shardwise_cuda
  local obj
  for obj in src/CMakeFiles/shardwise_comm.dir/shardwise/comm/mpi.cc.o \
             src/CMakeFiles/shardwise_ckpt.dir/shardwise/ckpt/checksum.cc.o \
             src/CMakeFiles/shardwise_data.dir/shardwise/data/tokenizer.cc.o \
             tests/CMakeFiles/test_core.dir/core/test_core.cc.o; do
    (cd "$build/cmake" && ninja -t commands "$obj" | tail -1 | nice sh -e) || { echo "gpu_deps selftest: $obj failed" >&2; return 1; }
  done
  local leaks
  leaks=$(grep -oE '(^|[ ;="]|-I|-L)/usr/(include|lib/x86_64-linux-gnu)/[^ ;"]*' "$build/cmake/build.ninja" \
            "$build/cmake/CMakeCache.txt" | grep -E 'openmpi|xxhash|openssl|sentencepiece|fmt|gtest|gmock|nlohmann|CLI|openblas' | sort -u || true)
  if [ -n "$leaks" ]; then
    echo "gpu_deps selftest: the build still reads this machine's copies:" >&2
    echo "$leaks" >&2
    return 1
  fi
  echo "gpu_deps selftest: configured and built against $build/prefix alone"
}

case "${1:-}" in
  download) download "${2:-}" ;;
  wheels) wheels "${2:-}" ;;
  pyvenv) [ $# -eq 3 ] || { echo "usage: $0 pyvenv DEBDIR VENV" >&2; exit 2; }; pyvenv "$2" "$3" ;;
  unpack) [ $# -eq 3 ] || { echo "usage: $0 unpack DEBDIR PREFIX" >&2; exit 2; }; unpack "$2" "$3" ;;
  check) [ $# -eq 2 ] || { echo "usage: $0 check PREFIX" >&2; exit 2; }; check "$2" ;;
  selftest) [ $# -eq 3 ] || { echo "usage: $0 selftest DEBDIR BUILD" >&2; exit 2; }; selftest "$2" "$3" ;;
  configure) shift; configure "$@" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
