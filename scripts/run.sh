#!/usr/bin/env bash
# The main job on its embedded default: set up, build, then verify every
# shipped example and compile its kernels for sm_90a (H100/H200, with the
# Hopper kernels) and sm_120.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLEX_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
DFLEX_BUILD_DIR="$build" "$root/scripts/build.sh"
for example in "$root"/examples/*.mlir; do
  name=$(basename "$example" .mlir)
  "$build/bin/dflex-opt" "$example" -o /dev/null
  echo "verified  $name"
  if [ -x "$build/bin/dflex-compile" ]; then
    "$build/bin/dflex-compile" "$example" --arch sm_90a --arch sm_120 -o "$build/bundles/$name"
  fi
done
