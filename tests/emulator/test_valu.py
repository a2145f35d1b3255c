"""The vector ALU (emulator/valu.py): each operation on 64 lanes of seeded inputs (edge values in
lanes 0-4), against the CDNA4 ISA's definition computed here per lane. Float answers round once
from exact (Fraction) or f64 values, as the ISA's IEEE operations do; the transcendentals are the
emulator's stated model (f64 then one rounding, docs/emulator.md)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import Case, Lane, f32, f32_bits, run_cases, s32

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

M = 0xFFFFFFFF


def r32(value: float | Fraction) -> int:
    """The f32 bits of `value` rounded to nearest even (from an exact Fraction or an f64)."""
    if isinstance(value, Fraction):
        value = _round_fraction(value)
    return f32_bits(value)


def _round_fraction(exact: Fraction) -> float:
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return float(min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1)))


def s16(v: int) -> int:
    v &= 0xFFFF
    return v - 0x10000 if v >> 15 else v


def s24(v: int) -> int:
    v &= 0xFFFFFF
    return v - (1 << 24) if v >> 23 else v


def v(op: str, asm: str, want) -> Case:
    return Case(op, f"  {asm}\n", want)


F = Fraction
CASES: list[Case] = [
    # moves, bit operations, integer arithmetic (VOP2 and VOP3 forms)
    v("V_MOV_B32", "v_mov_b32 v6, v4", lambda L: L.x),
    v("V_NOT_B32", "v_not_b32 v6, v4", lambda L: ~L.x),
    v("V_ADD_U32", "v_add_u32 v6, v4, v5", lambda L: L.x + L.y),
    v("V_ADD_U32", "v_add_u32_e64 v6, 7, v5", lambda L: 7 + L.y),
    v("V_SUB_U32", "v_sub_u32 v6, v4, v5", lambda L: L.x - L.y),
    v("V_SUBREV_U32", "v_subrev_u32 v6, v4, v5", lambda L: L.y - L.x),
    v("V_AND_B32", "v_and_b32 v6, v4, v5", lambda L: L.x & L.y),
    v("V_OR_B32", "v_or_b32 v6, v4, v5", lambda L: L.x | L.y),
    v("V_XOR_B32", "v_xor_b32 v6, v4, v5", lambda L: L.x ^ L.y),
    v("V_LSHLREV_B32", "v_lshlrev_b32 v6, v7, v4", lambda L: L.x << L.n),
    v("V_LSHRREV_B32", "v_lshrrev_b32 v6, v7, v4", lambda L: L.x >> L.n),
    v("V_ASHRREV_I32", "v_ashrrev_i32 v6, v7, v4", lambda L: s32(L.x) >> L.n),
    v("V_LSHLREV_B16", "v_lshlrev_b16 v6, v7, v4", lambda L: (L.x & 0xFFFF) << (L.n & 15) & 0xFFFF),
    v("V_LSHRREV_B16", "v_lshrrev_b16 v6, v7, v4", lambda L: (L.x & 0xFFFF) >> (L.n & 15)),
    v("V_ASHRREV_I16", "v_ashrrev_i16 v6, v7, v4", lambda L: (s16(L.x) >> (L.n & 15)) & 0xFFFF),
    v("V_ADD_U16", "v_add_u16 v6, v4, v5", lambda L: (L.x + L.y) & 0xFFFF),
    v("V_SUB_U16", "v_sub_u16 v6, v4, v5", lambda L: (L.x - L.y) & 0xFFFF),
    v("V_MUL_LO_U16", "v_mul_lo_u16 v6, v4, v5", lambda L: (L.x & 0xFFFF) * (L.y & 0xFFFF) & 0xFFFF),
    v("V_MAX_I32", "v_max_i32 v6, v4, v5", lambda L: max(s32(L.x), s32(L.y))),
    v("V_MIN_I32", "v_min_i32 v6, v4, v5", lambda L: min(s32(L.x), s32(L.y))),
    v("V_MAX_U32", "v_max_u32 v6, v4, v5", lambda L: max(L.x, L.y)),
    v("V_MIN_U32", "v_min_u32 v6, v4, v5", lambda L: min(L.x, L.y)),
    v("V_MUL_U32_U24", "v_mul_u32_u24 v6, v4, v5", lambda L: (L.x & 0xFFFFFF) * (L.y & 0xFFFFFF)),
    v("V_MUL_I32_I24", "v_mul_i32_i24 v6, v4, v5", lambda L: s24(L.x) * s24(L.y)),
    v("V_MAD_U32_U24", "v_mad_u32_u24 v6, v4, v5, v7", lambda L: (L.x & 0xFFFFFF) * (L.y & 0xFFFFFF) + L.n),
    v("V_MAD_I32_I24", "v_mad_i32_i24 v6, v4, v5, v7", lambda L: s24(L.x) * s24(L.y) + L.n),
    v("V_MUL_LO_U32", "v_mul_lo_u32 v6, v4, v5", lambda L: L.x * L.y),
    v("V_MUL_HI_U32", "v_mul_hi_u32 v6, v4, v5", lambda L: (L.x * L.y) >> 32),
    v("V_MUL_HI_I32", "v_mul_hi_i32 v6, v4, v5", lambda L: (s32(L.x) * s32(L.y)) >> 32),
    v("V_BCNT_U32_B32", "v_bcnt_u32_b32 v6, v4, v7", lambda L: bin(L.x).count("1") + L.n),
    v("V_ADD3_U32", "v_add3_u32 v6, v4, v5, v7", lambda L: L.x + L.y + L.n),
    v("V_XAD_U32", "v_xad_u32 v6, v4, v5, v7", lambda L: (L.x ^ L.y) + L.n),
    v("V_ADD_LSHL_U32", "v_add_lshl_u32 v6, v4, v5, v7", lambda L: (L.x + L.y) << L.n),
    v("V_LSHL_ADD_U32", "v_lshl_add_u32 v6, v4, v7, v5", lambda L: (L.x << L.n) + L.y),
    v("V_LSHL_OR_B32", "v_lshl_or_b32 v6, v4, v7, v5", lambda L: (L.x << L.n) | L.y),
    v("V_AND_OR_B32", "v_and_or_b32 v6, v4, v5, v7", lambda L: (L.x & L.y) | L.n),
    v("V_OR3_B32", "v_or3_b32 v6, v4, v5, v7", lambda L: L.x | L.y | L.n),
    v("V_BFI_B32", "v_bfi_b32 v6, v4, v5, v7", lambda L: (L.x & L.y) | (~L.x & L.n)),
    v("V_ALIGNBIT_B32", "v_alignbit_b32 v6, v4, v5, v7", lambda L: ((L.x << 32 | L.y) >> L.n)),
    v("V_BFE_U32", "v_bfe_u32 v6, v4, v7, 9", lambda L: L.x >> L.n & 0x1FF),
    v("V_BFE_I32", "v_bfe_i32 v6, v4, v7, 9", lambda L: (L.x >> L.n & 0x1FF) - (0x200 if L.x >> (L.n + 8) & 1 else 0)),
    v("V_MIN3_I32", "v_min3_i32 v6, v4, v5, v7", lambda L: min(s32(L.x), s32(L.y), L.n)),
    v("V_MED3_I32", "v_med3_i32 v6, v4, v5, v7", lambda L: sorted([s32(L.x), s32(L.y), L.n])[1]),
    v("V_MED3_U32", "v_med3_u32 v6, v4, v5, v7", lambda L: sorted([L.x, L.y, L.n])[1]),
    v("V_BITOP3_B32", "v_bitop3_b32 v6, v4, v5, v7 bitop3:0x96", lambda L: L.x ^ L.y ^ L.n),
    v("V_BITOP3_B16", "v_bitop3_b16 v6, v4, v5, v7 bitop3:0xe8",
      lambda L: ((L.x & L.y) | (L.x & L.n) | (L.y & L.n)) & 0xFFFF),
    v("V_PERM_B32", "v_mov_b32 v10, 0x0c0a0704\n  v_perm_b32 v6, v4, v5, v10",
      lambda L: _perm(L.x, L.y, 0x0C0A0704)),
    v("V_CNDMASK_B32", "v_cmp_gt_u32 vcc, v4, v5\n  v_cndmask_b32 v6, v4, v5, vcc",
      lambda L: L.y if L.x > L.y else L.x),
    v("V_CNDMASK_B32", "v_cmp_gt_u32 s[20:21], v4, v5\n  v_cndmask_b32_e64 v6, v4, v5, s[20:21]",
      lambda L: L.y if L.x > L.y else L.x),
    # carries: the sum, then the carry-out lane mask read back as a lane's bit
    v("V_ADD_CO_U32", "v_add_co_u32 v6, vcc, v4, v5", lambda L: L.x + L.y),
    v("V_ADD_CO_U32", "v_add_co_u32 v10, vcc, v4, v5\n  v_cndmask_b32 v6, 0, 1, vcc", lambda L: (L.x + L.y) >> 32),
    v("V_ADDC_CO_U32", "v_add_co_u32 v10, vcc, v4, v5\n  v_addc_co_u32 v6, vcc, v5, v4, vcc",
      lambda L: L.x + L.y + ((L.x + L.y) >> 32)),
    v("V_SUB_CO_U32", "v_sub_co_u32 v10, vcc, v4, v5\n  v_cndmask_b32 v6, 0, 1, vcc", lambda L: int(L.y > L.x)),
    v("V_SUBREV_CO_U32", "v_subrev_co_u32 v6, vcc, v4, v5", lambda L: L.y - L.x),
    v("V_SUBB_CO_U32", "v_sub_co_u32 v10, vcc, v4, v5\n  v_subb_co_u32 v6, vcc, v5, v4, vcc",
      lambda L: L.y - L.x - int(L.y > L.x)),
    v("V_SUBBREV_CO_U32", "v_sub_co_u32 v10, vcc, v4, v5\n  v_subbrev_co_u32 v6, vcc, v5, v4, vcc",
      lambda L: L.x - L.y - int(L.y > L.x)),
    v("V_MAD_U64_U32", "v_mad_u64_u32 v[10:11], s[20:21], v4, v5, v[4:5]\n  v_mov_b32 v6, v11",
      lambda L: (L.x * L.y + (L.y << 32 | L.x)) >> 32),
    v("V_LSHLREV_B64", "v_lshlrev_b64 v[10:11], 5, v[4:5]\n  v_mov_b32 v6, v11", lambda L: (L.y << 32 | L.x) << 5 >> 32),
    v("V_LSHL_ADD_U64", "v_lshl_add_u64 v[10:11], v[4:5], 3, v[4:5]\n  v_mov_b32 v6, v11",
      lambda L: 9 * (L.y << 32 | L.x) >> 32),
    v("V_MOV_B64", "v_mov_b64 v[10:11], v[4:5]\n  v_mov_b32 v6, v11", lambda L: L.y),
    # float arithmetic
    v("V_ADD_F32", "v_add_f32 v6, v8, v9", lambda L: r32(F(L.f) + F(L.g))),
    v("V_SUB_F32", "v_sub_f32 v6, v8, v9", lambda L: r32(F(L.f) - F(L.g))),
    v("V_SUBREV_F32", "v_subrev_f32 v6, v8, v9", lambda L: r32(F(L.g) - F(L.f))),
    v("V_MUL_F32", "v_mul_f32 v6, v8, v9", lambda L: r32(F(L.f) * F(L.g))),
    v("V_MUL_F32", "v_mul_f32_e64 v6, -v8, |v9|", lambda L: r32(-F(L.f) * abs(F(L.g)))),
    v("V_FMA_F32", "v_fma_f32 v6, v8, v9, v8", lambda L: r32(F(L.f) * F(L.g) + F(L.f))),
    v("V_FMAC_F32", "v_mov_b32 v6, v9\n  v_fmac_f32 v6, v8, v8", lambda L: r32(F(L.f) * F(L.f) + F(L.g))),
    v("V_FMAMK_F32", "v_fmamk_f32 v6, v8, 0x40400000, v9", lambda L: r32(F(L.f) * 3 + F(L.g))),
    v("V_FMAAK_F32", "v_fmaak_f32 v6, v8, v9, 0x3fc00000", lambda L: r32(F(L.f) * F(L.g) + F(3, 2))),
    v("V_MAX_F32", "v_max_f32 v6, v8, v9", lambda L: f32_bits(max(L.f, L.g))),
    v("V_MIN_F32", "v_min_f32 v6, v8, v9", lambda L: f32_bits(min(L.f, L.g))),
    v("V_MAXIMUM3_F32", "v_maximum3_f32 v6, v8, v9, 1.0", lambda L: f32_bits(max(L.f, L.g, 1.0))),
    v("V_MINIMUM3_F32", "v_minimum3_f32 v6, v8, v9, 1.0", lambda L: f32_bits(min(L.f, L.g, 1.0))),
    v("V_LDEXP_F32", "v_ldexp_f32 v6, v8, v7", lambda L: r32(F(L.f) * 2 ** L.n)),
    v("V_TRUNC_F32", "v_mul_f32 v10, 4.0, v8\n  v_trunc_f32 v6, v10", lambda L: f32_bits(math.trunc(4 * L.f))),
    v("V_RNDNE_F32", "v_mul_f32 v10, 4.0, v8\n  v_rndne_f32 v6, v10", lambda L: f32_bits(round(4 * L.f))),
    v("V_EXP_F32", "v_exp_f32 v6, v8", lambda L: r32(2.0 ** L.f)),
    v("V_LOG_F32", "v_log_f32_e64 v6, |v8|", lambda L: r32(math.log2(abs(L.f)))),
    v("V_RCP_F32", "v_rcp_f32 v6, v8", lambda L: r32(1 / F(L.f))),
    v("V_RCP_IFLAG_F32", "v_rcp_iflag_f32 v6, v8", lambda L: r32(1 / F(L.f))),
    v("V_SQRT_F32", "v_sqrt_f32_e64 v6, |v8|", lambda L: r32(math.sqrt(abs(L.f)))),
    v("V_RSQ_F32", "v_rsq_f32_e64 v6, |v8|", lambda L: r32(1 / math.sqrt(abs(L.f)))),
    # division helpers on ordinary operands: scale passes S0 through, fmas without VCC is an fma,
    # fixup returns the quotient's magnitude with the sign of numerator x denominator
    v("V_DIV_SCALE_F32", "v_div_scale_f32 v6, vcc, v8, v9, v8", lambda L: L.f_bits),
    v("V_DIV_FMAS_F32", "s_mov_b64 vcc, 0\n  v_div_fmas_f32 v6, v8, v9, v8", lambda L: r32(F(L.f) * F(L.g) + F(L.f))),
    v("V_DIV_FIXUP_F32", "v_div_fixup_f32 v6, v8, v9, v8",
      lambda L: f32_bits(math.copysign(abs(L.f), L.f * L.g))),
    # conversions
    v("V_CVT_F32_U32", "v_cvt_f32_u32 v6, v4", lambda L: r32(F(L.x))),
    v("V_CVT_F32_I32", "v_cvt_f32_i32 v6, v4", lambda L: r32(F(s32(L.x)))),
    v("V_CVT_U32_F32", "v_mul_f32 v10, 0x447a0000, v8\n  v_cvt_u32_f32 v6, v10",
      lambda L: max(0, math.trunc(f32(r32(F(L.f) * 1000))))),
    v("V_CVT_I32_F32", "v_mul_f32 v10, 0x447a0000, v8\n  v_cvt_i32_f32 v6, v10",
      lambda L: math.trunc(f32(r32(F(L.f) * 1000)))),
    *[v(f"V_CVT_F32_UBYTE{k}", f"v_cvt_f32_ubyte{k} v6, v4", lambda L, k=k: r32(F(L.x >> 8 * k & 0xFF)))
      for k in range(4)],
    v("V_CVT_PK_BF16_F32", "v_cvt_pk_bf16_f32 v6, v8, v9", lambda L: _bf16(L.f) | _bf16(L.g) << 16),
    v("V_CVT_PK_FP8_F32", "v_mov_b32 v6, v4\n  v_cvt_pk_fp8_f32 v6, v8, v9 op_sel:[0,0,1]",
      lambda L: (L.x & 0xFFFF) | (_e4m3(L.f) | _e4m3(L.g) << 8) << 16),
    v("V_CVT_PK_F32_FP8", "v_cvt_pk_f32_fp8 v[10:11], v4\n  v_mov_b32 v6, v11", lambda L: f32_bits(_fp8(L.x >> 8 & 0xFF))),
    v("V_CVT_PK_F32_FP8", "v_cvt_pk_f32_fp8_sdwa v[10:11], v4 src0_sel:WORD_1\n  v_mov_b32 v6, v10",
      lambda L: f32_bits(_fp8(L.x >> 16 & 0xFF))),
    v("V_CVT_SCALEF32_PK_F32_FP8", "v_cvt_scalef32_pk_f32_fp8 v[10:11], v4, v9\n  v_mov_b32 v6, v10",
      lambda L: f32_bits(_fp8(L.x & 0xFF) * 2.0 ** math.floor(math.log2(abs(L.g))))),
    v("V_CVT_SCALEF32_PK_BF16_FP8", "v_cvt_scalef32_pk_bf16_fp8 v6, v4, v9",
      lambda L: _bf16(_fp8(L.x & 0xFF) * 2.0 ** math.floor(math.log2(abs(L.g))))
      | _bf16(_fp8(L.x >> 8 & 0xFF) * 2.0 ** math.floor(math.log2(abs(L.g)))) << 16),
    # packed f32: lanes of a register pair, OP_SEL_HI picking each source's dword for the high half
    v("V_PK_MOV_B32", "v_pk_mov_b32 v[10:11], v[4:5], v[8:9] op_sel:[1,0]\n  v_xor_b32 v6, v10, v11",
      lambda L: L.y ^ L.f_bits),
    v("V_PK_ADD_F32", "v_pk_add_f32 v[10:11], v[8:9], v[8:9] op_sel_hi:[0,1]\n  v_mov_b32 v6, v11",
      lambda L: r32(F(L.f) + F(L.g))),
    v("V_PK_MUL_F32", "v_pk_mul_f32 v[10:11], v[8:9], v[8:9]\n  v_mov_b32 v6, v10", lambda L: r32(F(L.f) * F(L.f))),
    v("V_PK_FMA_F32", "v_pk_fma_f32 v[10:11], v[8:9], v[8:9], v[8:9]\n  v_mov_b32 v6, v11",
      lambda L: r32(F(L.g) * F(L.g) + F(L.g))),
    # SDWA: a byte / word select with sign extension before the operation
    v("V_ADD_U32", "v_add_u32_sdwa v6, sext(v4), v5 dst_sel:DWORD src0_sel:BYTE_1 src1_sel:WORD_1",
      lambda L: s32((L.x >> 8 & 0xFF) - (0x100 if L.x >> 15 & 1 else 0)) + (L.y >> 16)),
    # DPP: row_shr:1 with bound_ctrl (lane 0 of each row reads 0)
    v("V_MOV_B32", "v_mov_b32_dpp v6, v4 row_shr:1 row_mask:0xf bank_mask:0xf bound_ctrl:1",
      lambda L: 0 if L.lane % 16 == 0 else _LANES[L.lane - 1].x),
]


def _compare(op: str, want) -> Case:
    """A V_CMP_* into VCC (VOPC) read back as the lane's bit."""
    return Case(op, f"  {op.lower()} vcc, v4, v5\n  v_cndmask_b32 v6, 0, 1, vcc\n", lambda L: int(want(L)))


