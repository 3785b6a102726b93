#!/usr/bin/env bash
# On the GPU machine, from the repository root: builds the runtime half
# against the machine's LibTorch, runs every GPU correctness check and the
# benchmarks, and prints a short table last. Needs the bundles made by
# scripts/prepare_gpu.sh in .device/bundles and .device/bundles_sm120. Logs go
# to $OUT (or /tmp/dflex-gpu).
# DFLEX_SKIP_CHECKS=1 runs only the benchmarks, DFLEX_SKIP_BENCH=1 only the checks
# (the two halves fit one device call each); DFLEX_ONLY="name ..." runs only the
# steps named (after the build, which is skipped when every step named is a kernel
# harness's, which needs none); DFLEX_MASK_LENGTHS="1300,8192" picks the
# lengths of the user-mask benchmark; DFLEX_SANITIZE=1 adds
# compute-sanitizer memcheck and racecheck on both kernel harnesses.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
logs=${OUT:-/tmp/dflex-gpu}
mkdir -p "$logs"
jobs=$(nproc)
summary=()

# The steps that run a kernel harness alone (test/gpu), without the runtime.
harness_steps=(attention_kernels gated_delta_kernels attention_candidates_check attention_candidates
               attention_sanitizer gated_delta_sanitizer)
only_harness_steps() {
  local name
  [ -n "${DFLEX_ONLY:-}" ] || return 1
  for name in $DFLEX_ONLY; do [[ " ${harness_steps[*]} " == *" $name "* ]] || return 1; done
}

step() { # name command...
  local name=$1 start status
  shift
  if [ -n "${DFLEX_ONLY:-}" ] && [ "$name" != build ] && [[ " $DFLEX_ONLY " != *" $name "* ]]; then
    return 0
  fi
  if [ "$name" = build ] && only_harness_steps; then return 0; fi
  start=$(date +%s)
  if "$@" >"$logs/$name.log" 2>&1; then status=ok; else status=FAILED; fi
  summary+=("$(printf '%-28s %-7s %5ss' "$name" "$status" "$(($(date +%s) - start))")")
  echo "== $name: $status"
  tail -n 25 "$logs/$name.log"
}

# The machine has no package registry: where it lacks the headers of the
# libraries the build links (OpenSSL, ISA-L, yaml-cpp, CLI11, Gloo's headers), the Debian packages
# prepare_gpu.sh put in .device/debs are unpacked into .device/sysroot.
library_prefix() {
  local missing=()
  [ -f /usr/include/openssl/evp.h ] || missing+=(libssl)
  [ -f /usr/include/isa-l/crc.h ] || missing+=(libisal)
  [ -f /usr/include/yaml-cpp/yaml.h ] || missing+=(libyaml-cpp)
  [ -f /usr/include/CLI/CLI.hpp ] || missing+=(libcli11)
  [ -f /usr/include/gloo/algorithm.h ] || missing+=(libgloo-dev)
  [ "${#missing[@]}" -gt 0 ] || return 0
  rm -rf .device/sysroot && mkdir -p .device/sysroot
  for package in "${missing[@]}"; do
    for deb in .device/debs/"$package"*.deb; do dpkg -x "$deb" .device/sysroot; done
  done
  echo "-DCMAKE_PREFIX_PATH=$root/.device/sysroot/usr -DOPENSSL_ROOT_DIR=$root/.device/sysroot/usr" \
       "-Dyaml-cpp_DIR=$root/.device/sysroot/usr/lib/x86_64-linux-gnu/cmake/yaml-cpp" \
       "-DCLI11_DIR=$root/.device/sysroot/usr/share/cmake/CLI11"
}

build_runtime() {
  local tests=ON prefix
  prefix=$(library_prefix)
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
  # shellcheck disable=SC2086 # the prefix is a list of arguments
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDFLEX_BUILD_COMPILER=OFF $prefix \
        -DDFLEX_BUILD_TESTS=$tests || { tests=OFF; cmake -S . -B build-gpu -G Ninja $prefix \
        -DCMAKE_BUILD_TYPE=Release -DDFLEX_BUILD_COMPILER=OFF -DDFLEX_BUILD_TESTS=OFF; } &&
    ninja -C build-gpu -j "$jobs"
}

step build build_runtime
[ "${DFLEX_SKIP_CHECKS:-0}" = 1 ] || [ ! -d build-gpu/test ] || step runtime_tests ctest --test-dir build-gpu --output-on-failure -j 4 -E default_end_to_end
[ "${DFLEX_SKIP_CHECKS:-0}" = 1 ] || step attention_kernels make -C test/gpu/attention run BUILD_DIR="$root/build-gpu-attention"
[ "${DFLEX_SKIP_CHECKS:-0}" = 1 ] || [ ! -f test/gpu/gated_delta/Makefile ] ||
  step gated_delta_kernels make -C test/gpu/gated_delta run BUILD_DIR="$root/build-gpu-gdn"
[ "${DFLEX_SKIP_CHECKS:-0}" = 1 ] || [ ! -f test/gpu/runtime/run.sh ] ||
  step runtime_attention bash test/gpu/runtime/run.sh build-gpu .device/bundles
