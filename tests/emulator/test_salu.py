"""The scalar ALU (emulator/salu.py), branches and scalar loads, one known answer per case: each
operation on constants chosen for its edge (carries, signs, widths), its result and SCC read back
through v6, against the CDNA4 ISA's definition computed here."""

from __future__ import annotations

from typing import Callable

import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import Case, lanes, run_cases

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

M = 0xFFFFFFFF
A, B = 0x9ABCDEF0, 0x76543210  # a carry out of bit 31, signs differ
SCC1, SCC0 = "  s_cmp_eq_u32 0, 0\n", "  s_cmp_eq_u32 0, 1\n"


def s32(v: int) -> int:
    v &= M
    return v - (1 << 32) if v >> 31 else v


def _const(value: int) -> Callable:
    return lambda lane: value


def scalar(op: str, instr: str, result: int | None, scc: int | None = None, a: int = A, b: int = B,
           before: str = "", out: str = "s14") -> list[Case]:
    """Cases of `instr` with s12 = a, s13 = b (and `before`): `out` after it, and SCC."""
    setup = f"  s_mov_b32 s12, {a:#x}\n  s_mov_b32 s13, {b:#x}\n" + before
    cases = []
    if result is not None:
        cases.append(Case(op, f"{setup}  {instr}\n  v_mov_b32 v6, {out}\n", _const(result & M)))
    if scc is not None:
        cases.append(Case(op, f"{setup}  {instr}\n  s_cselect_b32 s20, 1, 0\n  v_mov_b32 v6, s20\n", _const(scc)))
    return cases


def wide(op: str, instr: str, result: int, scc: int | None = None, a: int = 0x80000001_F0000000,
         b: int = 0x00000003_0FFFFFFF) -> list[Case]:
    """Cases of a 64-bit `instr` on s[12:13] = a, s[14:15] = b into s[16:17]: both halves and SCC."""
    setup = (f"  s_mov_b32 s12, {a & M:#x}\n  s_mov_b32 s13, {a >> 32:#x}\n"
             f"  s_mov_b32 s14, {b & M:#x}\n  s_mov_b32 s15, {b >> 32:#x}\n")
    cases = [Case(op, f"{setup}  {instr}\n  v_mov_b32 v6, s{16 + half}\n", _const(result >> (32 * half) & M))
             for half in range(2)]
    if scc is not None:
        cases.append(Case(op, f"{setup}  {instr}\n  s_cselect_b32 s20, 1, 0\n  v_mov_b32 v6, s20\n", _const(scc)))
    return cases


def _bfe(a: int, b: int, signed: bool) -> int:
    offset, width = b & 31, b >> 16 & 0x7F
    r = (a >> offset) & ((1 << width) - 1)
    if signed and width and r >> (width - 1) & 1:
        r -= 1 << width
    return r & M


def _brev(a: int) -> int:
    return int(f"{a:032b}"[::-1], 2)


def _cmp(op: str, a: int, b: int) -> int:
    kind, signed = op.split("_")[2], op.endswith("I32")
    x, y = (s32(a), s32(b)) if signed else (a, b)
    return int({"EQ": x == y, "LG": x != y, "GT": x > y, "GE": x >= y, "LT": x < y, "LE": x <= y}[kind])


