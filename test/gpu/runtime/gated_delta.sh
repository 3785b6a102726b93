#!/usr/bin/env bash
# On the GPU machine, from the repository root: the gated-delta op on CUDA
# against its CPU float64 path, its GPU-only properties, the timing of
# B=1 T=16384 H=16 d=128 through the op (gated_delta_op_gpu.py), and the
# target-model hook on CUDA (GatedDeltaCuda.* of the runtime tests, when the
# build has tests). test/gpu/runtime/run.sh calls it:
#   test/gpu/runtime/gated_delta.sh BUILD_DIR BUNDLES_DIR [gated_delta_op_gpu.py options]
# BUNDLES_DIR holds qwen35_gdn/ (scripts/prepare_gpu.sh) and gated_delta_specs/,
# made where dflex-compile is built:
#   build/bin/dflex-compile test/runtime/gated_delta/gated_delta_specs.mlir \
#     --arch sm_90a --arch sm_120 -o BUNDLES_DIR/gated_delta_specs
# Exit status 0 only when every check passes.
set -euo pipefail
build=${1:?usage: gated_delta.sh BUILD_DIR BUNDLES_DIR}
bundles=${2:?usage: gated_delta.sh BUILD_DIR BUNDLES_DIR}
shift 2
for bundle in qwen35_gdn gated_delta_specs; do
  if [ ! -f "$bundles/$bundle/manifest.json" ]; then
    echo "gated_delta.sh: no bundle $bundles/$bundle (see the header of this script)" >&2
    exit 2
  fi
done
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLEX_BUILD_COMPILER=OFF -DDFLEX_BUILD_TESTS=OFF
fi
ninja -C "$build" dflex_torch_ops
PYTHONUNBUFFERED=1 python3 test/gpu/runtime/gated_delta_op_gpu.py \
  --library "$build/runtime/libdflex_torch_ops.so" --bundles "$bundles" "$@"
if ninja -C "$build" -t targets all | grep '^dflex-gated-delta-runtime-tests:' >/dev/null; then
  ninja -C "$build" dflex-gated-delta-runtime-tests
  DFLEX_GATED_DELTA_BUNDLES=$(cd "$bundles" && pwd) \
    "$build/test/runtime/gated_delta/dflex-gated-delta-runtime-tests" --gtest_filter='GatedDeltaCuda.*'
else
  echo "gated_delta.sh: NOT RUN: the model hook's GPU test (GatedDeltaCuda.*) needs a build with DFLEX_BUILD_TESTS=ON"
fi
