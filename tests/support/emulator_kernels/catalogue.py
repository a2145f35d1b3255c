"""What a micro-kernel is (a name, its arguments as the runtime packs them, its FlyDSL kernel
function and launch shape) and how it becomes a Build. No FlyDSL here: the host side reads it
too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mono_jit.templates.base import Argument, Build, LaunchShape
from mono_jit.templates.geometry import WAVE


@dataclass(frozen=True)
class MicroKernel:
    """One kernel function taking `arguments` in order (1-D tensors, the templates' kernarg ABI: a
    pointer and an i32 extent each), launched as `shape` says (by default one wave)."""

    name: str
    arguments: tuple[Argument, ...]
    kernel: Callable
    shape: LaunchShape = LaunchShape((1, 1, 1), (WAVE, 1, 1))

    def build(self) -> Build:
        """Its launcher and placeholders, made as the templates' are (templates/launch.py)."""
        from mono_jit.templates.launch import launcher, placeholders

        return Build(launcher(self.kernel, self.shape), placeholders(self.arguments))


def tensors(*specs: str) -> tuple[Argument, ...]:
    """Tensor arguments from "name:dtype" strings, in order."""
    return tuple(Argument.tensor(*spec.split(":"), "") for spec in specs)
