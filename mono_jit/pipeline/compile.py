"""The worker side of a build: trace and compile one template for one spec, return the HSACO.

Runs inside a compile worker (pipeline/workers.py) whose environment is already sanitised. Uses
``flyc.compile`` with CPU placeholders only: a direct jit call on a GPU-less machine launches,
so it loads libamdhip64 and aborts the process. The HSACO is read from FlyDSL's final MLIR (``_keepalive.ir``, a private
attribute: FlyDSL is pinned and tests cover this extraction), together with every
``gpu.launch_func``'s grid, block and dynamic LDS when they are constants.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..spec import Spec

if TYPE_CHECKING:
    from ..templates.base import Build


def _constant(value: Any) -> int | None:
    """The integer of an llvm.mlir.constant operand, None when it is computed at run time."""
    from flydsl._mlir import ir

    if value is None:
        return 0
    owner = value.owner
    if getattr(owner, "name", None) != "llvm.mlir.constant":
        return None
    return ir.IntegerAttr(owner.attributes["value"]).value


def extract(ir_text: str) -> tuple[bytes, list[dict]]:
    """(HSACO bytes, launches) from FlyDSL's final MLIR module text."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    binaries: list[bytes] = []
    launches: list[dict] = []

    def visit(op: Any) -> Any:
        if op.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            binaries.append(bytes(gpu.ObjectAttr(objects[0]).object))
        elif op.name == "gpu.launch_func":
            launch = op.opview
            launches.append({
                "kernel": ir.SymbolRefAttr(launch.kernel).value[-1],
                "grid": [_constant(launch.gridSizeX), _constant(launch.gridSizeY), _constant(launch.gridSizeZ)],
                "block": [_constant(launch.blockSizeX), _constant(launch.blockSizeY), _constant(launch.blockSizeZ)],
                "dynamic_lds": _constant(launch.dynamicSharedMemorySize),
            })
        return ir.WalkResult.ADVANCE

    with _create_mlir_context():
        ir.Module.parse(ir_text).operation.walk(visit)
    if len(binaries) != 1:
        raise RuntimeError(f"expected one gpu.binary in FlyDSL's artifact, found {len(binaries)}")
    return binaries[0], launches


def compile_build(build: "Build") -> tuple[bytes, list[dict]]:
    """(HSACO bytes, launches) of a traced launcher: ``flyc.compile`` with the build's CPU
    placeholders, then `extract`. The one compile path: templates and the emulator's FlyDSL
    micro-kernels (tests/support/emulator_kernels) both come through here."""
    import flydsl.compiler as flyc

    compiled = flyc.compile(build.launcher, *build.placeholders)
    if compiled is None:  # what a stray COMPILE_ONLY=1 does; the environment should prevent it
        raise RuntimeError("flyc.compile returned None (is COMPILE_ONLY set?)")
    return extract(compiled._keepalive.ir)


def load_compiler() -> None:
    """What every compile imports (FlyDSL's compiler, the templates), loaded once per worker
    before it forks its first job child (pipeline/workers.py), not once per job."""
    import flydsl.compiler  # noqa: F401

    from .. import templates  # noqa: F401


def compile_here(template_name: str, spec_data: dict) -> dict:
    """Trace + compile in this process; {'hsaco', 'launches', 'seconds'}. Called in a worker."""
    from ..templates import checks, get

    template = get(template_name)
    spec = Spec.from_dict(spec_data)
    started = time.perf_counter()
    build = template.build(spec)
    checks.match_build(f"{template_name}({spec})", template.arguments(spec), build)
    hsaco, launches = compile_build(build)
    return {"hsaco": hsaco, "launches": launches, "seconds": time.perf_counter() - started}
