"""K2 code objects on the emulated gfx950: standalone stage launches (kernel.build(spec, stages),
compiled in a worker as the gfx950 stage tests compile them) and the whole K2 on 8 emulated
devices; the MoE weights of a sparse layer (384 experts, a few reachable, the rest torch.empty).
tests/emulator/test_emulated_k2.py uses it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Iterable, Sequence

import torch
from k1_stages import compile_stages
from k2_harness import K2Run

import layer_math
from mono_jit.config import Settings
from mono_jit.emulator import CodeObject, Launch, LaunchReport, Machine
from mono_jit.hsaco.metadata import inspect_code_object
from mono_jit.runtime.backends import declared_meta
from mono_jit.templates.kernargs import DeclaredMeta, DeclaredTable, pack
from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates.k2 import moe_reference as moe
from mono_jit.pipeline.toolchain import compile_environment, resolve_toolchain
from mono_jit.pipeline.workers import WorkerPool

EXPERTS = 384


@dataclass(frozen=True)
class K2Code:
    """One K2 code object (all stages or a subset) with the metadata kernargs.pack reads."""

    code: CodeObject
    meta: DeclaredMeta
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_lds: int

    @classmethod
    def of(cls, spec: Spec, hsaco: bytes, launches: list[dict]) -> "K2Code":
        template = get("k2")
        declared = declared_meta(template, spec)
        meta = replace(declared, kernels=tuple(DeclaredTable(k.args) for k in inspect_code_object(hsaco, spec.arch)))
        (launch,) = launches
        return cls(CodeObject(hsaco, launch["kernel"]), meta, tuple(launch["grid"]), tuple(launch["block"]),
                   launch["dynamic_lds"] or 0)

    def launch(self, values: dict, device: int = 0) -> Launch:
        """The launch of this code with argument values `values` on `device`."""
        return Launch(self.code, self.grid, self.block, pack(self.meta, values), self.dynamic_lds, device)


def compile_stage_sets(spec: Spec, stage_sets: Sequence[Iterable[int]]) -> list[K2Code]:
    """One code object a stage set, compiled in two workers."""
    sets = [tuple(sorted(s)) for s in stage_sets]
    env = compile_environment(resolve_toolchain(Settings()), spec.arch)
    with WorkerPool(2, env, compile_stages, timeout=900) as pool:
        outcomes = list(pool.run((i, ("k2", spec.as_dict(), s)) for i, s in enumerate(sets)))
    failed = [o for o in outcomes if o.status != "ok"]
    assert not failed, [(o.job_id, o.status, o.value) for o in failed]
    built = {o.job_id: o.value for o in outcomes}
    return [K2Code.of(spec, *built[i]) for i in range(len(sets))]


def register(machine: Machine, run: K2Run, prefix: str) -> dict:
    """Every buffer `run` hands the kernel, directly or through its address tables, as device
    memory (weights read-only); returns the argument values registered (launch with these)."""
    for name, tensor, writable in run.device_memory():
        machine.register_new(tensor, f"{prefix}.{name}", writable)
    return run.arguments()


def run_on_one_device(code: K2Code, run: K2Run) -> LaunchReport:
    """`code` on a fresh one-device machine with `run`'s buffers."""
    machine = Machine()
    return machine.launch_many([code.launch(register(machine, run, "r"))])


def stage_launchers(spec: Spec, stage_sets: Sequence[Iterable[int]]) -> list[Callable[[K2Run], LaunchReport]]:
    """One callable a stage set, compiled together: it runs that build on a fresh one-device
    machine with a K2Run's buffers and returns the launch report."""
    return [partial(run_on_one_device, code) for code in compile_stage_sets(spec, stage_sets)]


def run_on_ranks(code: K2Code, runs: Sequence[K2Run], timing: Any = None) -> LaunchReport:
    """`code` on one emulated device per run (rank order), launched together: the peers' mailboxes
    are host memory every device reaches; `timing` (a clock.trace.Clock) records the clock's trace."""
    machine = Machine(devices=len(runs))
    machine.timing = timing
    values = [register(machine, run, f"r{rank}") for rank, run in enumerate(runs)]
    return machine.launch_many([code.launch(v, rank) for rank, v in enumerate(values)])


def sparse_moe(live: Sequence[int], seed: int = 3) -> layer_math.Global:
    """A 384-expert MoE layer whose `live` experts alone hold weights and win every top-6 (bias
    +50 on them; the others' routed tensors are torch.empty and never read)."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(EXPERTS, generator=g) * 0.1
    bias[list(live)] += 50.0
    return layer_math._moe_weights(g, EXPERTS, live, bias)


def bf16_flips(got: torch.Tensor, want: torch.Tensor, name: str, share: float = 1e-3) -> None:
    """got equals want but for at most `share` of the values, each off by one bf16 ulp (an f32
    sum in another order rounding to the neighbour)."""
    error = (got.float() - want.float()).abs()
    ulp = torch.exp2(torch.floor(torch.log2(want.float().abs().clamp_min(2.0 ** -126))) - 7)
    assert (error <= ulp).all(), f"{name}: more than a bf16 ulp off (worst {error.max().item():.3g})"
    assert int((error > 0).sum()) <= share * error.numel(), f"{name}: {int((error > 0).sum())} values off"


def rank_moe_weights(w: layer_math.Global, rank: int) -> moe.MoeWeights:
    """Rank `rank`'s MoE weights after vLLM's loading."""
    return moe.MoeWeights(**layer_math.vllm_layout(w, rank))
