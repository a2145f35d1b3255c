"""K2's standalone stage launches (kernel.build(spec, stages)) on the emulated gfx950.

Each is compiled in a worker as the gfx950 stage tests compile it (tests/k1_stages.py), loaded
by the emulator backend with the metadata a cache entry of it would carry, and launched with a
K2Run's arguments (tests/k2_harness.py); every buffer the run's address tables name (the
weights, the state) is registered as device memory for the launch, as kernel arguments are."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from k1_stages import compile_stages
from k2_harness import K2Run

from mono_jit.config import Settings
from mono_jit.hsaco import inspect_code_object
from mono_jit.runtime.backends import EmulatorBackend
from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.toolchain import compile_environment, resolve_toolchain
from mono_jit.workers import WorkerPool

StageLaunch = Callable[[K2Run], Any]


def emulated_stages(spec: Spec, stage_sets: Iterable[frozenset[int]]) -> list[StageLaunch]:
    """One launcher a stage set, compiled together (two workers); each runs its build on one
    emulated device (backend.last_report holds the counters) and returns the launch report."""
    sets = [tuple(sorted(s)) for s in stage_sets]
    env = compile_environment(resolve_toolchain(Settings()), spec.arch)
    with WorkerPool(2, env, compile_stages, timeout=600) as pool:
        outcomes = list(pool.run((i, ("k2", spec.as_dict(), s)) for i, s in enumerate(sets)))
    failed = [o for o in outcomes if o.status != "ok"]
    assert not failed, [(o.job_id, o.status, o.value) for o in failed]
    built = {o.job_id: o.value for o in outcomes}
    return [_launcher(spec, *built[i]) for i in range(len(sets))]


def _launcher(spec: Spec, hsaco: bytes, launches: list[dict]) -> StageLaunch:
    template = get("k2")
    meta = {"template": "k2", "kernels": [k.as_dict() for k in inspect_code_object(hsaco, spec.arch)],
            "launches": launches, "launch": template.launch_shape(spec).as_dict(),
            "arguments": [a.as_dict() for a in template.arguments(spec)]}
    backend = EmulatorBackend()
    kernel = backend.load(template, spec, meta, hsaco)

    def launch(run: K2Run) -> Any:
        tabled = {**run.weight_tensors, **run.state_tensors}
        added = [t for name, t in tabled.items() if backend.machine.register_new(t, name)]
        try:
            backend.launch(kernel, run.arguments(), 0)
        finally:
            for tensor in added:
                backend.machine.unregister(tensor)
        return backend.last_report

    return launch