WA, WB = 0x80000001_F0000000, 0x00000003_0FFFFFFF
SUM = A + B
CASES: list[Case] = [
    *scalar("S_ADD_U32", "s_add_u32 s14, s12, s13", SUM, SUM >> 32),
    *scalar("S_ADDC_U32", "s_addc_u32 s14, s12, s13", SUM + 1, (SUM + 1) >> 32, before=SCC1),
    *scalar("S_SUB_U32", "s_sub_u32 s14, s13, s12", B - A, 1),
    *scalar("S_SUBB_U32", "s_subb_u32 s14, s12, s13", A - B - 1, 0, before=SCC1),
    *scalar("S_ADD_I32", "s_add_i32 s14, s12, s12", 2 * A, 1),  # two negatives overflow
    *scalar("S_SUB_I32", "s_sub_i32 s14, s13, s12", B - A, 1),  # positive minus negative overflows
    *scalar("S_AND_B32", "s_and_b32 s14, s12, s13", A & B, 1),
    *scalar("S_OR_B32", "s_or_b32 s14, s12, s13", A | B, 1),
    *scalar("S_XOR_B32", "s_xor_b32 s14, s12, s12", 0, 0),
    *scalar("S_ANDN2_B32", "s_andn2_b32 s14, s12, s13", A & ~B, 1),
    *wide("S_AND_B64", "s_and_b64 s[16:17], s[12:13], s[14:15]", WA & WB, 1),
    *wide("S_OR_B64", "s_or_b64 s[16:17], s[12:13], s[14:15]", WA | WB, 1),
    *wide("S_XOR_B64", "s_xor_b64 s[16:17], s[12:13], s[14:15]", WA ^ WB, 1),
    *wide("S_ANDN2_B64", "s_andn2_b64 s[16:17], s[12:13], s[14:15]", WA & ~WB & (2**64 - 1), 1),
    *wide("S_MOV_B64", "s_mov_b64 s[16:17], s[12:13]", WA),
    *wide("S_CSELECT_B64", "s_cmp_eq_u32 0, 1\n  s_cselect_b64 s[16:17], s[12:13], s[14:15]", WB),
    *wide("S_LSHL_B64", "s_lshl_b64 s[16:17], s[12:13], 5", (WA << 5) & (2**64 - 1), 1),
    *wide("S_LSHL_B64", "s_lshl_b64 s[16:17], s[12:13], 36", 0, 0),  # all set bits shifted out: SCC 0
    *scalar("S_LSHL_B32", "s_lshl_b32 s14, s12, 36", A << 4, 1),  # the count's low 5 bits
    *scalar("S_LSHR_B32", "s_lshr_b32 s14, s12, 7", A >> 7, 1),
    *scalar("S_ASHR_I32", "s_ashr_i32 s14, s12, 7", s32(A) >> 7, 1),
    *scalar("S_LSHL1_ADD_U32", "s_lshl1_add_u32 s14, s12, s13", (A << 1) + B, 1),
    *scalar("S_LSHL2_ADD_U32", "s_lshl2_add_u32 s14, s13, s13", (B << 2) + B, 1),
    *scalar("S_LSHL3_ADD_U32", "s_lshl3_add_u32 s14, s13, s12", (B << 3) + A, 1),
    *scalar("S_LSHL4_ADD_U32", "s_lshl4_add_u32 s14, s13, s12", (B << 4) + A, 1),
    *scalar("S_MUL_I32", "s_mul_i32 s14, s12, s13", s32(A) * s32(B)),
    *scalar("S_MUL_HI_U32", "s_mul_hi_u32 s14, s12, s13", (A * B) >> 32),
    *scalar("S_MUL_HI_I32", "s_mul_hi_i32 s14, s12, s13", (s32(A) * s32(B)) >> 32),
    *scalar("S_MIN_I32", "s_min_i32 s14, s12, s13", A, 1),
    *scalar("S_MAX_I32", "s_max_i32 s14, s12, s13", B, 0),
    *scalar("S_MIN_U32", "s_min_u32 s14, s12, s13", B, 0),
    *scalar("S_BREV_B32", "s_brev_b32 s14, s12", _brev(A)),
    *scalar("S_CSELECT_B32", "s_cselect_b32 s14, s12, s13", A, before=SCC1),
    *scalar("S_BFE_U32", "s_bfe_u32 s14, s12, s13", _bfe(A, 0x000B0005, False), 1, b=0x000B0005),
    *scalar("S_BFE_I32", "s_bfe_i32 s14, s12, s13", _bfe(A, 0x00070019, True), 1, b=0x00070019),
    *scalar("S_MOV_B32", "s_mov_b32 s14, s12", A),
    *scalar("S_ABS_I32", "s_abs_i32 s14, s12", -s32(A), 1),
    *scalar("S_SEXT_I32_I16", "s_sext_i32_i16 s14, s12", 0xFFFFDEF0),
    *wide("S_BCNT1_I32_B64", "s_bcnt1_i32_b64 s16, s[12:13]\n  s_mov_b32 s17, 0", bin(WA).count("1"), 1),
    *scalar("S_BITSET1_B32", "s_mov_b32 s14, s13\n  s_bitset1_b32 s14, s12", B | 1 << 3, a=0x23),
    *wide("S_FF1_I32_B64", "s_ff1_i32_b64 s16, s[12:13]\n  s_mov_b32 s17, 0", 28),
    *scalar("S_BITCMP1_B32", "s_bitcmp1_b32 s12, s13", None, A >> (B & 31) & 1),
    *scalar("S_MOVK_I32", "s_movk_i32 s14, 0x8123", 0xFFFF8123),
    *scalar("S_ADDK_I32", "s_mov_b32 s14, s12\n  s_addk_i32 s14, 0x8000", A - 0x8000, 0),
    *scalar("S_MULK_I32", "s_mov_b32 s14, s13\n  s_mulk_i32 s14, 0xfff9", s32(B) * -7),
    *[c for op in ("EQ_U32", "LG_U32", "GT_U32", "GE_U32", "LT_U32", "LE_U32", "EQ_I32", "LG_I32", "GT_I32",
                   "GE_I32", "LT_I32", "LE_I32")
      for c in scalar(f"S_CMP_{op}", f"s_cmp_{op.lower()} s12, s13", None, _cmp(f"S_CMP_{op}", A, B))],
    *scalar("S_CMP_EQ_I32", "s_cmp_eq_i32 s12, s12", None, 1),
    *wide("S_CMP_LG_U64", "s_cmp_lg_u64 s[12:13], s[14:15]\n  s_mov_b64 s[16:17], 0", 0, 1),
    *wide("S_CMP_EQ_U64", "s_cmp_eq_u64 s[12:13], s[12:13]\n  s_mov_b64 s[16:17], 0", 0, 1),
    *scalar("S_CMPK_EQ_I32", "s_mov_b32 s14, 0xffff8000\n  s_cmpk_eq_i32 s14, 0x8000", None, 1),
    *scalar("S_CMPK_LG_I32", "s_mov_b32 s14, 0xffff8000\n  s_cmpk_lg_i32 s14, 0x8000", None, 0),
    *scalar("S_CMPK_LG_U32", "s_mov_b32 s14, 0xffff8000\n  s_cmpk_lg_u32 s14, 0x8000", None, 1),
    *scalar("S_CMPK_GT_I32", "s_mov_b32 s14, 5\n  s_cmpk_gt_i32 s14, 0xfffe", None, 1),
    *scalar("S_CMPK_GE_I32", "s_mov_b32 s14, 5\n  s_cmpk_ge_i32 s14, 5", None, 1),
    *scalar("S_CMPK_LT_I32", "s_mov_b32 s14, 5\n  s_cmpk_lt_i32 s14, 0xfffe", None, 0),
    *scalar("S_CMPK_LE_I32", "s_mov_b32 s14, -3\n  s_cmpk_le_i32 s14, 0xfffd", None, 1),
]

