#!/usr/bin/env bash
# The Debian libraries the GPU machine gets as .deb files (tools/gpu_deps.sh, docs/gpu.md): when
# .gpu_debs holds them (`make gpu-debs`), they unpack into a prefix; env.sh points pkg-config into
# it; every library the build links resolves there or in the base set; and `check` names a library
# removed from the prefix. Skipped (exit 77) where .gpu_debs is absent. The whole configure-and-build
# step against the prefix is `make gpu-deps-check` (minutes, not part of make test).
set -euo pipefail
root=$1
[ -n "$(ls "$root"/.gpu_debs/*.deb 2>/dev/null)" ] || { echo "no .gpu_debs here (make gpu-debs): skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/tools/gpu_deps.sh" unpack "$root/.gpu_debs" "$tmp/prefix"
(
  # shellcheck disable=SC1091
  source "$tmp/prefix/env.sh"
  flags=$(pkgconf --cflags --libs sentencepiece)
  case "$flags" in *"$tmp/prefix/usr/"*) ;; *) echo "pkg-config does not point into the prefix: $flags"; exit 1 ;; esac
)
"$root/tools/gpu_deps.sh" check "$tmp/prefix"
rm "$tmp/prefix/usr/lib/x86_64-linux-gnu/libhwloc.so.15"
if "$root/tools/gpu_deps.sh" check "$tmp/prefix" 2> "$tmp/err"; then
  echo "check missed the removed libhwloc.so.15"
  exit 1
fi
grep -q "libhwloc.so.15 (needed by libmpi.so)" "$tmp/err" || { cat "$tmp/err"; exit 1; }
echo "gpu_deps: unpack, env.sh and check pass; a removed library is named"
