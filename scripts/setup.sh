#!/usr/bin/env bash
# Set up mono-jit on a fresh Debian 12 machine: Debian's lld-22 / llvm-22 (an ld.lld that links
# code object v6) and the AMDGPU device bitcode, then a venv at .venv with mono-jit installed
# editable with its test extra. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
need=()
[ -x /usr/lib/llvm-22/bin/ld.lld ] || need+=(lld-22 llvm-22)
ls /usr/lib/*/amdgcn/bitcode/ocml.bc >/dev/null 2>&1 || need+=(rocm-device-libs)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check --upgrade pip
# torch first, pinned to the CPU build these machines carry: a bare "torch" would pull a CUDA
# build of several GB. pyproject keeps torch unpinned for ROCm deployments.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
echo "mono-jit set up in $(pwd)/.venv"