# EXEC changes: the old EXEC into s[16:17], the new one read back, EXEC restored before v6 is written.
_SAVE, _RESTORE = "  s_mov_b64 s[22:23], exec\n", "  s_mov_b64 exec, s[22:23]\n"
_MASK = 0x0000FFFF_F0F0F0F0
for _op, _new in (("and", _MASK), ("or", 2**64 - 1), ("andn2", 0)):
    _instr = (f"  s_mov_b32 s12, {_MASK & M:#x}\n  s_mov_b32 s13, {_MASK >> 32:#x}\n{_SAVE}"
              f"  s_{_op}_saveexec_b64 s[16:17], s[12:13]\n  s_mov_b64 s[18:19], exec\n  s_cselect_b32 s20, 1, 0\n"
              f"{_RESTORE}")
    for _reg, _want in (("s16", M), ("s17", M), ("s18", _new & M), ("s19", _new >> 32), ("s20", int(_new != 0))):
        CASES.append(Case(f"S_{_op.upper()}_SAVEEXEC_B64", f"{_instr}  v_mov_b32 v6, {_reg}\n", _const(_want)))


def _branch(op: str, label: str, setup: str, taken: bool) -> Case:
    """`op` to `label`: s20 = 1 if it was taken, 2 if not."""
    asm = (f"  s_mov_b32 s20, 1\n{setup}  {op} {label}\n  s_mov_b32 s20, 2\n{label}:\n{_RESTORE}"
           f"  v_mov_b32 v6, s20\n")
    return Case(op.upper(), asm, _const(1 if taken else 2))


CASES += [
    _branch("s_branch", ".Lbranch", _SAVE, True),
    _branch("s_cbranch_scc0", ".Lscc0", _SAVE + SCC0, True),
    _branch("s_cbranch_scc1", ".Lscc1", _SAVE + SCC0, False),
    _branch("s_cbranch_vccz", ".Lvccz", _SAVE + "  s_mov_b64 vcc, 0\n", True),
    _branch("s_cbranch_vccnz", ".Lvccnz", _SAVE + "  s_mov_b64 vcc, 0\n", False),
    _branch("s_cbranch_execz", ".Lexecz", _SAVE + "  s_mov_b64 exec, 0\n", True),
    _branch("s_cbranch_execnz", ".Lexecnz", _SAVE + "  s_mov_b64 exec, 0\n", False),
]

# Scalar loads of the inputs (x at byte 0, y at 256): dword k of each load, read back a dword a case.
_INPUTS = lanes(1)
for _op, _count in (("S_LOAD_DWORD", 1), ("S_LOAD_DWORDX2", 2), ("S_LOAD_DWORDX4", 4), ("S_LOAD_DWORDX8", 8),
                    ("S_LOAD_DWORDX16", 16)):
    _first = 16 if _count < 16 else 8  # x16 needs s[8:23]: s[4:7] stay the prologue's
    _regs = "s12" if _count == 1 else f"s[{_first}:{_first + _count - 1}]"
    for _k in sorted({0, _count - 1}):
        _asm = (f"  {_op.lower()} {_regs}, s[4:5], 0x100\n  s_waitcnt lgkmcnt(0)\n"
                f"  v_mov_b32 v6, s{12 if _count == 1 else _first + _k}\n")
        CASES.append(Case(_op, _asm, _const(_INPUTS[_k].y)))


def test_scalar_operations_give_the_isas_answers():
    wrong = run_cases(CASES)
    assert not wrong, "\n".join(wrong[:20])
