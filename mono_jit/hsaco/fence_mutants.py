"""Mutants of a built code object, each with one agent-scope fence replaced by `s_nop 0`: every
`buffer_wbl2 sc1`, the `s_waitcnt vmcnt(0)` that first follows each, every `buffer_inv sc1`.
The sites come from the disassembly; the patched bytes are checked against the listing's
encoding. A check (the site check, the emulator's weak memory) is held to report each mutant
whose fence its wave needs; `idle_fences` names the ones the per-wave rules find it does not."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import NamedTuple

from ..errors import InvalidCodeObject
from .handoffs import DIRTY, NOT_INVALIDATED, WRITING_BACK, WRITING_THROUGH, acquire_states, flow_of, release_states
from .listing import Instruction, parse_listing
from .memory_ops import Scope, access_scope, invalidate_scope, is_vector_load, waits_for_vector_memory, write_back_scope

S_NOP_0 = (0xBF800000).to_bytes(4, "little")


class Mutant(NamedTuple):
    """One fence removed: its site (address and instruction) and the code object's bytes."""

    address: int
    instruction: str
    hsaco: bytes

    @property
    def site(self) -> str:
        return f"{self.address:#x} {self.instruction}"


def fence_sites(code: list[Instruction]) -> list[int]:
    """Indices of the fences to remove, in address order."""
    sites = set()
    for i, ins in enumerate(code):
        back, inv = write_back_scope(ins), invalidate_scope(ins)
        if back is not None and back >= Scope.AGENT:
            sites.add(i)
            wait = next((j for j in range(i + 1, len(code)) if waits_for_vector_memory(code[j])), None)
            if wait is not None:
                sites.add(wait)
        elif inv is not None and inv >= Scope.AGENT:
            sites.add(i)
    return sorted(sites)


def _text_offset(hsaco: bytes) -> int:
    """What to add to an instruction's address to find its bytes in the file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        text = ELFFile(io.BytesIO(hsaco)).get_section_by_name(".text")
    except ELFError as exc:
        raise InvalidCodeObject(f"unreadable code object: {exc}") from None
    if text is None:
        raise InvalidCodeObject("no .text section in the code object")
    return text["sh_offset"] - text["sh_addr"]


def fence_mutants(hsaco: bytes, listing: str) -> Iterator[Mutant]:
    """Each mutant of `hsaco` (whose llvm-objdump listing is `listing`), one fence at a time."""
    code = parse_listing(listing)
    shift = _text_offset(hsaco)
    for i in fence_sites(code):
        ins = code[i]
        start = ins.address + shift
        original = b"".join(w.to_bytes(4, "little") for w in ins.words)
        if hsaco[start:start + len(original)] != original:
            raise InvalidCodeObject(f"{ins.address:#x} {ins.text}: the listing's encoding is not at file offset {start:#x}")
        yield Mutant(ins.address, ins.text, hsaco[:start] + S_NOP_0 * len(ins.words) + hsaco[start + len(original):])


def _invalidated_before_use(code: list[Instruction], succ: list[list[int]], scope: Scope) -> list[bool]:
    """For each instruction, whether every path from it meets a `buffer_inv` at `scope` or wider
    before any load that may hit a stale line (the greatest fixed point of a backward must-flow)."""
    covered = [True] * len(code)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(code))):
            ins = code[i]
            scope_here = invalidate_scope(ins)
            if scope_here is not None and scope_here >= scope:
                value = True
            elif is_vector_load(ins) and access_scope(ins) < Scope.AGENT:
                value = False
            else:
                value = all(covered[j] for j in succ[i])
            if value != covered[i]:
                covered[i], changed = value, True
    return covered


def idle_fences(code: list[Instruction]) -> dict[int, str]:
    """The fence sites whose removal the wave's own rules cannot notice, with why: a write-back
    with nothing stored plainly at its scope, a wait with no write-back or written-through store
    outstanding, an invalidate with no poll awaiting it or followed by another before any load."""
    flow = flow_of(code)
    release, acquire = release_states(code, flow), acquire_states(code, flow)
    covered: dict[Scope, list[bool]] = {}
    idle = {}
    for i in fence_sites(code):
        ins, rel, acq = code[i], release[i] or frozenset(), acquire[i] or frozenset()
        back = write_back_scope(ins)
        inv = invalidate_scope(ins)
        if back is not None and not any(what == DIRTY and scope <= back for what, scope in rel):
            idle[i] = "nothing stored plainly since the last write-back"
        elif waits_for_vector_memory(ins) and not any(what in (WRITING_BACK, WRITING_THROUGH) for what, _ in rel):
            idle[i] = "no write-back or written-through store outstanding"
        elif inv is not None:
            awaiting = [scope for what, scope in acq if what == NOT_INVALIDATED and scope <= inv]
            for scope in awaiting:
                if scope not in covered:
                    covered[scope] = _invalidated_before_use(code, flow.succ, scope)
            if not awaiting:
                idle[i] = "no poll awaits an invalidate here"
            elif all(covered[scope][j] for scope in awaiting for j in flow.succ[i]):
                idle[i] = "another invalidate follows on every path before any load"
    return idle
