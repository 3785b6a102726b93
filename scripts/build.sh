#!/usr/bin/env bash
# Configures and builds dflex (both halves by default) into ${DFLEX_BUILD_DIR:-build}.
# Extra arguments go to cmake, e.g. -DDFLEX_BUILD_COMPILER=OFF on a machine without MLIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLEX_BUILD_DIR:-$root/build}
jobs=${DFLEX_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$build" -j "$jobs"
