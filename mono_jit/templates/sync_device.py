"""Hand-offs between the CTAs of one persistent launch, as device code (FlyDSL; kernel modules
only). The words' positions are sync_words.py's (pure Python, for layouts, the runner and tests).

A sync area is an int32 buffer: word 0 the epoch, word 1 the exit counter, word 2 the arrival
counter, then one flag per producer task. A launch reads the epoch once and tags every flag it
publishes with epoch + 1; the last CTA to leave advances the epoch, so flags never need
clearing, no host code runs between steps and every argument is a fixed device pointer
(HIP-graph safe). Flags written by an earlier step hold an older tag and read as "not yet".

Who owns the area: the runner allocates it zeroed, once, before any capture, and never writes
it again; a launch that failed (any HIP error) leaves it dirty, so the runner drops it with the
context. A dirty area is detected, not trusted: every CTA takes an arrival ticket when it
starts, and the last CTA to leave advances the epoch first and only then clears the arrival
and exit counters. A launch that was cut short (or an area never zeroed) leaves the arrival
counter above zero, so the next launch counts more arrivals than CTAs, and its last CTA to
leave (at least) traps (s_trap 2, the HSA trap ABI's llvm.trap: the wave halts and the queue
is put into its error state, which HIP reports as a failed launch; LLVM AMDGPUUsage, "Trap
Handler ABI"). A launch that ends normally has read no flag of an earlier launch; one that may
have, fails. tests/templates/k1/test_k1_protocol.py runs this on a model of the grid.

Ordering follows the AMDGPU memory model at agent scope: every producer thread fences (release,
agent) before the CTA barrier after which one thread stores the flag; a consumer spins on
agent-scope loads, then the CTA barriers and fences (acquire, agent) before it reads the data.
On gfx950 these are `buffer_wbl2 sc1` / `buffer_inv sc1` and `sc1` flag accesses (checked in
the ISA by the tests).
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm
from flydsl.expr import gpu

from ._dsl import dsl
from .sync_words import ARRIVE_WORD, EPOCH_WORD, EXIT_WORD
_AGENT = "agent"


def _read(ptr):
    return fx.generic_load(ptr, memory_order=fx.AtomicOrdering.Monotonic, syncscope=_AGENT)


def _write(ptr, value) -> None:
    fx.generic_store(ptr, value, memory_order=fx.AtomicOrdering.Monotonic, syncscope=_AGENT)


def trap_if(bad) -> None:
    """Halt the wave and put the queue into its error state (s_trap 2) when the i32 `bad`, read
    from the wave's first active lane, is not 0.

    Written as the instruction behind a scalar test, with no branch in the IR: FlyDSL builds
    without LLVM's trap-handler feature, under which llvm.trap lowers to s_endpgm (a silent
    exit that would leave the other CTAs waiting), and a trap block in the IR cost K1 some
    fifteen SGPRs (spills) where this costs none.
    """
    flag = fx.rocdl.readfirstlane(ir.IntegerType.get_signless(32), fx.Int32(bad).ir_value())
    llvm.inline_asm(None, [flag], "s_cmp_eq_u32 $0, 0\n\ts_cbranch_scc1 1\n\ts_trap 2", "s",
                    has_side_effects=True)


def step_tag(sync):
    """This launch's tag: the epoch + 1 (every thread reads the same word)."""
    return _read(fx.get_iter(sync) + EPOCH_WORD) + 1


@dsl
def publish(sync, flag, tag, tid) -> None:
    """Release this CTA's writes, then mark task flag `flag` done for this step."""
    fx.memory_fence(syncscope=_AGENT, ordering=fx.AtomicOrdering.Release)
    gpu.barrier()
    if tid == 0:
        _write(fx.get_iter(sync) + flag, tag)


@dsl
def wait(sync, first, count, tag, tid, stride: int = 1) -> None:
    """Block the CTA until the `count` flags first, first + stride, .. carry `tag`; acquire
    their data.

    One thread polls each flag, so count must not exceed the CTA's threads.
    """
    if tid < count:
        flag = fx.get_iter(sync) + first + tid * stride
        seen = _read(flag)
        while seen != tag:
            fx.rocdl.s_sleep(1)  # ~64 clocks between polls: less traffic on the flags' lines
            seen = _read(flag)
    gpu.barrier()
    fx.memory_fence(syncscope=_AGENT, ordering=fx.AtomicOrdering.Acquire)


@dsl
def arrive(sync, tid) -> None:
    """Count this CTA in (thread 0); leave() checks the count."""
    if tid == 0:
        fx.atomic_add(fx.get_iter(sync) + ARRIVE_WORD, fx.Int32(1), syncscope=_AGENT,
                      ordering=fx.AtomicOrdering.Monotonic)


@dsl
def leave(sync, tag, ctas, tid) -> None:
    """Count this CTA out; the last one advances the epoch to `tag`, then clears the counters
    (in that order: a launch cut short between the two leaves a dirty arrival counter, which the
    next launch traps on, never a reused tag).

    More arrivals or exits than CTAs mean the area was dirty when this launch began: trap, so
    the launch fails instead of returning values it may have read from an earlier launch's
    flags. Every arrival precedes its CTA's exit in the exit counter's release sequence, so the
    last CTA out sees them all and always catches a dirty area; an earlier one may too.
    """
    gpu.barrier()
    if tid == 0:
        base = fx.get_iter(sync)
        before = fx.atomic_add(base + EXIT_WORD, fx.Int32(1), syncscope=_AGENT,
                               ordering=fx.AtomicOrdering.AcqRel)
        arrived = _read(base + ARRIVE_WORD)
        trap_if((arrived > ctas).select(1, 0) + (before >= ctas).select(1, 0))
        if before == ctas - 1:
            _write(base + EPOCH_WORD, tag)
            fx.memory_fence(syncscope=_AGENT, ordering=fx.AtomicOrdering.Release)
            _write(base + ARRIVE_WORD, fx.Int32(0))
            _write(base + EXIT_WORD, fx.Int32(0))
