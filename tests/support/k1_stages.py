"""Compiling K1's and K2's standalone stage launches (kernel.build(spec, stages)) in a worker,
as the gfx950 stage tests launch them. Not templates: they never enter the cache or prebuild."""

from __future__ import annotations

from mono_jit.config import Settings
from mono_jit.spec import Spec
from mono_jit.pipeline.toolchain import compile_environment, resolve_toolchain
from mono_jit.pipeline.workers import WorkerPool


STAGES = {"k1": range(1, 7), "k2": range(1, 20)}


def compile_stages(template: str, spec_data: dict, stages: tuple[int, ...]) -> tuple[bytes, list[dict]]:
    """(HSACO, launches) of the template's kernel holding only `stages`; runs inside a worker."""
    import importlib

    from mono_jit.pipeline.compile import compile_build

    build = importlib.import_module(f"mono_jit.templates.{template}.kernel").build
    return compile_build(build(Spec.from_dict(spec_data), frozenset(stages)))


def compile_without_wait(template: str, spec_data: dict, stages: tuple[int, ...], waitless: int | None) -> bytes:
    """HSACO of the template's kernel holding `stages`, built from its schedule with stage
    `waitless` (if any) made to wait on nothing (none of its waits): a wrong table, to see that
    the kernel's waits are the table's."""
    import importlib
    from dataclasses import replace

    from mono_jit.pipeline.compile import compile_build

    kernel = importlib.import_module(f"mono_jit.templates.{template}.kernel")
    schedule = tuple(replace(s, waits=()) if s.number == waitless else s for s in kernel.SCHEDULE)
    return compile_build(kernel.build(Spec.from_dict(spec_data), frozenset(stages), schedule))[0]


def polls_with_and_without_a_wait(spec: Spec, template: str, stages: tuple[int, ...], waitless: int) -> dict:
    """s_sleep counts (one per polling loop) of `stages` built from the template's schedule
    ("table") and from one where stage `waitless` waits on nothing ("waitless")."""
    from mono_jit.hsaco.isa import disassemble, find_objdump, instruction_counts

    env = compile_environment(resolve_toolchain(Settings()), spec.arch)
    jobs = {"table": None, "waitless": waitless}
    with WorkerPool(2, env, compile_without_wait, timeout=600) as pool:
        outcomes = list(pool.run((name, (template, spec.as_dict(), stages, w)) for name, w in jobs.items()))
    failed = [o for o in outcomes if o.status != "ok"]
    assert not failed, [(o.job_id, o.status, o.value) for o in failed]
    objdump = find_objdump(Settings())
    return {o.job_id: instruction_counts(disassemble(o.value, objdump))["s_sleep"] for o in outcomes}


def compile_each_stage(spec: Spec, template: str = "k1", jobs: int = 2) -> dict[int, tuple[bytes, list[dict]]]:
    env = compile_environment(resolve_toolchain(Settings()), spec.arch)
    with WorkerPool(jobs, env, compile_stages, timeout=600) as pool:
        outcomes = list(pool.run((stage, (template, spec.as_dict(), (stage,))) for stage in STAGES[template]))
    failed = [o for o in outcomes if o.status != "ok"]
    assert not failed, [(o.job_id, o.status, o.value) for o in failed]
    return {o.job_id: o.value for o in outcomes}
