#!/usr/bin/env bash
# The main job on its embedded default: set up, build, verify every shipped
# example and compile its kernels for sm_90a (H100/H200, with the Hopper
# kernels) and sm_120, then train a DFlash drafter end to end
# (examples/default/run_default.py: a small target made here, its answers to
# chat prompts, dflex-train, dflex-eval of the untrained and trained drafter).
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
python3 "$root/examples/default/run_default.py" --bin "$build/bin" --work "$build/default" \
  --bundles "$build/bundles"
