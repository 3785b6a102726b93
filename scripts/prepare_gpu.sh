#!/usr/bin/env bash
# On a machine with MLIR: builds the compiler and compiles every example and
# benchmark spec into kernel bundles under .device/bundles (git-ignored), the
# folder the GPU machine receives (carry it) for scripts/gpu_check.sh, with
# the Debian packages of the build's libraries under .device/debs.
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
            "$root"/test/runtime/models/model_specs.mlir; do
  "$build/bin/dflex-compile" "$spec" --arch sm_90a --arch sm_120 --quiet \
    -o "$root/.device/bundles/$(basename "$spec" .mlir)"
done
# The attention specs again with sm_120's portable configs, at sm_120's
# occupancy, in an sm_90a binary: what an sm_120 card runs, measured on the
# sm_90 machine (gpu_check.sh's attention_bench_sm120).
rm -rf "$root/.device/bundles_sm120"
mkdir -p "$root/.device/bundles_sm120"
for spec in "$root"/examples/*.mlir "$root"/bench/specs/causal_d256.mlir; do
  grep -q dflex.attention "$spec" || continue
  "$build/bin/dflex-compile" "$spec" --arch sm_90a --portable-configs-of sm_120 --quiet \
    -o "$root/.device/bundles_sm120/$(basename "$spec" .mlir)"
done
# The Debian libraries the build links (scripts/setup.sh), for a GPU
# machine that has no package registry: gpu_check.sh unpacks them there when
# the machine lacks their headers.
rm -rf "$root/.device/debs"
mkdir -p "$root/.device/debs"
(cd "$root/.device/debs" && apt-get download -q libssl-dev libssl3 libisal-dev libisal2 libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev libgloo-dev 2>/dev/null)
du -sh "$root/.device/bundles" "$root/.device/bundles_sm120" "$root/.device/debs"