def _fcompare(op: str, want) -> Case:
    return Case(op, f"  {op.lower()}_e64 s[20:21], v8, v9\n  v_cndmask_b32_e64 v6, 0, 1, s[20:21]\n",
                lambda L: int(want(L.f, L.g)))


CASES += [
    _compare("V_CMP_EQ_U32", lambda L: L.x == L.y), _compare("V_CMP_NE_U32", lambda L: L.x != L.y),
    _compare("V_CMP_GT_U32", lambda L: L.x > L.y), _compare("V_CMP_GE_U32", lambda L: L.x >= L.y),
    _compare("V_CMP_LT_U32", lambda L: L.x < L.y), _compare("V_CMP_LE_U32", lambda L: L.x <= L.y),
    _compare("V_CMP_EQ_I32", lambda L: L.x == L.y), _compare("V_CMP_NE_I32", lambda L: L.x != L.y),
    _compare("V_CMP_GT_I32", lambda L: s32(L.x) > s32(L.y)), _compare("V_CMP_GE_I32", lambda L: s32(L.x) >= s32(L.y)),
    _compare("V_CMP_LT_I32", lambda L: s32(L.x) < s32(L.y)), _compare("V_CMP_LE_I32", lambda L: s32(L.x) <= s32(L.y)),
    _compare("V_CMP_GT_I16", lambda L: s16(L.x) > s16(L.y)),
    Case("V_CMP_EQ_U64", "  v_cmp_eq_u64 vcc, v[4:5], v[4:5]\n  v_cndmask_b32 v6, 0, 1, vcc\n", lambda L: 1),
    Case("V_CMP_NE_U64", "  v_cmp_ne_u64 vcc, v[4:5], v[8:9]\n  v_cndmask_b32 v6, 0, 1, vcc\n",
         lambda L: int((L.y << 32 | L.x) != (L.g_bits << 32 | L.f_bits))),
    Case("V_CMP_GT_I64", "  v_cmp_gt_i64 vcc, v[4:5], v[8:9]\n  v_cndmask_b32 v6, 0, 1, vcc\n",
         lambda L: int(_s64(L.y << 32 | L.x) > _s64(L.g_bits << 32 | L.f_bits))),
    _fcompare("V_CMP_EQ_F32", lambda a, b: a == b), _fcompare("V_CMP_GE_F32", lambda a, b: a >= b),
    _fcompare("V_CMP_GT_F32", lambda a, b: a > b), _fcompare("V_CMP_LE_F32", lambda a, b: a <= b),
    _fcompare("V_CMP_LT_F32", lambda a, b: a < b), _fcompare("V_CMP_NEQ_F32", lambda a, b: not a == b),
    _fcompare("V_CMP_O_F32", lambda a, b: True), _fcompare("V_CMP_NGT_F32", lambda a, b: not a > b),
    _fcompare("V_CMP_NLT_F32", lambda a, b: not a < b),
    # class mask 0x108: +-normal except positive... bit 3 negative normal, bit 8 positive normal
    Case("V_CMP_CLASS_F32", "  v_mov_b32 v10, 0x8\n  v_cmp_class_f32 vcc, v8, v10\n  v_cndmask_b32 v6, 0, 1, vcc\n",
         lambda L: int(L.f < 0)),
]


