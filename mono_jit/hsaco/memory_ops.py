"""What a gfx942 / gfx950 instruction does to memory ordering, read from its mnemonic and cache
bits as LLVM's AMDGPUUsage describes them ("Memory Model GFX942", its code-sequence table, and
"AMDHSA Kernel Descriptor" / "Initial Kernel Execution State" for where the kernarg pointer is).

Scopes rank workgroup < agent < system. A non-atomic access's bits name the scope it is
coherent at: none or sc0 are the workgroup's (they may hit the CU's vector L1 and the XCD's
L2), sc1 is the agent's (past the L1, coherent across the XCDs' L2s), sc0 sc1 the system's.
An RMW atomic always runs at the L2 or beyond, at agent scope, and sc1 makes it system scope.
"""

from __future__ import annotations

import enum
import re

from .listing import Instruction

_VECTOR = re.compile(r"^(buffer|global|flat)_(load|store|atomic)")
_WIDTH = re.compile(r"_(ubyte|sbyte|byte|ushort|sshort|short|dword|dwordx2|dwordx3|dwordx4)(_d16(_hi)?)?$")
_BYTES = {"ubyte": 1, "sbyte": 1, "byte": 1, "ushort": 2, "sshort": 2, "short": 2, "dword": 4,
          "dwordx2": 8, "dwordx3": 12, "dwordx4": 16}


class Scope(enum.IntEnum):
    WORKGROUP = 1
    AGENT = 2
    SYSTEM = 3


def _bit_scope(ins: Instruction) -> Scope:
    bits = ins.bits()
    if "sc1" not in bits:
        return Scope.WORKGROUP
    return Scope.SYSTEM if "sc0" in bits else Scope.AGENT


def is_vector_load(ins: Instruction) -> bool:
    return bool(_VECTOR.match(ins.mnemonic)) and "_load" in ins.mnemonic


def is_vector_store(ins: Instruction) -> bool:
    return bool(_VECTOR.match(ins.mnemonic)) and "_store" in ins.mnemonic


def is_atomic(ins: Instruction) -> bool:
    return bool(_VECTOR.match(ins.mnemonic)) and "_atomic" in ins.mnemonic


def access_scope(ins: Instruction) -> Scope:
    """The scope a vector load, store or atomic is coherent at (the table's "monotonic" rows)."""
    if is_atomic(ins):
        return Scope.SYSTEM if "sc1" in ins.bits() else Scope.AGENT
    return _bit_scope(ins)


def access_bytes(ins: Instruction) -> int:
    """Bytes a lane stores or loads (16 for a form this module does not know: the widest)."""
    match = _WIDTH.search(ins.mnemonic)
    return _BYTES[match.group(1)] if match else 16


def write_back_scope(ins: Instruction) -> Scope | None:
    """The scope a `buffer_wbl2` writes the XCD's dirty L2 lines back for (None if the
    instruction is not one): sc1 agent, sc0 sc1 system; without sc1 it leaves other L2s stale."""
    return _bit_scope(ins) if ins.mnemonic == "buffer_wbl2" else None


def invalidate_scope(ins: Instruction) -> Scope | None:
    """The scope a `buffer_inv` makes later loads coherent at (None if not one): sc0 drops the
    CU's L1 only (workgroup), sc1 also the XCD's non-local L2 lines (agent), sc0 sc1 system."""
    if ins.mnemonic != "buffer_inv":
        return None
    bits = ins.bits()
    return Scope.SYSTEM if {"sc0", "sc1"} <= bits else Scope.AGENT if "sc1" in bits else Scope.WORKGROUP


def waits_for_vector_memory(ins: Instruction) -> bool:
    """An `s_waitcnt` that lets the wave go on only once none of its vector memory operations
    (loads, stores, write-backs) is outstanding: vmcnt(0). A field the listing leaves out is not
    waited on."""
    return ins.mnemonic == "s_waitcnt" and re.search(r"\bvmcnt\(0\)", ins.operands) is not None
