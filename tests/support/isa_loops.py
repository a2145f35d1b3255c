"""Loops and load waits of an llvm-objdump listing, for the ISA gates on how K2 reaches its
weights.

A loop is a backward `s_cbranch_execnz` and the instructions from its target to it. A waterfall
loop is the compiler's form of a buffer access through a per-lane resource: it reads one lane's
descriptor (v_readfirstlane_b32), runs the access for the lanes that hold the same one
(s_and_saveexec_b64) and branches back while lanes remain; the same listing's polls are loops
of global loads and hold no buffer access.

A vector-memory wait (s_waitcnt vmcnt(N)) lets a wave go on once at most N of its loads are
outstanding (loads complete in order): an MFMA whose last wait is vmcnt(0) waited for every load
the wave had issued, vmcnt(N > 0) leaves the N most recent ones in flight.
"""

from __future__ import annotations

import re

_SYMBOL = re.compile(r"^([0-9a-f]+) <(\w+)>:")
_BACK_EDGE = re.compile(r"<\w+\+0x([0-9a-f]+)>")
_VMCNT = re.compile(r"vmcnt\((\d+)\)")


def instructions(listing: str) -> list[tuple[int, str, str]]:
    """(address, instruction text, its comment: encoding and branch target) of every instruction
    line of a one-kernel listing."""
    out = []
    for line in listing.splitlines():
        if line.startswith("\t") and "//" in line:
            text, _, comment = line.partition("//")
            out.append((int(comment.split(":")[0], 16), text.strip(), comment))
    return out


def execnz_loops(listing: str) -> list[list[str]]:
    """The instructions of every loop closed by a backward s_cbranch_execnz."""
    start = next(int(m.group(1), 16) for m in map(_SYMBOL.match, listing.splitlines()) if m)
    code = instructions(listing)
    where = {address: i for i, (address, _, _) in enumerate(code)}
    loops = []
    for i, (_, text, comment) in enumerate(code):
        edge = _BACK_EDGE.search(f"{text} {comment}") if text.startswith("s_cbranch_execnz") else None
        if edge and where[start + int(edge.group(1), 16)] <= i:
            loops.append([t for _, t, _ in code[where[start + int(edge.group(1), 16)]:i + 1]])
    return loops


def waterfall_loops(listing: str) -> list[list[str]]:
    """The loops that read a lane's value into SGPRs around a buffer access."""
    return [body for body in execnz_loops(listing)
            if any(t.startswith("v_readfirstlane_b32") for t in body) and any(t.startswith("buffer_") for t in body)]


def vmcnt_before(listing: str, selects) -> list[int | None]:
    """For each instruction whose text `selects`, the vmcnt of the last s_waitcnt before it that
    names one (None if there is none)."""
    last, out = None, []
    for _, text, _ in instructions(listing):
        wait = _VMCNT.search(text) if text.startswith("s_waitcnt") else None
        if wait:
            last = int(wait.group(1))
        elif selects(text):
            out.append(last)
    return out
