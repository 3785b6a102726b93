#!/usr/bin/env bash
# On a machine with MLIR: builds the compiler and compiles every example and
# benchmark spec into kernel bundles under .device/bundles (git-ignored), the
# folder the GPU machine receives (carry it) for scripts/gpu_check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DFLEX_BUILD_DIR:-$root/build}
"$root/scripts/build.sh" >/dev/null
rm -rf "$root/.device/bundles"
mkdir -p "$root/.device/bundles"
# The gated-delta op check (test/gpu/runtime/gated_delta.sh) also needs its test
# specs, the model check (test/gpu/runtime/models.sh) the target models' specs.
for spec in "$root"/examples/*.mlir "$root"/bench/specs/*.mlir \
            "$root"/test/runtime/gated_delta/gated_delta_specs.mlir \
            "$root"/test/runtime/models/target_model_specs.mlir; do
  "$build/bin/dflex-compile" "$spec" --arch sm_90a --arch sm_120 --quiet \
    -o "$root/.device/bundles/$(basename "$spec" .mlir)"
done
du -sh "$root/.device/bundles"
