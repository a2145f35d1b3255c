"""Proof that every scalar load of a kernel reads its kernarg segment, and so no data another
workgroup writes during the launch.

The scalar cache is shared by a pair of CUs, is not coherent with the vector caches and no
`buffer_inv` drops it (AMDGPUUsage, "Memory Model GFX942": scalar loads are for memory that
does not change during the dispatch), while LLVM turns a uniform plain load into `s_load`
whenever it sees no clobber in the function, fences and barriers included. A forward "must"
dataflow over the CFG tracks which SGPR pairs hold the kernarg pointer on every path: the
pair the kernel descriptor puts it in at entry ("Initial Kernel Execution State"), copies of it
by `s_mov_b64`; any other write to either half kills it. An `s_load` is proved when its base
holds the pointer and its immediate offset and width lie inside the segment.
"""

from __future__ import annotations

import io
import re
import struct

from ..errors import InvalidCodeObject
from .handoffs import Finding
from .listing import Instruction, successors

# SOP instructions that write no SGPR named in their first operand.
_NO_SGPR_DESTINATION = ("s_cmp", "s_bitcmp", "s_cbranch", "s_branch", "s_waitcnt", "s_barrier", "s_nop",
                        "s_sleep", "s_trap", "s_endpgm", "s_setprio", "s_store", "s_dcache", "s_sendmsg",
                        "s_setreg", "s_icache", "s_ttrace", "s_set_gpr_idx", "s_buffer_store", "s_atc_probe")
_SGPRS = re.compile(r"^s\[(\d+):(\d+)\]$|^s(\d+)$")
_SCALAR_BYTES = {"dword": 4, "dwordx2": 8, "dwordx4": 16, "dwordx8": 32, "dwordx16": 64}
# Kernel descriptor (AMDGPUUsage, "AMDHSA Kernel Descriptor"): kernel_code_properties at byte
# 56; its first bits enable the user SGPRs that come before the kernarg pointer, in order.
_CODE_PROPERTIES = 56
_USER_SGPRS_BEFORE_KERNARG = ((0, 4), (1, 2), (2, 2))  # private segment buffer, dispatch ptr, queue ptr
_KERNARG_PTR_BIT = 3


def _sgprs(token: str) -> set[int]:
    match = _SGPRS.match(token)
    if not match:
        return set()
    if match.group(3) is not None:
        return {int(match.group(3))}
    return set(range(int(match.group(1)), int(match.group(2)) + 1))


def _written_sgprs(ins: Instruction) -> set[int]:
    operands = ins.operand_list()
    if not operands:
        return set()
    if ins.mnemonic.startswith("s_"):
        return set() if ins.mnemonic.startswith(_NO_SGPR_DESTINATION) else _sgprs(operands[0])
    if ins.mnemonic.startswith("v_"):
        # An SGPR first is a destination (readlane, an e64 compare); carry-out forms write the
        # SGPR pair second.
        carry = ("_co_" in ins.mnemonic or "div_scale" in ins.mnemonic) and len(operands) > 1
        return _sgprs(operands[0]) | (_sgprs(operands[1]) if carry else set())
    return set()


def kernarg_pair(hsaco: bytes, kernel: str) -> int:
    """The first SGPR of the kernarg pointer at `kernel`'s entry, from its kernel descriptor."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(hsaco))
        symbols = elf.get_section_by_name(".symtab")
        (descriptor,) = symbols.get_symbol_by_name(f"{kernel}.kd")
        address = descriptor["st_value"]
        for segment in elf.iter_segments():
            start = segment["p_vaddr"]
            if segment["p_type"] == "PT_LOAD" and start <= address < start + segment["p_filesz"]:
                offset = segment["p_offset"] + address - start
                break
        else:
            raise InvalidCodeObject(f"{kernel}.kd lies in no loaded segment")
    except (ELFError, TypeError, ValueError) as exc:
        raise InvalidCodeObject(f"no kernel descriptor {kernel}.kd: {exc}") from None
    (properties,) = struct.unpack_from("<H", hsaco, offset + _CODE_PROPERTIES)
    if not properties >> _KERNARG_PTR_BIT & 1:
        raise InvalidCodeObject(f"{kernel} does not ask for the kernarg segment pointer")
    return sum(count for bit, count in _USER_SGPRS_BEFORE_KERNARG if properties >> bit & 1)


def unproved_scalar_loads(code: list[Instruction], first_sgpr: int, kernarg_size: int) -> list[Finding]:
    """Every scalar load not proved to read the kernarg segment (base held on every path,
    immediate offset and width inside `kernarg_size` bytes)."""
    succ = successors(code)
    entry = frozenset({(first_sgpr, first_sgpr + 1)})
    holds: list[frozenset[tuple[int, int]] | None] = [None] * len(code)
    holds[0] = entry
    work = [0]
    while work:
        i = work.pop()
        ins, state = code[i], holds[i]
        assert state is not None
        written = _written_sgprs(ins)
        after = {pair for pair in state if not set(pair) & written}
        if ins.mnemonic == "s_mov_b64":
            source = tuple(sorted(_sgprs(ins.operand_list()[1])))
            if source in state:
                after.add(tuple(sorted(written)))  # type: ignore[arg-type]
        out = frozenset(after)
        for j in succ[i]:
            old = holds[j]
            merged = out if old is None else old & out
            if merged != old:
                holds[j] = merged
                work.append(j)
    findings = []
    for i, ins in enumerate(code):
        if not ins.mnemonic.startswith(("s_load", "s_buffer_load", "s_scratch_load")) or holds[i] is None:
            continue
        operands = ins.operand_list()
        base = tuple(sorted(_sgprs(operands[1]))) if len(operands) > 1 else ()
        width = _SCALAR_BYTES.get(ins.mnemonic.rsplit("_", 1)[-1], 64)
        offset = int(operands[2], 0) if len(operands) > 2 and re.fullmatch(r"0x[0-9a-f]+|\d+", operands[2]) else None
        if not ins.mnemonic.startswith("s_load"):
            missing = "a scalar load through a resource or scratch, not the kernarg pointer"
        elif base not in holds[i]:  # type: ignore[operator]
            missing = f"its base {operands[1]} is not the kernarg pointer on every path"
        elif offset is None or offset + width > kernarg_size:
            missing = f"its offset is not inside the {kernarg_size}-byte kernarg segment"
        else:
            continue
        findings.append(Finding("scalar", ins.address, ins.text, missing))
    return findings
