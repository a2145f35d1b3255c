"""Site-by-site check of a kernel's cross-workgroup hand-offs against LLVM's AMDGPU memory
model for gfx942 / gfx950 (AMDGPUUsage, "Memory Model GFX942", the code sequences of
"store atomic release", "fence release", "load atomic acquire" and "fence acquire").

Two forward dataflows run over every path of one wave through the code (hsaco/listing.py):

release: a flag store (a store at agent or system scope of at most 8 bytes, or an RMW atomic)
  must not be reachable while data the wave stored plainly is still only in its XCD's L2
  (no `buffer_wbl2` at the flag's scope since) or while a write-back or a written-through
  store (a wider sc1 store) is still outstanding (no `s_waitcnt vmcnt(0)` since). The table's
  release is `buffer_wbl2 sc1; s_waitcnt vmcnt(0)` before the `sc1` store; a write-through data
  store needs only the wait, as it already left the L2.
acquire: a wait (a load at agent or system scope on a cycle of the code: a poll) must be
  followed, before any load that may hit the CU's L1 or a stale L2 line (no sc1), by
  `s_waitcnt vmcnt(0)` and then `buffer_inv` at the poll's scope. Loads at agent scope or wider
  after a poll are coherent by themselves and need no invalidate.

An 8-byte system-scope store or poll (`..._dwordx2 ... sc0 sc1`) is a (value, tag) pair: the
tag arrives with its own data in one single-copy-atomic access, so it releases and acquires
nothing else and neither rule applies to it. The check is per wave: that every wave's release
completes before another wave's flag store (the barrier) and which wait guards which data
(the schedule) are the protocol models' to prove.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from .listing import Instruction, on_cycles, parse_listing, successors
from .memory_ops import (Scope, access_bytes, access_scope, invalidate_scope, is_atomic, is_vector_load,
                         is_vector_store, waits_for_vector_memory, write_back_scope)

# Dataflow facts: (what is outstanding, the scope it concerns). A path's state is the set of
# facts true on it; where paths meet the sets join (a fact on any path is a fact).
DIRTY = "stored data not written back"
WRITING_BACK = "write-back not waited for"
WRITING_THROUGH = "written-through store not waited for"
POLLED = "poll not waited for"
NOT_INVALIDATED = "no invalidate since the poll"

Fact = tuple[str, Scope]


class Finding(NamedTuple):
    """A site whose hand-off is weaker than the model's: the rule broken, where, and what a
    path to it lacks."""

    rule: str
    address: int
    instruction: str
    missing: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.address:#x} {self.instruction}: {self.missing}"


def is_pair(ins: Instruction) -> bool:
    """An 8-byte system-scope (value, tag) store or load."""
    return access_bytes(ins) == 8 and access_scope(ins) == Scope.SYSTEM and not is_atomic(ins)


def is_flag_store(ins: Instruction) -> bool:
    if is_atomic(ins):
        return True
    return (is_vector_store(ins) and access_scope(ins) >= Scope.AGENT and access_bytes(ins) <= 8
            and not is_pair(ins))


@functools.lru_cache(maxsize=None)
def _release_effect(ins: Instruction) -> tuple[str, Scope] | None:
    """What an instruction does to the release facts: write back, wait, write through or dirty."""
    scope = write_back_scope(ins)
    if scope is not None:
        return ("write back", scope)
    if waits_for_vector_memory(ins):
        return ("wait", Scope.SYSTEM)
    if is_vector_store(ins) and not is_flag_store(ins) and not is_pair(ins):
        scope = access_scope(ins)
        return ("write through", scope) if scope >= Scope.AGENT else ("dirty", scope)
    return None


def _release_step(ins: Instruction, state: frozenset[Fact]) -> frozenset[Fact]:
    effect = _release_effect(ins)
    if effect is None:
        return state
    kind, scope = effect
    if kind == "write back":
        return frozenset((WRITING_BACK, f[1]) if f[0] == DIRTY and f[1] <= scope else f for f in state)
    if kind == "wait":
        return frozenset(f for f in state if f[0] not in (WRITING_BACK, WRITING_THROUGH))
    if kind == "write through":
        return state | {(WRITING_THROUGH, scope)}
    return state | {(DIRTY, Scope.AGENT), (DIRTY, Scope.SYSTEM)}


@functools.lru_cache(maxsize=None)
def _acquire_effect(ins: Instruction) -> tuple[str, Scope] | None:
    """What an instruction other than a poll does to the acquire facts: wait or invalidate."""
    if waits_for_vector_memory(ins):
        return ("wait", Scope.SYSTEM)
    scope = invalidate_scope(ins)
    return None if scope is None else ("invalidate", scope)


def _acquire_step(ins: Instruction, state: frozenset[Fact], polls: bool) -> frozenset[Fact]:
    if polls:
        poll_scope = access_scope(ins)
        return state | {(POLLED, poll_scope), (NOT_INVALIDATED, poll_scope)}
    effect = _acquire_effect(ins)
    if effect is None:
        return state
    kind, scope = effect
    if kind == "wait":
        return frozenset(f for f in state if f[0] != POLLED)
    waiting = {f[1] for f in state if f[0] == POLLED}
    return frozenset(f for f in state if not (f[0] == NOT_INVALIDATED and f[1] <= scope and f[1] not in waiting))


def _fixpoint(code: list[Instruction], succ: list[list[int]], step) -> list[frozenset[Fact] | None]:
    """The facts on entry to each instruction, joined over every path from the kernel's entry."""
    before: list[frozenset[Fact] | None] = [None] * len(code)
    before[0] = frozenset()
    work = [0]
    while work:
        i = work.pop()
        after = step(i, before[i])
        for j in succ[i]:
            old = before[j]
            merged = after if old is None else old | after
            if merged != old:
                before[j] = merged
                work.append(j)
    return before


