#!/usr/bin/env bash
# On the GPU machine, from the repository root: the attention op against its
# CPU float64 reference on every example bundle, for each kernel family
# (portable, and sm90 on an sm_90 device), then the DFlash timing of each,
# the gated-delta op (gated_delta.sh), the models through the kernels
# (models.sh; needs a build with tests) and the device-side upload cache's
# GoogleTest (scripts/gpu_check.sh runs it):
#   test/gpu/runtime/run.sh BUILD_DIR BUNDLES_DIR [attention_op_gpu.py options]
# BUILD_DIR is a runtime build (configured here if it is not one yet);
# BUNDLES_DIR holds one bundle per example, as scripts/prepare_gpu.sh makes
# them (sm_90a + sm_120). Options, e.g. --kernels sm90 or --no-timing, go to
# attention_op_gpu.py. Exit status 0 only when every check passes.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR BUNDLES_DIR}
bundles=${2:?usage: run.sh BUILD_DIR BUNDLES_DIR}
shift 2
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLEX_BUILD_COMPILER=OFF -DDFLEX_BUILD_TESTS=OFF
fi
ninja -C "$build" dflex_torch_ops
PYTHONUNBUFFERED=1 python3 test/gpu/runtime/attention_op_gpu.py \
  --library "$build/runtime/libdflex_torch_ops.so" --bundles "$bundles" "$@"
bash test/gpu/runtime/gated_delta.sh "$build" "$bundles"
bash test/gpu/runtime/models.sh "$build" "$bundles"
# The op's uploads kept on the device (DeviceUploads.*, a GoogleTest that
# skips without a device; models.sh made the build a test build).
ninja -C "$build" dflex-attention-runtime-tests
uploads=$("$build/test/runtime/attention/dflex-attention-runtime-tests" --gtest_filter='DeviceUploads.*' 2>&1) ||
  { echo "$uploads"; exit 1; }
echo "$uploads" | grep -E '^\[ +(OK|SKIPPED|FAILED) +\]'
if echo "$uploads" | grep -q '^\[  SKIPPED \]'; then
  echo "run.sh: DeviceUploads.* skipped (no CUDA device seen by LibTorch?)" >&2
  exit 1
fi
