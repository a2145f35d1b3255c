"""The ways to run a template's launch on named arguments (the names `mono_jit.config.BACKENDS`
lists), behind one interface.

`hip` loads the cached code object and launches it with the kernarg buffer packed from the
entry's metadata. `reference` runs the template's torch reference (`run(arguments, spec)` of
its `reference_module`, the kernel contract in torch) on the same tensors: the runner's whole
path, from vLLM's tensors through the argument mapping to the outputs, then runs where there
is no GPU. `emulator` runs the cached code object on the emulated gfx950 (`mono_jit.emulator`)
with the same kernarg bytes. Each checks the arguments against the template's declaration the
same way (`kernargs.pack`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from mono_jit.cache.meta import EntryMeta, LaunchDims, StoredArgument

from ..config import BACKENDS
from ..hsaco.kernel_info import KernelArg
from ..spec import Spec
from ..templates import Template
from ..templates.kernargs import DeclaredMeta, DeclaredTable, KernargError, LaunchMeta, layout, pack
from .read_only import read_only_arguments

EXTERNAL_WAIT_MARGIN = 10.0  # seconds the emulator waits past a peer wait's bound before it calls a deadlock


@dataclass(frozen=True)
class Kernel:
    """One template build ready to launch: its metadata and the backend's handle for it."""

    template: str
    spec: Spec
    meta: LaunchMeta
    handle: Any  # hip.Function, or the reference's run function


class Backend(Protocol):
    name: str
    needs_cache: bool  # resolve entries from the cache (hip) or only the template (reference)

    def load(self, template: Template, spec: Spec, meta: LaunchMeta | None, hsaco: bytes | None) -> Kernel: ...

    def launch(self, kernel: Kernel, values: Mapping[str, Any], stream: int) -> None: ...

    def expose(self, name: str, memory: Any, writable: bool) -> None:
        """Make `memory` (a tensor the kernels reach only through an address table) reachable by
        every launch from now on."""

    def peers_elsewhere(self, wait_seconds: float) -> None:
        """The peer buffers are written by other processes; a launch may wait `wait_seconds` for them."""


