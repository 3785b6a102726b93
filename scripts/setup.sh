#!/usr/bin/env bash
# Installs everything dflex needs to build and test on a fresh Debian 12 machine.
# Idempotent: packages already present are left alone.
set -euo pipefail

APT_PACKAGES=(
  cmake ninja-build ccache g++ git python3
  libmlir-19-dev mlir-19-tools llvm-19-dev llvm-19-tools
  libgtest-dev libssl-dev libisal-dev libyaml-cpp-dev libcli11-dev libgloo-dev
)
TORCH_VERSION=2.11.0
PIP_PACKAGES=("torch==${TORCH_VERSION}" transformers safetensors numpy lit matplotlib tensorboard)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing apt packages: ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION}') else 1)" 2>/dev/null \
   || ! "$PY" -c "import transformers, safetensors, numpy, lit, matplotlib, tensorboard" 2>/dev/null; then
  echo "setup: installing PyPI packages: ${PIP_PACKAGES[*]}"
  "$PY" -m pip install -q "${PIP_PACKAGES[@]}"
fi
echo "setup: done"
