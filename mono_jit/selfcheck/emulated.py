"""Launching a cached code object on an emulated gfx950 through mono-jit's own runtime: the entry
is resolved from a cache (compiled on a miss), loaded by the emulator backend and launched with
the kernarg bytes `runtime/kernargs.pack` makes, exactly as the runner launches on HIP."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from ..config import Settings
from ..pipeline.resolve import resolve
from ..runtime.backends import Backend, EmulatorBackend
from ..templates.kernargs import pack
from ..spec import Spec
from ..templates import get


def emulated_launcher(template: str, spec: Spec, settings: Settings, backend: Backend | None = None,
                      hsaco: bytes | None = None) -> Callable[..., Any]:
    """A launcher taking the template's arguments in declaration order (like FlyDSL's) that runs
    the cached code object (or `hsaco`, a variant of it such as a fence mutant) on an emulated
    device (or on `backend`: the selftest's GPU one); `.backend.last_report` holds the
    emulator's counters."""
    tpl = get(template)
    resolved = resolve(tpl, spec, settings=settings)
    backend = backend or EmulatorBackend()
    kernel = backend.load(tpl, spec, resolved.meta, resolved.hsaco if hsaco is None else hsaco)
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


class RanksLaunch:
    """Launches one cached code object on several emulated devices of one machine together (the
    ranks of a TP group: memory is shared, so peers' stores land where the others read). Each
    rank gives its argument values and the buffers it reaches through its tables (registered
    for the launch, weights read-only); `.backend.last_report` holds the last launch's counters."""

    def __init__(self, template: str, spec: Spec, settings: Settings) -> None:
        from ..emulator import CodeObject

        tpl = get(template)
        resolved = resolve(tpl, spec, settings=settings)
        self.meta = resolved.meta
        (launch,) = self.meta.launches
        self.code = CodeObject(resolved.hsaco, launch.kernel)
        self.backend = self  # what the selftest reads the counters from, as from a backend
        self.last_report: Any = None

    def __call__(self, ranks: Sequence[tuple[Mapping[str, Any], Iterable[tuple[str, Any, bool]]]]) -> Any:
        from ..emulator import Launch, Machine

        machine = Machine(devices=len(ranks))
        shape = self.meta.launch
        launches = []
        for device, (values, memory) in enumerate(ranks):
            for name, tensor, writable in memory:
                machine.register_new(tensor, name, writable)
            for name, value in values.items():
                if hasattr(value, "data_ptr"):
                    machine.register_new(value, f"r{device}.{name}")
            launches.append(Launch(self.code, shape.grid, shape.block, pack(self.meta, values),
                                   shape.dynamic_lds or 0, device))
        self.last_report = machine.launch_many(launches)
        return self.last_report