def declared_meta(template: Template, spec: Spec) -> DeclaredMeta:
    """What the reference backend checks arguments against when no entry is loaded: the
    template's arguments, with the code-object table FlyDSL would give them."""
    table: list[KernelArg] = []
    offset = 0
    for argument in template.arguments(spec):
        parts = {"tensor": [("global_buffer", 8), ("by_value", 4)], "i64": [("by_value", 8)]}.get(
            argument.kind, [("by_value", 4)])
        for kind, size in parts:
            offset = -(-offset // size) * size
            table.append(KernelArg(offset, size, kind))
            offset += size
    shape = template.launch_shape(spec)
    arguments = tuple(StoredArgument.of(a) for a in template.arguments(spec))
    return DeclaredMeta(template.name, arguments, (DeclaredTable(tuple(table)),),
                        LaunchDims.of(shape))


def _one_launch(template: Template, meta: LaunchMeta | None) -> tuple[EntryMeta, str]:
    """A cache entry's meta and the one kernel it launches (the runner launches one)."""
    if not isinstance(meta, EntryMeta):
        raise KernargError(f"{template.name}: this backend launches cache entries; none was given")
    if len(meta.launches) != 1:
        raise KernargError(f"{template.name}: {len(meta.launches)} launches in its entry; the runner launches one")
    return meta, meta.launches[0].kernel


class HipBackend:
    """Launches cached HSACO through HIP on torch's current stream."""

    name = "hip"
    needs_cache = True

    def __init__(self) -> None:
        from .hip import Hip

        self.hip = Hip.get()

    def load(self, template: Template, spec: Spec, meta: LaunchMeta | None, hsaco: bytes | None) -> Kernel:
        meta, kernel = _one_launch(template, meta)
        layout(meta)  # checked at load: an entry whose table does not fit fails before any step
        if hsaco is None:
            raise KernargError(f"{template.name}: HIP launches code objects; none was given")
        return Kernel(template.name, spec, meta, self.hip.load(hsaco, kernel))

    def launch(self, kernel: Kernel, values: Mapping[str, Any], stream: int) -> None:
        shape = kernel.meta.launch
        self.hip.launch(kernel.handle, shape.grid, shape.block, shape.dynamic_lds, stream, pack(kernel.meta, values))

    def expose(self, name: str, memory: Any, writable: bool) -> None:
        pass  # every address the tables hold is reachable as it is

    def peers_elsewhere(self, wait_seconds: float) -> None:
        pass  # the kernel's own bounded wait is the only one


class ReferenceBackend:
    """Runs each template's torch reference on the arguments (no GPU, no cache needed)."""

    name = "reference"
    needs_cache = False

    def load(self, template: Template, spec: Spec, meta: LaunchMeta | None, hsaco: bytes | None) -> Kernel:
        module = importlib.import_module(template.reference_module_name())
        run: Callable[[dict[str, Any], Spec], None] | None = getattr(module, "run", None)
        if run is None:
            raise KernargError(f"{template.name}: its reference has no run() (the kernel contract in torch)")
        return Kernel(template.name, spec, meta or declared_meta(template, spec), run)

    def launch(self, kernel: Kernel, values: Mapping[str, Any], stream: int) -> None:
        pack(kernel.meta, values)  # the same argument checks as a real launch
        kernel.handle(dict(values), kernel.spec)

    def expose(self, name: str, memory: Any, writable: bool) -> None:
        pass  # every address the tables hold is reachable as it is

    def peers_elsewhere(self, wait_seconds: float) -> None:
        pass  # the kernel's own bounded wait is the only one


class EmulatorBackend:
    """Runs the cached code objects on an emulated gfx950 (`mono_jit.emulator`), one device per
    backend: every tensor argument is registered as device memory for the launch, the kernarg
    bytes are the ones a HIP launch would get. Needs the `emulate` extra."""

    name = "emulator"
    needs_cache = True

    def __init__(self, machine: Any = None, device: int = 0) -> None:
        from ..emulator import Machine

        self.machine = machine or Machine()
        self.device = device
        self.last_report: Any = None

    def load(self, template: Template, spec: Spec, meta: LaunchMeta | None, hsaco: bytes | None) -> Kernel:
        from ..emulator import CodeObject

        meta, kernel = _one_launch(template, meta)
        layout(meta)
        if hsaco is None:
            raise KernargError(f"{template.name}: the emulator runs code objects; none was given")
        return Kernel(template.name, spec, meta, CodeObject(hsaco, kernel))

    def expose(self, name: str, memory: Any, writable: bool) -> None:
        """Registered as device memory for good (weights read-only: a write into one faults)."""
        self.machine.register_new(memory, name, writable)

    def peers_elsewhere(self, wait_seconds: float) -> None:
        """One device per process: a launch waits on the other processes' stores in wall time,
        and gives up (Deadlock) only a little after the kernel's own bounded wait would trap."""
        self.machine.external_writers = True
        self.machine.external_wait_seconds = wait_seconds + EXTERNAL_WAIT_MARGIN

    def launch(self, kernel: Kernel, values: Mapping[str, Any], stream: int) -> None:
        kernarg = pack(kernel.meta, values)
        read_only = read_only_arguments(kernel.template)
        added = [value for name, value in values.items()
                 if hasattr(value, "data_ptr") and self.machine.register_new(value, name, name not in read_only)]
        try:
            shape = kernel.meta.launch
            self.last_report = self.machine.launch(kernel.handle, shape.grid, shape.block, kernarg,
                                                   shape.dynamic_lds, self.device)
        finally:
            for value in added:
                self.machine.unregister(value)


_BY_NAME: dict[str, Callable[[], Backend]] = {cls.name: cls for cls in (HipBackend, ReferenceBackend, EmulatorBackend)}


def backend(name: str) -> Backend:
    """The backend called `name`, one of the names `mono_jit.config.BACKENDS` lists."""
    if name not in _BY_NAME:
        raise ValueError(f"backend {name!r}: expected one of {', '.join(BACKENDS)}")
    return _BY_NAME[name]()
