"""Hand-offs between the CTAs of one persistent launch (FlyDSL; kernel modules only).

A sync area is an int32 buffer: word 0 the epoch, word 1 the exit counter, then one flag per
producer task. A launch reads the epoch once and tags every flag it publishes with epoch + 1;
the last CTA to leave advances the epoch, so flags never need clearing, no host code runs
between steps and every argument is a fixed device pointer (HIP-graph safe). Flags written
by an earlier step hold an older tag and read as "not yet". Ordering follows the AMDGPU memory
model at agent scope: every producer thread fences (release, agent) before the CTA barrier
after which one thread stores the flag; a consumer spins on agent-scope loads, then the CTA
barriers and fences (acquire, agent) before it reads the data. On gfx950 these are
`buffer_wbl2 sc1` / `buffer_inv sc1` and `sc1` flag accesses (checked in the ISA by the tests).
"""

import flydsl.expr as fx
from flydsl.expr import gpu

from ._dsl import dsl

EPOCH_WORD = 0
EXIT_WORD = 1
_AGENT = "agent"


def _read(ptr):
    return fx.generic_load(ptr, memory_order=fx.AtomicOrdering.Monotonic, syncscope=_AGENT)


def _write(ptr, value) -> None:
    fx.generic_store(ptr, value, memory_order=fx.AtomicOrdering.Monotonic, syncscope=_AGENT)


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
def wait(sync, first, count, tag, tid) -> None:
    """Block the CTA until flags first .. first + count - 1 carry `tag`; acquire their data.

    One thread polls each flag, so count must not exceed the CTA's threads.
    """
    if tid < count:
        flag = fx.get_iter(sync) + first + tid
        seen = _read(flag)
        while seen != tag:
            fx.rocdl.s_sleep(1)  # ~64 clocks between polls: less traffic on the flags' lines
            seen = _read(flag)
    gpu.barrier()
    fx.memory_fence(syncscope=_AGENT, ordering=fx.AtomicOrdering.Acquire)


@dsl
def leave(sync, tag, ctas, tid) -> None:
    """Count this CTA out; the last one resets the counter and advances the epoch to `tag`."""
    gpu.barrier()
    if tid == 0:
        base = fx.get_iter(sync)
        before = fx.atomic_add(base + EXIT_WORD, fx.Int32(1), syncscope=_AGENT,
                               ordering=fx.AtomicOrdering.AcqRel)
        if before == ctas - 1:
            _write(base + EXIT_WORD, fx.Int32(0))
            fx.memory_fence(syncscope=_AGENT, ordering=fx.AtomicOrdering.Release)
            _write(base + EPOCH_WORD, tag)
