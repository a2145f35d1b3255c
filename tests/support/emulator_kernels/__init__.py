"""Known-answer micro-kernels of the emulator, written in FlyDSL with the templates' own helpers
and compiled through mono-jit's one compile path: a compile worker with the sanitised
environment (toolchain.compile_environment) running compiler.compile_build, as prebuild does.

`compile_all()` runs in the worker and returns plain data; `compile_in_worker()` is the host side
and gives a `Compiled` per kernel, which packs its kernargs with runtime/kernargs.pack and
launches on an emulated machine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mono_jit.config import Settings
from mono_jit.emulator import CodeObject, LaunchReport, Machine
from mono_jit.hsaco.metadata import inspect_code_object
from mono_jit.cache.meta import LaunchDims, StoredArgument
from mono_jit.templates.kernargs import DeclaredMeta, DeclaredTable, pack
from mono_jit.pipeline.toolchain import compile_environment, resolve_toolchain
from mono_jit.pipeline.workers import WorkerPool

ARCH = "gfx950"
MODULES = ("lanes", "conversions", "mfma", "memory")


@dataclass(frozen=True)
class Compiled:
    """One micro-kernel's code object, its launch shape and the metadata kernargs.pack reads."""

    name: str
    hsaco: bytes
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    meta: DeclaredMeta

    def code(self) -> CodeObject:
        return CodeObject(self.hsaco)

    def launch(self, machine: Machine, **values: Any) -> LaunchReport:
        """Pack `values` (argument name -> tensor or int) and run the kernel to completion; the
        caller registers the tensors."""
        return machine.launch(self.code(), self.grid, self.block, pack(self.meta, values))


def compile_all() -> dict[str, dict[str, Any]]:
    """Compile every micro-kernel in this process (a compile worker): name -> hsaco, launches,
    arguments."""
    from mono_jit.pipeline.compile import compile_build
    from mono_jit.templates.checks import match_build

    out = {}
    for module in MODULES:
        for kernel in importlib.import_module(f"{__name__}.{module}").KERNELS:
            build = kernel.build()
            match_build(kernel.name, kernel.arguments, build)
            hsaco, launches = compile_build(build)
            out[kernel.name] = {"hsaco": hsaco, "launches": launches,
                                "arguments": [a.as_dict() for a in kernel.arguments]}
    return out


def compile_in_worker(timeout: float = 600) -> dict[str, Compiled]:
    """Every micro-kernel compiled for gfx950 in one compile worker."""
    env = compile_environment(resolve_toolchain(Settings()), ARCH)
    with WorkerPool(1, env, compile_all, timeout) as pool:
        (outcome,) = pool.run([("micro-kernels", ())])
    if outcome.status != "ok":
        raise RuntimeError(f"compiling the micro-kernels failed ({outcome.status}): {outcome.value}")
    compiled = {}
    for name, result in outcome.value.items():
        (launch,) = result["launches"]
        kernels = tuple(DeclaredTable(k.args) for k in inspect_code_object(result["hsaco"], ARCH))
        arguments = tuple(StoredArgument.from_json(a) for a in result["arguments"])
        dims = LaunchDims.from_json(launch)
        meta = DeclaredMeta(name, arguments, kernels, dims)
        compiled[name] = Compiled(name, result["hsaco"], dims.grid, dims.block, meta)
    return compiled
