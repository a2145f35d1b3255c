"""Pure-torch reference of `vecadd`: the semantics the kernel must match, and the kernel
contract in torch that mono-jit's reference backend runs in its place (`run`)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from . import WIDTH


def vecadd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, elementwise, in f32."""
    return a.float() + b.float()


def run(values: Mapping[str, Any], spec: Any = None) -> None:
    """Write out[:m rows] = a + b over the named flat arguments, as a launch would (the build's
    spec is passed too; vecadd's shapes follow from its arguments)."""
    n = values["m"] * WIDTH
    values["out"][:n] = vecadd(values["a"][:n], values["b"][:n])