[ "${DFLEX_SANITIZE:-0}" = 0 ] ||
  step attention_sanitizer make -C test/gpu/attention sanitize BUILD_DIR="$root/build-gpu-attention"
[ "${DFLEX_SANITIZE:-0}" = 0 ] || [ ! -f test/gpu/gated_delta/Makefile ] ||
  step gated_delta_sanitizer make -C test/gpu/gated_delta sanitize BUILD_DIR="$root/build-gpu-gdn"
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_bench python3 bench/attention_bench.py build-gpu/runtime/libdflex_torch_ops.so .device/bundles ${DFLEX_BENCH_ARGS:-}
# The other examples, masks of the kinds users write, at a small and a training length.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_bench_masks python3 bench/attention_bench.py build-gpu/runtime/libdflex_torch_ops.so .device/bundles \
    --masks${DFLEX_MASK_LENGTHS:+=$DFLEX_MASK_LENGTHS}
# The sm_120 anchor: the portable kernels against flex limited to mma.sync, autotuned.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_bench_mma_sync python3 bench/attention_bench.py build-gpu/runtime/libdflex_torch_ops.so \
    .device/bundles --kernels portable --flex-mma-sync --flex-autotune
# The same as on an sm_120 card: flex's configs limited to what an sm_120 block holds (101,376 B of
# shared memory), dflex with sm_120's configs, both at sm_120's blocks per SM.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_bench_sm120 python3 bench/attention_bench.py build-gpu/runtime/libdflex_torch_ops.so \
    .device/bundles_sm120 --kernels portable --flex-mma-sync --flex-autotune --flex-sm120-occupancy
# Kernel candidates the runtime does not launch yet, against the library's kernels in the same
# call; each step runs only when named (DFLEX_ONLY="attention_candidates_check
# attention_candidates"). The first checks the row-kernel candidates
# (test/gpu/attention/row_kernel_candidates.cuh) on every case; the second times every backward
# with the library's row kernels, the candidates and the library's again, then runs the portable
# sweep at sm_120's occupancy.
candidate_harness=build-gpu-attention/attention_test
attention_candidates_check() {
  make -C test/gpu/attention BUILD_DIR="$root/build-gpu-attention" && "$candidate_harness" --check --row-kernel-candidates
}
attention_candidates() {
  local impl status=0
  make -C test/gpu/attention BUILD_DIR="$root/build-gpu-attention" || return 1
  for impl in sm90 portable; do
    "$candidate_harness" --time --impl "$impl" && "$candidate_harness" --time --impl "$impl" --row-kernel-candidates &&
      "$candidate_harness" --time --impl "$impl" || status=1
  done
  "$candidate_harness" --sweep --impl portable --sm120-occupancy || status=1
  return "$status"
}
for candidate_step in attention_candidates_check attention_candidates; do
  [[ " ${DFLEX_ONLY:-} " != *" $candidate_step "* ]] || step "$candidate_step" "$candidate_step"
done
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step train_bench python3 bench/train_bench.py build-gpu .device/bundles
# dflex-train against the PyTorch recipe on the same batches, side by side.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step recipe_bench python3 bench/recipe_bench.py build-gpu .device/bundles --changed-steps 2
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step recipe_bench_hybrid python3 bench/recipe_bench.py build-gpu .device/bundles --target hybrid
# The README's main job on the GPU: the embedded default, trained and evaluated there.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step default_run python3 examples/default/run_default.py --bin build-gpu/bin --work "$logs/default" \
    --bundles .device/bundles
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_profile python3 bench/attention_profile.py build-gpu/runtime/libdflex_torch_ops.so .device/bundles
# The mask whose op time is furthest from its kernels' time: where its host time goes.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_profile_document python3 bench/attention_profile.py build-gpu/runtime/libdflex_torch_ops.so \
    .device/bundles --mask document
# A mask whose kernels are short (8 query heads): the host's work per call shows.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] ||
  step attention_profile_chunked python3 bench/attention_profile.py build-gpu/runtime/libdflex_torch_ops.so \
    .device/bundles --mask chunked
# FLA's public source, fetched into a git-ignored folder for the side-by-side baseline.
[ "${DFLEX_SKIP_BENCH:-0}" = 1 ] || [ ! -d third_party_bench/fla-src ] ||
  step gated_delta_fla_bench python3 bench/gdn_fla_bench.py third_party_bench/fla-src

echo
echo "== tables"
grep -h '^|' "$logs/attention_bench.log" "$logs/attention_bench_masks.log" "$logs/attention_bench_mma_sync.log" \
  "$logs/attention_bench_sm120.log" "$logs/train_bench.log" "$logs/recipe_bench.log" "$logs/recipe_bench_hybrid.log" \
  "$logs/default_run.log" 2>/dev/null
grep -h -A8 '^| kernel' "$logs/attention_profile.log" "$logs/attention_profile_document.log" \
  "$logs/attention_profile_chunked.log" 2>/dev/null
grep -h '"impl": "fla"' "$logs/gated_delta_fla_bench.log" 2>/dev/null
grep -hiE 'ms|x ' "$logs/gated_delta_kernels.log" 2>/dev/null | tail -n 8
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
