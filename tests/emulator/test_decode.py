"""The emulator's instruction table against LLVM's own disassembler, for every instruction of
every built template (router, keytable, K1 at every bucket, K2 at every bucket and ratio).

The emulator decodes with tinygrad's CDNA4 decoder, which is generated from AMD's machine-readable
spec, not from LLVM. Here `llvm-objdump --mcpu=gfx950` (the other reading of the same bytes) must
agree on where each instruction starts, which operation it is, its literal constant and the
register its first operand names, as the emulator's table holds it. The operand model below is
written from LLVM's printed syntax, not from the decoder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

from mono_jit.emulator import CodeObject  # noqa: E402
from mono_jit.emulator.decode import F_DST, F_LIT, F_OFFSET, F_OP, F_SRC0, Program  # noqa: E402
from mono_jit.emulator.ops import NAMES  # noqa: E402

OBJDUMP = Path("/usr/lib/llvm-22/bin/llvm-objdump")
LINE = re.compile(r"^\s+(?P<text>\S.*?)\s*// (?P<address>[0-9A-F]{12}): ")
SUFFIXES = ("_e32", "_e64", "_sdwa", "_dpp")
# LLVM's names of the special scalar operands, as operand codes (AMD's ISA, "scalar operands").
SPECIAL = {"vcc": 106, "vcc_lo": 106, "m0": 124, "exec": 126, "exec_lo": 126}
# Operations whose first printed operand is not what they write: stores print the address (DS,
# global) or the data (buffer) first; scalar compares print their first source.
FIRST_IS_SOURCE = ("ds_write", "global_store", "global_atomic", "s_cmp_", "s_bitcmp")
SMEM = ("s_load", "s_buffer_load", "s_store", "s_atomic")  # the printed constant is the offset


def _register(operand: str) -> tuple[str, int] | None:
    """('v' | 's', first index) of a printed register operand, or None for constants / modifiers."""
    operand = operand.strip().lstrip("-|").rstrip("|")
    if operand in SPECIAL:
        return "s", SPECIAL[operand]
    match = re.fullmatch(r"([vs])(?:\[(\d+)(?::\d+)?\]|(\d+))", operand)
    if not match:
        return None
    return match.group(1), int(match.group(2) or match.group(3))


def llvm_listing(hsaco: Path) -> dict[int, str]:
    """Address -> instruction text, as llvm-objdump prints it."""
    out = subprocess.run([str(OBJDUMP), "-d", "--mcpu=gfx950", str(hsaco)], capture_output=True, text=True,
                         check=True).stdout
    return {int(m["address"], 16): m["text"] for line in out.splitlines() if (m := LINE.match(line))}


def mismatches(program: Program, listing: dict[int, str]) -> list[str]:
    """Every disagreement between the emulator's table and LLVM's listing, described."""
    problems = []
    if list(program.addresses) != sorted(listing):
        missing = sorted(set(listing) ^ set(program.addresses))[:5]
        return [f"instruction boundaries differ (first at {[hex(a) for a in missing]})"]
    for row, address in zip(program.table, program.addresses):
        text = listing[address]
        mnemonic, _, rest = text.partition(" ")
        operands = [o for o in re.split(r",\s*", rest.split(" offset")[0].split(" sc")[0]) if o]
        base = mnemonic
        for suffix in SUFFIXES:
            base = base.removesuffix(suffix)
        where = f"{address:#x} {text!r}"
        if NAMES[row[F_OP]].lower() != base:
            problems.append(f"{where}: the emulator runs {NAMES[row[F_OP]]}")
            continue
        literals = [int(o, 16) for o in operands if re.fullmatch(r"-?0x[0-9a-f]+", o)]
        if literals and mnemonic.startswith(SMEM):
            if row[F_OFFSET] != literals[0]:
                problems.append(f"{where}: offset {row[F_OFFSET]:#x}")
        elif literals and mnemonic.startswith(("s_", "v_")) and not mnemonic.startswith(("s_movk", "s_cmpk", "s_mulk",
                                                                                          "s_addk")):
            if row[F_LIT] & 0xFFFFFFFF != literals[0] & 0xFFFFFFFF:
                problems.append(f"{where}: literal {row[F_LIT]:#x}")
        first = _register(operands[0]) if operands else None
        if first is None or mnemonic.startswith(("s_waitcnt", "s_cbranch", "s_branch", "buffer_store")):
            continue
        if mnemonic.startswith("v_cmp") and mnemonic.endswith("_e32"):
            continue  # prints vcc, the implied destination
        returns = mnemonic.startswith("global_atomic") and len(operands) == 4  # vdst, addr, data, saddr
        field = F_SRC0 if mnemonic.startswith(FIRST_IS_SOURCE) and not returns else F_DST
        value = int(row[field])
        if field == F_SRC0 and first[0] == "v" and mnemonic.startswith("s_"):
            value -= 256
        if value != first[1] and value - 256 != first[1]:
            problems.append(f"{where}: the emulator's {'source' if field == F_SRC0 else 'destination'} is {value}")
    return problems


def _entries(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("kernel.hsaco"))


@pytest.mark.slow
@pytest.mark.skipif(not OBJDUMP.exists(), reason="needs llvm-22's llvm-objdump (scripts/setup.sh installs it)")
def test_every_instruction_of_every_built_template_decodes_as_llvm_reads_it(golden_cache, k1_cache, k2_cache):
    entries = _entries(golden_cache, k1_cache, k2_cache)
    assert len(entries) >= 3 + 7 + 14
    total, problems = 0, []
    for hsaco in entries:
        program = CodeObject(hsaco.read_bytes()).program
        total += len(program.addresses)
        problems += [f"{hsaco.parent.name[:12]}: {p}" for p in mismatches(program, llvm_listing(hsaco))]
    assert not problems, f"{len(problems)} of {total} instructions disagree:\n" + "\n".join(problems[:40])


def test_the_comparison_catches_a_wrong_operation_and_a_wrong_register(golden_cache):
    """The cross-check itself can fail: one row's operation or destination changed is reported."""
    hsaco = _entries(golden_cache)[0]
    program, listing = CodeObject(hsaco.read_bytes()).program, llvm_listing(hsaco)
    assert mismatches(program, listing) == []
    moved = next(i for i, a in enumerate(program.addresses) if listing[a].startswith("v_mov_b32"))
    program.table[moved, F_DST] += 1
    program.table[moved + 1, F_OP] = NAMES.index("S_NOP") if not listing[program.addresses[moved + 1]].startswith(
        "s_nop") else NAMES.index("S_ENDPGM")
    found = mismatches(program, listing)
    assert len(found) == 2 and "destination" in found[0] and "the emulator runs" in found[1]
