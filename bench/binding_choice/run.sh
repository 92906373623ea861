#!/usr/bin/env bash
# Why the package binds with nanobind: the same three functions bound with nanobind and with
# pybind11, built with the same flags (-O2, as each project's CMake would for a Release module), then
# the call time from Python and the module size. Usage: bash bench/binding_choice/run.sh PYTHON
# (a Python with nanobind and pybind11 installed, e.g. build/py-venv after `pip install pybind11`).
set -euo pipefail
PY=${1:?usage: run.sh PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
ext=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
nb_inc=$("$PY" -c "import nanobind; print(nanobind.include_dir())")
nb_src=$("$PY" -c "import nanobind; print(nanobind.source_dir())")
pb_inc=$("$PY" -c "import pybind11; print(pybind11.get_include())")
flags="-O2 -shared -fPIC -std=c++20 -fvisibility=hidden -I$inc"
# nanobind's own library, as nanobind_add_module(NB_STATIC) builds it (one translation unit here).
c++ $flags -I"$nb_inc" -I"$nb_src/../ext/robin_map/include" "$here/mod_nb.cc" "$nb_src/nb_combined.cpp" -o "$out/mod_nb$ext"
# The pybind11 module is mod_nb.cc with pybind11's spellings: the same code, bound the other way.
sed -e 's|nanobind/nanobind.h|pybind11/pybind11.h|; s|nanobind/stl/string.h|pybind11/stl.h|; /nanobind\/stl\/vector.h/d' \
    -e 's|namespace nb = nanobind;|namespace nb = pybind11;|; s|NB_MODULE(mod_nb, m)|PYBIND11_MODULE(mod_pb, m)|' \
    -e 's|def_rw|def_readwrite|' "$here/mod_nb.cc" > "$out/mod_pb.cc"
c++ $flags -I"$pb_inc" "$out/mod_pb.cc" -o "$out/mod_pb$ext"
strip "$out/mod_nb$ext" "$out/mod_pb$ext"
cd "$out" && "$PY" - <<'PYEOF'
import glob, os, timeit
import mod_nb, mod_pb
N = 200000
print(f"{'call':34} {'nanobind ns':>12} {'pybind11 ns':>12}")
for name, stmt in [("noop(1, 2, 3)", "m.noop(1, 2, 3)"), ("shape([8, 16, 4])", "m.shape(s)"),
                   ("placements([P, P], 'matmul')", "m.placements(p, 'matmul')")]:
    row = []
    for m in (mod_nb, mod_pb):
        env = {"m": m, "s": [8, 16, 4], "p": [m.Placement(), m.Placement()]}
        row.append(min(timeit.repeat(stmt, globals=env, number=N, repeat=5)) / N * 1e9)
    print(f"{name:34} {row[0]:12.0f} {row[1]:12.0f}")
for m in ("mod_nb", "mod_pb"):
    print(f"{m}: {os.path.getsize(glob.glob(m + '*.so')[0]) / 1024:.0f} KiB stripped")
PYEOF
rm -rf "$out"