def _describe(facts: set[Fact]) -> str:
    return "; ".join(sorted(f"{what} ({scope.name.lower()} scope)" for what, scope in facts))


class Flow(NamedTuple):
    """A kernel's control flow as the dataflows need it: each instruction's successors and the
    polls (loads at agent or system scope that a wave can run again)."""

    succ: list[list[int]]
    polls: frozenset[int]


def flow_of(code: list[Instruction]) -> Flow:
    succ = successors(code)
    return Flow(succ, frozenset(i for i in on_cycles(succ) if is_vector_load(code[i])
                                and access_scope(code[i]) >= Scope.AGENT and not is_pair(code[i])))


def release_states(code: list[Instruction], flow: Flow) -> list[frozenset[Fact] | None]:
    """The release facts on entry to each instruction (None: unreachable)."""
    return _fixpoint(code, flow.succ, lambda i, s: _release_step(code[i], s))


def acquire_states(code: list[Instruction], flow: Flow) -> list[frozenset[Fact] | None]:
    """The acquire facts on entry to each instruction (None: unreachable)."""
    return _fixpoint(code, flow.succ, lambda i, s: _acquire_step(code[i], s, i in flow.polls))


def check_code(code: list[Instruction], flow: Flow | None = None) -> list[Finding]:
    """Every release and acquire finding of one kernel's instructions, in address order
    (`flow`: its flow_of(), when the caller has it)."""
    flow = flow_of(code) if flow is None else flow
    release, acquire = release_states(code, flow), acquire_states(code, flow)
    findings = []
    for i, ins in enumerate(code):
        rel, acq = release[i], acquire[i]
        if rel is not None and is_flag_store(ins):
            scope = access_scope(ins)
            lacking = {f for f in rel if f[1] <= scope}
            if lacking:
                findings.append(Finding("release", ins.address, ins.text, _describe(lacking)))
        if acq and is_vector_load(ins) and i not in flow.polls and access_scope(ins) < Scope.AGENT:
            findings.append(Finding("acquire", ins.address, ins.text, _describe(set(acq))))
    return findings


def check_listing(listing: str) -> list[Finding]:
    """check_code over a one-kernel llvm-objdump listing."""
    return check_code(parse_listing(listing))