def _s64(v: int) -> int:
    return v - (1 << 64) if v >> 63 else v


def _perm(x: int, y: int, selector: int) -> int:
    data, out = y | x << 32, 0
    for k in range(4):
        sel = selector >> 8 * k & 0xFF
        byte = 0 if sel == 12 else 0xFF if sel >= 13 else (0xFF if data >> (8 * (2 * (sel - 8) + 1) + 7) & 1 else 0) \
            if sel >= 8 else data >> 8 * sel & 0xFF
        out |= byte << 8 * k
    return out


def _bf16(value: float) -> int:
    """bf16 bits of `value` rounded to nearest even; NaN as the quiet NaN (docs/emulator.md)."""
    import torch

    if math.isnan(value):
        return 0x7FC0
    return int(torch.tensor([value]).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def _e4m3(value: float) -> int:
    import torch

    return int(torch.tensor([value]).to(torch.float8_e4m3fn).view(torch.uint8).item())


def _fp8(code: int) -> float:
    """An e4m3 code's value; its NaN codes (S.1111.111) as the quiet NaN the emulator makes."""
    import torch

    value = float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
    return math.nan if math.isnan(value) else value


_LANES: list[Lane] = []


def test_vector_operations_give_the_isas_answers():
    from instruction_cases import lanes

    _LANES[:] = lanes(1)
    wrong = run_cases(CASES)
    assert not wrong, "\n".join(wrong[:30])
