#!/usr/bin/env bash
# On the GPU machine, from the repository root: the runtime's models on CUDA
# through the dflex kernels (dflex-model-tests, TargetModelCuda.* and
# DrafterCuda.*):
#  - the tiny Qwen3 (heads of 128, sliding-window layers) and Qwen3.5 (gated
#    attention with heads of 64, gated-delta heads of 128) targets in bfloat16,
#    attention through attentionHook and gated delta through gatedDeltaHook,
#    against transformers on the same GPU: every layer's hidden states, plain
#    and packed rows (cu_seqlens), the final norm and the logits;
#  - a DFlash drafter (full, sliding-window, full layers) in bfloat16 through
#    BundleDrafterAttention on the example DFlash specs, forward, loss and
#    every parameter's gradient, against the independent PyTorch drafter
#    (python/drafter_reference.py) in float64 on the same GPU.
# test/gpu/runtime/run.sh calls it:
#   test/gpu/runtime/models.sh BUILD_DIR BUNDLES_DIR
# BUILD_DIR is a runtime build (configured here, or reconfigured, with
# -DDFLEX_BUILD_TESTS=ON when it has no model tests); BUNDLES_DIR holds
# model_specs/, dflash/ and dflash_sliding_window/, as
# scripts/prepare_gpu.sh makes them. Needs torch and transformers in python3.
# Prints one "[ gpu parity ]" line per model; exit status 0 only when every
# check ran and passed.
set -euo pipefail
build=${1:?usage: models.sh BUILD_DIR BUNDLES_DIR}
bundles=${2:?usage: models.sh BUILD_DIR BUNDLES_DIR}
for bundle in model_specs dflash dflash_sliding_window; do
  if [ ! -f "$bundles/$bundle/manifest.json" ]; then
    echo "models.sh: no bundle $bundles/$bundle (scripts/prepare_gpu.sh makes it)" >&2
    exit 2
  fi
done
has_model_tests() { [ -f "$build/build.ninja" ] && ninja -C "$build" -t targets all | grep '^dflex-model-tests:' >/dev/null; }
if ! has_model_tests; then
  if [ -f "$build/CMakeCache.txt" ]; then
    cmake -B "$build" -DDFLEX_BUILD_TESTS=ON
  else
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDFLEX_BUILD_COMPILER=OFF -DDFLEX_BUILD_TESTS=ON
  fi
fi
if ! has_model_tests; then
  echo "models.sh: $build has no dflex-model-tests even with -DDFLEX_BUILD_TESTS=ON" >&2
  exit 2
fi
ninja -C "$build" dflex-model-tests
bundles=$(cd "$bundles" && pwd)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
DFLEX_MODEL_BUNDLES=$bundles DFLEX_ATTENTION_BUNDLES=$bundles \
  "$build/test/runtime/models/dflex-model-tests" \
  --gtest_filter='TargetModelCuda.*:DrafterCuda.*' 2>&1 | tee "$log" || status=1
if grep -q '^\[  SKIPPED \]' "$log"; then
  echo "models.sh: checks were skipped (no CUDA device seen by LibTorch?)" >&2
  status=1
fi
echo
echo "== model parity on the GPU"
grep '^\[ gpu parity \]' "$log" || { echo "(no results)"; status=1; }
exit $status
