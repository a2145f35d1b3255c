"""What a micro-kernel is (a name, its arguments as the runtime packs them, its FlyDSL kernel
function and launch shape) and how it becomes a Build. No FlyDSL here: the host side reads it
too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mono_jit.templates.base import Argument, Build
from mono_jit.templates.geometry import WAVE


@dataclass(frozen=True)
class MicroKernel:
    """One kernel function taking `arguments` in order (1-D tensors, the templates' kernarg ABI: a
    pointer and an i32 extent each), launched on `grid` x `block`."""

    name: str
    arguments: tuple[Argument, ...]
    kernel: Callable
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (WAVE, 1, 1)

    def build(self) -> Build:
        """Its launcher and placeholders, made as the templates' are (templates/launch.py)."""
        from mono_jit.templates.launch import kernel_build

        return kernel_build(self.kernel, self.arguments, grid=self.grid, block=self.block)


def tensors(*specs: str) -> tuple[Argument, ...]:
    """Tensor arguments from "name:dtype" strings, in order."""
    return tuple(Argument.tensor(*spec.split(":"), "") for spec in specs)
