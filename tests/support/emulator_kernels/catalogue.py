"""What a micro-kernel is (a name, its arguments as the runtime packs them, its FlyDSL launcher)
and how it becomes a Build. No FlyDSL here: the host side reads it too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mono_jit.templates.base import Argument, Build


@dataclass(frozen=True)
class MicroKernel:
    """One @flyc.jit launcher taking `arguments` in order (1-D tensors, the templates' kernarg
    ABI: a pointer and an i32 extent each)."""

    name: str
    arguments: tuple[Argument, ...]
    launcher: Any

    def build(self) -> Build:
        """The launcher with CPU placeholders: a small tensor of each dtype (extents are
        kernargs, not part of the code)."""
        return Build(self.launcher, tuple(torch.empty(64, dtype=getattr(torch, a.dtype)) for a in self.arguments))


def tensors(*specs: str) -> tuple[Argument, ...]:
    """Tensor arguments from "name:dtype" strings, in order."""
    return tuple(Argument.tensor(*spec.split(":"), "") for spec in specs)
