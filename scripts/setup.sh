#!/usr/bin/env bash
# Set up mono-jit on a fresh Debian 12 machine: Debian's lld-22 / llvm-22 (an ld.lld that links
# code object v6) and the AMDGPU device bitcode, then a venv at .venv with mono-jit installed
# editable with its build, test and emulate extras. Safe to run again.
#
# --with-vllm: also put vLLM 0.33.0 into the same venv, lean (its pure-Python dependencies from
# scripts/vllm-lean-requirements.txt, then vLLM with --no-deps, then no triton), for the tests in
# tests/vllm/ that drive vLLM's real DeepSeek-V4 decoder layer and mono decode hook on the CPU,
# and Debian's docker-registry, the OCI registry the registry tier's tests start on 127.0.0.1:
# everything the test suite needs (the main job needs neither).
set -euo pipefail
cd "$(dirname "$0")/.."

with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) with_vllm=1 ;;
    *) echo "usage: $0 [--with-vllm]" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
need=()
[ -x /usr/lib/llvm-22/bin/ld.lld ] || need+=(lld-22 llvm-22)
ls /usr/lib/*/amdgcn/bitcode/ocml.bc >/dev/null 2>&1 || need+=(rocm-device-libs)
# The registry tier's tests start Debian's OCI registry on 127.0.0.1 (tests/support/oci_registry.py).
[ "$with_vllm" = 0 ] || [ -x /usr/bin/docker-registry ] || need+=(docker-registry)
if [ ${#need[@]} -gt 0 ]; then
  # Wait (up to 10 min) for another apt / dpkg holding its locks instead of failing at once.
  apt=(apt-get -o DPkg::Lock::Timeout=600 -q)
  $SUDO "${apt[@]}" update
  DEBIAN_FRONTEND=noninteractive $SUDO "${apt[@]}" install -y "${need[@]}"
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check --upgrade pip
# torch first, its CPU build from PyTorch's CPU-only index (a bare "torch" from PyPI is a CUDA
# build of several GB); where that index cannot be reached, pip's configured index (a one-line
# notice says so). pyproject keeps torch unpinned for ROCm deployments.
.venv/bin/python -c "import torch" 2>/dev/null || bash scripts/install-torch.sh .venv/bin/python 2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[build,test,emulate]"

VLLM=0.33.0
if [ "$with_vllm" = 1 ]; then
  if .venv/bin/python -c "import sys, vllm; sys.exit(vllm.__version__ != '$VLLM')" 2>/dev/null; then
    echo "vLLM $VLLM already in .venv"
  else
    # The venv's own torch is pinned in the same command: vLLM's dependencies would otherwise
    # replace it (vLLM pins a CUDA torch 2.14.0).
    torch_pin="torch==$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])")"
    .venv/bin/pip install -q --disable-pip-version-check "$torch_pin" -r scripts/vllm-lean-requirements.txt
    .venv/bin/pip install -q --disable-pip-version-check --no-deps "vllm==$VLLM"
    # xgrammar pulls triton (about 1 GB); nothing the CPU tests import needs it.
    .venv/bin/pip uninstall -q -y triton
  fi
fi
echo "mono-jit set up in $(pwd)/.venv"
