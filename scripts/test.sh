#!/usr/bin/env bash
# Sets up a fresh machine, builds both halves and runs every test:
# lit + FileCheck (dialect, examples, passes, codegen), GoogleTest units,
# runtime CPU tests, and the bad-input robustness sweep.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLEX_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh"
DFLEX_BUILD_DIR="$build" "$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "${DFLEX_JOBS:-$(nproc)}"
