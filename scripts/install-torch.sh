#!/usr/bin/env bash
# Install torch VERSION's CPU build into the venv of PYTHON: from PyTorch's CPU-only package index
# (its CPU wheel is about 190 MB) when that index answers within 3 s, else, with a one-line notice,
# from pip's configured index (from PyPI that is the CUDA build, whose nvidia packages add several
# GB). A host that cannot reach the CPU index (a mirror, no outside network) loses at most the 3 s
# probe and one try: no retries.
#
# usage: install-torch.sh PYTHON VERSION   (TORCH_CPU_INDEX overrides the CPU-only index's URL)
set -euo pipefail
py=$1 version=$2
index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
pip=("$py" -m pip install -q --disable-pip-version-check)

if "$py" - "$index" 2>/dev/null <<'PROBE'
import sys
import urllib.error
import urllib.request

try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1].rstrip("/") + "/torch/", method="HEAD"), timeout=3)
except urllib.error.HTTPError:
    pass  # it answered: pip's own request finds out whether it has torch
PROBE
then
  # +cpu: the CPU index's own build, even where pip's configuration adds other indexes.
  if "${pip[@]}" --index-url "$index" --timeout 15 --retries 0 "torch==$version+cpu"; then
    exit 0
  fi
  why="installing from it failed"
else
  why="not reached within 3 s"
fi
echo "setup: PyTorch's CPU-only index $index: $why; installing torch==$version from pip's configured index" \
     "instead (from PyPI that is the CUDA build, several GB more)" >&2
"${pip[@]}" "torch==$version"
