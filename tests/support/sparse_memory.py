"""Host tensors larger than memory for the tests of 64-bit cache addressing: a byte tensor
mapped from a sparse file (a file of holes), so only the pages a test writes or reads take
memory or disk. The emulator registers it as any CPU tensor (its storage's pointer and size)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

GiB = 2**30


def sparse_bytes(path: Path, size: int) -> torch.Tensor:
    """A zero-filled uint8 tensor of `size` bytes, mapped (shared) from a new sparse file at `path`."""
    with open(path, "wb") as handle:
        os.truncate(handle.fileno(), size)
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
