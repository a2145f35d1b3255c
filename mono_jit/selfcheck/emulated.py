"""Launching a cached code object on an emulated gfx950 through mono-jit's own runtime: the entry
is resolved from a cache (compiled on a miss), loaded by the emulator backend and launched with
the kernarg bytes `runtime/kernargs.pack` makes, exactly as the runner launches on HIP."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..config import Settings
from ..resolution import resolve
from ..runtime.backends import Backend, EmulatorBackend
from ..spec import Spec
from ..templates import get


def emulated_launcher(template: str, spec: Spec, settings: Settings,
                      backend: Backend | None = None) -> Callable[..., Any]:
    """A launcher taking the template's arguments in declaration order (like FlyDSL's) that runs
    the cached code object on an emulated device (or on `backend`: the selftest's GPU one);
    `.backend.last_report` holds the emulator's counters."""
    tpl = get(template)
    resolved = resolve(tpl, spec, settings=settings)
    backend = backend or EmulatorBackend()
    kernel = backend.load(tpl, spec, resolved.meta, resolved.hsaco)
    declared = tpl.arguments(spec)

    def launch(*values: Any) -> None:
        if len(values) != len(declared):
            raise TypeError(f"{template}: {len(values)} arguments, the template declares {len(declared)}")
        named = {}
        for argument, value in zip(declared, values):
            if argument.kind == "tensor" and value.numel() == 0:  # unread on this path: any empty tensor
                value = torch.empty(0, dtype=getattr(torch, argument.dtype))
            named[argument.name] = value
        backend.launch(kernel, named, 0)

    launch.backend = backend  # type: ignore[attr-defined]
    return launch
