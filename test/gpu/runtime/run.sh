#!/usr/bin/env bash
# On the GPU machine, from the repository root: the attention op against its
# CPU float64 reference on every example bundle (scripts/gpu_check.sh runs it):
#   test/gpu/runtime/run.sh BUILD_DIR BUNDLES_DIR
# BUILD_DIR is a runtime build (configured here if it is not one yet);
# BUNDLES_DIR holds one bundle per example, as scripts/prepare_gpu.sh makes
# them. Exit status 0 only when every check passes.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR BUNDLES_DIR}
bundles=${2:?usage: run.sh BUILD_DIR BUNDLES_DIR}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDFLEX_BUILD_COMPILER=OFF -DDFLEX_BUILD_TESTS=OFF
fi
ninja -C "$build" dflex_torch_ops
PYTHONUNBUFFERED=1 python3 test/gpu/runtime/attention_op_gpu.py \
  --library "$build/runtime/libdflex_torch_ops.so" --bundles "$bundles"
bash test/gpu/runtime/gated_delta.sh "$build" "$bundles"
