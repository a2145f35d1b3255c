"""The vector ALU: VOP1 / VOP2 / VOP3 / VOP3SD / VOPC / VOP3P operations (compares, the division
helpers, DPP moves, the packed f32 forms, conversions), except the cross-lane ones and MFMA.

The frequent plain operations run in `common_valu`, one loop over the 64 lanes each (which LLVM
vectorises); every other operation goes through `valu`'s per-lane table."""

from __future__ import annotations

import math

import numpy as np

from . import ops as O
from .decode import (F_ABS, F_CLASS, F_DST, F_FLAGS, F_FORMAT, F_LIT, F_NEG, F_NEG_HI, F_OFFSET, F_OFFSET1, F_OPSEL,
                     F_OPSEL_HI, F_SDST, F_SEL0, F_SEL1, F_SEXT, F_SRC0, F_SRC1, F_SRC2, FLAG_DPP, FLAG_SDWA)
from .jit_cache import njit
from .numerics import (cvt_i32, cvt_u32, f32_exponent, f32_to_fp8, f32bits_to_bf16, fma32, fp8_to_f64, maximum, minimum,
                       mul_hi_u32, sext16, sext24, sext32)
from .operands import float_modifiers, read, sdwa_select, set64, sval, write
from .state import M32, VCC


@njit(cache=True, error_model="numpy")
def compare(op, a, b, fa, fb):
    """V_CMP_* on one lane: integer operands `a`, `b` (u32 / u64 bits), float views `fa`, `fb`."""
    if op == O.OP_V_CMP_EQ_F32:
        return fa == fb
    if op == O.OP_V_CMP_GE_F32:
        return fa >= fb
    if op == O.OP_V_CMP_GT_F32:
        return fa > fb
    if op == O.OP_V_CMP_LE_F32:
        return fa <= fb
    if op == O.OP_V_CMP_LT_F32:
        return fa < fb
    if op == O.OP_V_CMP_NEQ_F32:  # unordered or not equal
        return not (fa == fb)
    if op == O.OP_V_CMP_O_F32:
        return fa == fa and fb == fb
    if op == O.OP_V_CMP_NGT_F32:
        return not (fa > fb)
    if op == O.OP_V_CMP_NLT_F32:
        return not (fa < fb)
    if op == O.OP_V_CMP_CLASS_F32:
        e, m = a >> 23 & 0xFF, a & 0x7FFFFF
        negative = a >> 31 & 1
        if e == 255 and m:
            bit = 1 if m & 0x400000 else 0  # quiet NaN : signalling NaN
        elif e == 255:
            bit = 2 if negative else 9
        elif e:
            bit = 3 if negative else 8
        elif m:
            bit = 4 if negative else 7
        else:
            bit = 5 if negative else 6
        return (b >> bit) & 1 == 1
    if op == O.OP_V_CMP_EQ_U32 or op == O.OP_V_CMP_EQ_I32 or op == O.OP_V_CMP_EQ_U64:
        return a == b
    if op == O.OP_V_CMP_NE_U32 or op == O.OP_V_CMP_NE_I32 or op == O.OP_V_CMP_NE_U64:
        return a != b
    if op == O.OP_V_CMP_GT_I64:  # the operands' 64 bits as two's complement: a and b as they are
        return a > b
    if op == O.OP_V_CMP_GT_U32:
        return a > b
    if op == O.OP_V_CMP_GE_U32:
        return a >= b
    if op == O.OP_V_CMP_LT_U32:
        return a < b
    if op == O.OP_V_CMP_LE_U32:
        return a <= b
    if op == O.OP_V_CMP_GT_I16:
        return sext16(a) > sext16(b)
    x, y = sext32(a), sext32(b)
    if op == O.OP_V_CMP_GE_I32:
        return x >= y
    if op == O.OP_V_CMP_GT_I32:
        return x > y
    if op == O.OP_V_CMP_LE_I32:
        return x <= y
    return x < y  # V_CMP_LT_I32


@njit(cache=True, error_model="numpy")
def div_scale(s0, s1, s2, b1, b2):
    """V_DIV_SCALE_F32 on one lane (CDNA4 pseudocode): (result, VCC bit)."""
    if s2 == 0.0 or s1 == 0.0:
        return np.float32(np.nan), 0
    e1, e2 = f32_exponent(b1), f32_exponent(b2)
    quotient = np.float32(s2 / s1)
    q_denormal = quotient != 0.0 and abs(quotient) < 1.1754943508222875e-38
    if e2 - e1 >= 96:
        return (np.float32(s0 * 2.0 ** 64) if s0 == s1 else s0), 1
    if e1 == 0:  # S1 denormal
        return np.float32(s0 * 2.0 ** 64), 0
    if q_denormal:
        return (np.float32(s0 * 2.0 ** 64) if s0 == s2 else s0), 1
    if e2 <= 23:  # numerator tiny
        return np.float32(s0 * 2.0 ** 64), 0
    return s0, 0


@njit(cache=True, error_model="numpy")
def div_fixup(s0, s1, s2, b1, b2):
    """V_DIV_FIXUP_F32 on one lane (CDNA4 pseudocode; S1 the denominator, S2 the numerator)."""
    negative = ((b1 ^ b2) >> 31) & 1
    if s2 != s2:
        return s2
    if s1 != s1:
        return s1
    if s1 == 0.0 and s2 == 0.0:
        return np.float32(np.nan)
    if math.isinf(s1) and math.isinf(s2):
        return np.float32(np.nan)
    if s1 == 0.0 or math.isinf(s2):
        return np.float32(-np.inf if negative else np.inf)
    if math.isinf(s1) or s2 == 0.0:
        return np.float32(-0.0 if negative else 0.0)
    if f32_exponent(b2) - f32_exponent(b1) < -150:
        return np.float32(-0.0 if negative else 0.0)
    return np.float32(-abs(s0) if negative else abs(s0))


@njit(cache=True)
def dpp_source(ctrl, lane):
    """The lane a DPP control reads for `lane`, or -1 where it has no source (gfx9 DPP_CTRL:
    quad_perm 0x00-0xFF, row_shl 0x101-0x10F, row_shr 0x111-0x11F, row_ror 0x121-0x12F,
    wave_shl / rol / shr / ror 0x130 / 0x134 / 0x138 / 0x13C, row_mirror 0x140,
    row_half_mirror 0x141, row_bcast15 0x142, row_bcast31 0x143; AMD Vega ISA "DPP", LLVM
    SIDefines.h DppCtrl). Rows are 16 lanes."""
    row, within = lane & ~15, lane & 15
    if ctrl <= 0xFF:
        return (lane & ~3) | (ctrl >> (2 * (lane & 3)) & 3)
    if 0x101 <= ctrl <= 0x10F:
        n = within + (ctrl - 0x100)
        return row + n if n < 16 else -1
    if 0x111 <= ctrl <= 0x11F:
        n = within - (ctrl - 0x110)
        return row + n if n >= 0 else -1
    if 0x121 <= ctrl <= 0x12F:
        return row + (within - (ctrl - 0x120)) % 16
    if ctrl == 0x130:
        return lane + 1 if lane < 63 else -1
    if ctrl == 0x134:
        return (lane + 1) % 64
    if ctrl == 0x138:
        return lane - 1 if lane > 0 else -1
    if ctrl == 0x13C:
        return (lane - 1) % 64
    if ctrl == 0x140:
        return row + 15 - within
    if ctrl == 0x141:
        return (lane & ~7) + 7 - (lane & 7)
    if ctrl == 0x142:
        return row - 1 if row >= 16 else -1
    if ctrl == 0x143:
        return 31 if lane >= 32 else -1
    return -2  # not a DPP control


@njit(cache=True)
def dpp_mov(P, i, w, V, T, ex):
    """v_mov_b32 with DPP: lanes of disabled rows / banks keep their value; a lane whose source
    lane is invalid or inactive gets 0 with bound_ctrl, else keeps its value."""
    dst, src, ctrl, masks = P[i, F_DST], P[i, F_SRC0] - 256, P[i, F_OFFSET], P[i, F_OFFSET1]
    row_mask, bank_mask, bound_zero = masks & 0xF, masks >> 4 & 0xF, masks >> 8 & 1
    for lane in range(64):
        T[3, lane] = V[w, dst, lane]
        if not (row_mask >> (lane // 16) & 1 and bank_mask >> (lane % 16 // 4) & 1):
            continue
        source = dpp_source(ctrl, lane)
        if source >= 0 and ex >> source & 1:
            T[3, lane] = V[w, src, source]
        elif bound_zero:
            T[3, lane] = 0
    write(V, T, w, dst, 3, ex)


@njit(cache=True, error_model="numpy")
def common_valu(op, T, TF, select):
    """The most frequent plain operations of our kernels, one loop over the lanes each (which
    LLVM vectorises), result in T[3]; False for every other operation (CDNA4 ISA pseudocode of
    each op). `valu` tries it first, so these operations have no branch in its per-lane table."""
    if op == O.OP_V_MOV_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane]
    elif op == O.OP_V_ADD_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] + TF[1, lane]
    elif op == O.OP_V_SUB_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] - TF[1, lane]
    elif op == O.OP_V_MUL_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] * TF[1, lane]
    elif op == O.OP_V_FMA_F32 or op == O.OP_V_FMAC_F32:
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[1, lane], TF[2, lane])
    elif op == O.OP_V_FMAMK_F32:  # fma(S0, K, S1); K (the literal) was read as S2
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[2, lane], TF[1, lane])
    elif op == O.OP_V_FMAAK_F32:  # fma(S0, S1, K)
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[1, lane], TF[2, lane])
    elif op == O.OP_V_ADD_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] + T[1, lane]
    elif op == O.OP_V_SUB_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] - T[1, lane]
    elif op == O.OP_V_AND_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] & T[1, lane]
    elif op == O.OP_V_OR_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] | T[1, lane]
    elif op == O.OP_V_XOR_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] ^ T[1, lane]
    elif op == O.OP_V_LSHLREV_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] << (T[0, lane] & np.uint32(31))
    elif op == O.OP_V_LSHRREV_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] >> (T[0, lane] & np.uint32(31))
    elif op == O.OP_V_ASHRREV_I32:
        TI = T.view(np.int32)
        for lane in range(64):
            TI[3, lane] = TI[1, lane] >> (TI[0, lane] & 31)
    elif op == O.OP_V_CNDMASK_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] if select >> lane & 1 else T[0, lane]
    elif op == O.OP_V_LSHL_ADD_U32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] << (T[1, lane] & np.uint32(31))) + T[2, lane]
    elif op == O.OP_V_ADD_LSHL_U32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] + T[1, lane]) << (T[2, lane] & np.uint32(31))
    elif op == O.OP_V_LSHL_OR_B32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] << (T[1, lane] & np.uint32(31))) | T[2, lane]
    elif op == O.OP_V_ADD3_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] + T[1, lane] + T[2, lane]
    elif op == O.OP_V_MUL_U32_U24:
        for lane in range(64):
            T[3, lane] = (T[0, lane] & np.uint32(0xFFFFFF)) * (T[1, lane] & np.uint32(0xFFFFFF))
    else:
        return False
    return True


@njit(cache=True, error_model="numpy")
def packed_f32(P, i, w, S, V, T, TF, ex, op):
    """V_PK_ADD_F32 / V_PK_MUL_F32 / V_PK_FMA_F32: two f32 lanes a register pair. Each source's
    low and high result take its low or high dword by OP_SEL / OP_SEL_HI, negated by NEG /
    NEG_HI (CDNA4 ISA, VOP3P); a constant's high dword is 0. Rows: 0-2 the low dwords (read),
    5-7 the high ones; the picked operands go to X (lo 0-2, hi 3-5)."""
    sources = (P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2])
    opsel, opsel_hi, neg_lo, neg_hi = P[i, F_OPSEL], P[i, F_OPSEL_HI], P[i, F_NEG], P[i, F_NEG_HI]
    X = np.empty((6, 64), np.uint32)
    for k in range(3):
        code = sources[k]
        for lane in range(64):
            T[5 + k, lane] = V[w, code - 256 + 1, lane] if code >= 256 else (S[w, code + 1] if code < 128 else 0)
        row_lo, row_hi = (5 + k if opsel >> k & 1 else k), (5 + k if opsel_hi >> k & 1 else k)
        mask_lo = np.uint32(0x80000000) if neg_lo >> k & 1 else np.uint32(0)
        mask_hi = np.uint32(0x80000000) if neg_hi >> k & 1 else np.uint32(0)
        for lane in range(64):
            X[k, lane] = T[row_lo, lane] ^ mask_lo
            X[3 + k, lane] = T[row_hi, lane] ^ mask_hi
    XF = X.view(np.float32)
    for half in range(2):
        a, b, c = 3 * half, 3 * half + 1, 3 * half + 2
        if op == O.OP_V_PK_ADD_F32:
            for lane in range(64):
                TF[3 + half, lane] = XF[a, lane] + XF[b, lane]
        elif op == O.OP_V_PK_MUL_F32:
            for lane in range(64):
                TF[3 + half, lane] = XF[a, lane] * XF[b, lane]
        else:
            for lane in range(64):
                TF[3 + half, lane] = np.float32(np.float64(XF[a, lane]) * np.float64(XF[b, lane])
                                                + np.float64(XF[c, lane]))
    dst = P[i, F_DST]
    write(V, T, w, dst, 3, ex)
    write(V, T, w, dst + 1, 4, ex)


@njit(cache=True, error_model="numpy")
def valu(P, i, w, S, V, T, TF, ex, op):
    """Every VOP1 / VOP2 / VOP3 / VOP3SD / VOPC / VOP3P operation except the cross-lane ones."""
    lit, dst = P[i, F_LIT], P[i, F_DST]
    flags = P[i, F_FLAGS]
    s0, s1, s2 = P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2]
    if flags & FLAG_DPP:
        dpp_mov(P, i, w, V, T, ex)
        return
    read(S, V, T, w, s0, lit, 0, 0)
    read(S, V, T, w, s1, lit, 1, 0)
    read(S, V, T, w, s2, lit, 2, 0)
    if flags & FLAG_SDWA:
        sdwa_select(T, 0, P[i, F_SEL0], P[i, F_SEXT] & 1)
        sdwa_select(T, 1, P[i, F_SEL1], P[i, F_SEXT] >> 1 & 1)
    neg, ab = P[i, F_NEG], P[i, F_ABS]
    if (neg | ab) and P[i, F_CLASS] != O.PACKED:
        for r in range(3):
            float_modifiers(T, r, neg >> r & 1, ab >> r & 1)
    if op == O.OP_V_PK_MOV_B32:  # D.lo = S0's OPSEL[0] half, D.hi = S1's OPSEL[1] half (CDNA4 pseudocode)
        opsel = P[i, F_OPSEL]
        read(S, V, T, w, s0, lit, 3, opsel & 1)
        read(S, V, T, w, s1, lit, 4, opsel >> 1 & 1)
        write(V, T, w, dst, 3, ex)
        write(V, T, w, dst + 1, 4, ex)
        return
    if op == O.OP_V_PK_ADD_F32 or op == O.OP_V_PK_MUL_F32 or op == O.OP_V_PK_FMA_F32:
        packed_f32(P, i, w, S, V, T, TF, ex, op)
        return
    if common_valu(op, T, TF, sval(S, w, s2, 0, True) if s2 < 256 else 0):
        write(V, T, w, dst, 3, ex)
        return
    # Compares: the lane bits of active lanes (inactive lanes read 0) into an SGPR pair.
    if op >= O.OP_V_CMP_EQ_F32 and op <= O.OP_V_CMP_GT_I64:
        wide = op == O.OP_V_CMP_EQ_U64 or op == O.OP_V_CMP_NE_U64 or op == O.OP_V_CMP_GT_I64
        if wide:
            read(S, V, T, w, s0, lit, 4, 1)
            read(S, V, T, w, s1, lit, 5, 1)
        mask = np.int64(0)
        for lane in range(64):
            if ex >> lane & 1:
                a, b = np.int64(T[0, lane]), np.int64(T[1, lane])
                if wide:
                    a |= np.int64(T[4, lane]) << 32
                    b |= np.int64(T[5, lane]) << 32
                if compare(op, a, b, TF[0, lane], TF[1, lane]):
                    mask |= np.int64(1) << lane
        set64(S, w, dst, mask)
        return
    carry_in = sval(S, w, s2, 0, True) if s2 < 256 else 0  # VCC / an SGPR pair for carries and selects
    carry_out = np.int64(0)
    two = False  # a 64-bit result in T[3] (low) and T[4] (high)
    for lane in range(64):
        a, b, c = np.int64(T[0, lane]), np.int64(T[1, lane]), np.int64(T[2, lane])
        fa, fb, fc = TF[0, lane], TF[1, lane], TF[2, lane]
        cin = carry_in >> lane & 1
        r = np.int64(0)
        f = np.float32(0.0)
        is_float = False
        if op == O.OP_V_MOV_B64:
            two = True
            r = a
            T[4, lane] = np.int64(V[w, s0 - 256 + 1, lane]) if s0 >= 256 else (
                sval(S, w, s0, lit, True) >> 32 & M32 if s0 < 128 or (193 <= s0 <= 208) else 0)
        elif op == O.OP_V_NOT_B32:
            r = ~a
        elif op == O.OP_V_CVT_F32_U32:
            f, is_float = np.float32(a), True
        elif op == O.OP_V_CVT_F32_I32:
            f, is_float = np.float32(sext32(a)), True
        elif op >= O.OP_V_CVT_F32_UBYTE0 and op <= O.OP_V_CVT_F32_UBYTE3:  # byte n of S0, unsigned
            f, is_float = np.float32(a >> (8 * (op - O.OP_V_CVT_F32_UBYTE0)) & 0xFF), True
        elif op == O.OP_V_CVT_U32_F32:
            r = cvt_u32(fa)
        elif op == O.OP_V_CVT_I32_F32:
            r = cvt_i32(fa)
        # Transcendentals: correctly rounded here (computed in f64, rounded once); the hardware's
        # are approximations of about 1 ulp.
        elif op == O.OP_V_EXP_F32:
            f, is_float = np.float32(2.0 ** np.float64(fa)), True
        elif op == O.OP_V_LOG_F32:
            f, is_float = np.float32(np.log2(np.float64(fa))), True
        elif op == O.OP_V_RCP_F32 or op == O.OP_V_RCP_IFLAG_F32:
            f, is_float = np.float32(1.0 / np.float64(fa)), True
        elif op == O.OP_V_SQRT_F32:
            f, is_float = np.float32(np.sqrt(np.float64(fa))), True
        elif op == O.OP_V_RSQ_F32:
            f, is_float = np.float32(1.0 / np.sqrt(np.float64(fa))), True
        elif op == O.OP_V_TRUNC_F32:
            f, is_float = np.float32(np.trunc(fa)), True
        elif op == O.OP_V_RNDNE_F32:
            f, is_float = np.float32(np.rint(fa)), True
        elif op == O.OP_V_SUBREV_F32:
            f, is_float = np.float32(fb - fa), True
        elif op == O.OP_V_MAX_F32:
            f, is_float = (fb if fa != fa else fa if fb != fb else max(fa, fb)), True
        elif op == O.OP_V_MIN_F32:
            f, is_float = (fb if fa != fa else fa if fb != fb else min(fa, fb)), True
        elif op == O.OP_V_MAXIMUM3_F32:
            f, is_float = np.float32(maximum(maximum(fa, fb), fc)), True
        elif op == O.OP_V_MINIMUM3_F32:
            f, is_float = np.float32(minimum(minimum(fa, fb), fc)), True
        elif op == O.OP_V_LDEXP_F32:
            f, is_float = np.float32(np.float64(fa) * 2.0 ** max(min(sext32(b), 400), -400)), True
        elif op == O.OP_V_DIV_FMAS_F32:  # VCC from the register, not an operand
            scale = 2.0 ** 32 if (np.int64(S[w, VCC + lane // 32]) >> (lane % 32)) & 1 else 1.0
            f, is_float = np.float32(fma32(fa, fb, fc) * scale), True
        elif op == O.OP_V_DIV_FIXUP_F32:
            f, is_float = div_fixup(fa, fb, fc, b, c), True
        elif op == O.OP_V_DIV_SCALE_F32:
            f, bit = div_scale(fa, fb, fc, b, c)
            is_float = True
            if ex >> lane & 1:
                carry_out |= np.int64(bit) << lane
        elif op == O.OP_V_SUBREV_U32:
            r = b - a
        elif op == O.OP_V_ADD_CO_U32 or op == O.OP_V_ADDC_CO_U32:
            r = a + b + (cin if op == O.OP_V_ADDC_CO_U32 else 0)
            if ex >> lane & 1 and r >> 32:
                carry_out |= np.int64(1) << lane
        elif op == O.OP_V_SUB_CO_U32 or op == O.OP_V_SUBB_CO_U32:
            k = cin if op == O.OP_V_SUBB_CO_U32 else 0
            r = a - b - k
            if ex >> lane & 1 and b + k > a:
                carry_out |= np.int64(1) << lane
        elif op == O.OP_V_SUBREV_CO_U32 or op == O.OP_V_SUBBREV_CO_U32:
            k = cin if op == O.OP_V_SUBBREV_CO_U32 else 0
            r = b - a - k
            if ex >> lane & 1 and a + k > b:
                carry_out |= np.int64(1) << lane
        # 16-bit results zero the upper half on gfx9-family targets (LLVM
        # GCNSubtarget::zeroesHigh16BitsOfDest).
        elif op == O.OP_V_ADD_U16:
            r = (a + b) & 0xFFFF
        elif op == O.OP_V_SUB_U16:
            r = (a - b) & 0xFFFF
        elif op == O.OP_V_MUL_LO_U16:
            r = ((a & 0xFFFF) * (b & 0xFFFF)) & 0xFFFF
        elif op == O.OP_V_LSHRREV_B16:
            r = (b & 0xFFFF) >> (a & 15)
        elif op == O.OP_V_LSHLREV_B16:
            r = ((b & 0xFFFF) << (a & 15)) & 0xFFFF
        elif op == O.OP_V_ASHRREV_I16:
            r = (sext16(b) >> (a & 15)) & 0xFFFF
        elif op == O.OP_V_MAX_I32:
            r = a if sext32(a) > sext32(b) else b
        elif op == O.OP_V_MIN_I32:
            r = a if sext32(a) < sext32(b) else b
        elif op == O.OP_V_MAX_U32:
            r = max(a, b)
        elif op == O.OP_V_MIN_U32:
            r = min(a, b)
        elif op == O.OP_V_MUL_I32_I24:
            r = sext24(a) * sext24(b)
        elif op == O.OP_V_MAD_U32_U24:
            r = (a & 0xFFFFFF) * (b & 0xFFFFFF) + c
        elif op == O.OP_V_MAD_I32_I24:
            r = sext24(a) * sext24(b) + c
        elif op == O.OP_V_MUL_LO_U32:
            r = a * b
        elif op == O.OP_V_MUL_HI_U32:
            r = mul_hi_u32(a, b)
        elif op == O.OP_V_MUL_HI_I32:
            r = (sext32(a) * sext32(b)) >> 32
        elif op == O.OP_V_BCNT_U32_B32:
            r = b
            x = a
            for _ in range(32):
                r += x & 1
                x >>= 1
        elif op == O.OP_V_XAD_U32:
            r = (a ^ b) + c
        elif op == O.OP_V_AND_OR_B32:
            r = (a & b) | c
        elif op == O.OP_V_OR3_B32:
            r = a | b | c
        elif op == O.OP_V_BFI_B32:
            r = (a & b) | (~a & c)
        elif op == O.OP_V_ALIGNBIT_B32:
            r = ((a << 32 | b) >> (c & 31)) if (c & 31) else b
        elif op == O.OP_V_BFE_U32 or op == O.OP_V_BFE_I32:
            width = c & 31
            r = (a >> (b & 31)) & ((np.int64(1) << width) - 1)
            if op == O.OP_V_BFE_I32 and width and r >> (width - 1) & 1:
                r -= np.int64(1) << width
        elif op == O.OP_V_BITOP3_B32:  # bit n of TTBL: the minterm S0 S1 S2 = n (CDNA4 pseudocode)
            table = P[i, F_FORMAT]
            r = 0
            for n in range(8):
                if table >> n & 1:
                    r |= (a if n & 4 else ~a) & (b if n & 2 else ~b) & (c if n & 1 else ~c)
        elif op == O.OP_V_BITOP3_B16:  # as V_BITOP3_B32 on the low halves; the high half zeroed
            table = P[i, F_FORMAT]
            r = 0
            for n in range(8):
                if table >> n & 1:
                    r |= (a if n & 4 else ~a) & (b if n & 2 else ~b) & (c if n & 1 else ~c)
            r &= 0xFFFF
        elif op == O.OP_V_MIN3_I32:
            r = min(sext32(a), sext32(b), sext32(c))
        elif op == O.OP_V_MED3_I32:
            x, y, z = sext32(a), sext32(b), sext32(c)
            r = max(min(x, y), min(max(x, y), z))
        elif op == O.OP_V_MED3_U32:
            r = max(min(a, b), min(max(a, b), c))
        elif op == O.OP_V_PERM_B32:  # bytes 0-3 from S1, 4-7 from S0
            data = b | a << 32
            r = 0
            for byte in range(4):
                sel = c >> (8 * byte) & 0xFF
                if sel >= 13:
                    v = 0xFF
                elif sel == 12:
                    v = 0
                elif sel >= 8:
                    v = 0xFF if data >> (8 * (2 * (sel - 8) + 1) + 7) & 1 else 0
                else:
                    v = data >> (8 * sel) & 0xFF
                r |= v << (8 * byte)
        elif op == O.OP_V_LSHLREV_B64:
            two = True
            x = b | np.int64(V[w, s1 - 256 + 1, lane]) << 32 if s1 >= 256 else sval(S, w, s1, lit, True)
            x = x << (a & 63)
            r = x & M32
            T[4, lane] = x >> 32 & M32
        elif op == O.OP_V_LSHL_ADD_U64:
            two = True
            x = a | np.int64(V[w, s0 - 256 + 1, lane]) << 32 if s0 >= 256 else sval(S, w, s0, lit, True)
            y = c | np.int64(V[w, s2 - 256 + 1, lane]) << 32 if s2 >= 256 else sval(S, w, s2, lit, True)
            x = (x << (b & 7)) + y
            r = x & M32
            T[4, lane] = x >> 32 & M32
        elif op == O.OP_V_MAD_U64_U32:
            two = True
            y = c | np.int64(V[w, s2 - 256 + 1, lane]) << 32 if s2 >= 256 else sval(S, w, s2, lit, True)
            product = np.uint64(a) * np.uint64(b)
            total = product + np.uint64(y)
            if ex >> lane & 1 and total < product:
                carry_out |= np.int64(1) << lane
            r = np.int64(total & np.uint64(M32))
            T[4, lane] = np.int64(total >> np.uint64(32))
        elif op == O.OP_V_CVT_PK_BF16_F32:
            r = f32bits_to_bf16(a) | f32bits_to_bf16(b) << 16
        elif op == O.OP_V_CVT_PK_FP8_F32:  # OPSEL[3] picks the half written; the other is kept
            pair = f32_to_fp8(fa) | f32_to_fp8(fb) << 8
            old = np.int64(V[w, dst, lane])
            r = (old & 0xFFFF) | pair << 16 if P[i, F_OPSEL] & 8 else (old & 0xFFFF0000) | pair
        elif op == O.OP_V_CVT_SCALEF32_PK_F32_FP8 or op == O.OP_V_CVT_SCALEF32_PK_BF16_FP8:
            # The fp8 pair in S0's word OPSEL[0], each times 2^(exponent field of S1 - 127)
            # (CDNA4 pseudocode: scale = exponent(S1.f32); fp8_to_f32_scale / fp8_to_bf16_scale).
            # Exact in f32 (3 mantissa bits, exponents within f32's range); bf16 rounds once.
            half = a >> (16 * (P[i, F_OPSEL] & 1)) & 0xFFFF
            scale = 2.0 ** np.float64((b >> 23 & 0xFF) - 127)
            TF[3, lane] = np.float32(fp8_to_f64(half & 0xFF) * scale)
            TF[4, lane] = np.float32(fp8_to_f64(half >> 8) * scale)
            if op == O.OP_V_CVT_SCALEF32_PK_F32_FP8:
                two = True
                continue
            r = f32bits_to_bf16(np.int64(T[3, lane])) | f32bits_to_bf16(np.int64(T[4, lane])) << 16
        elif op == O.OP_V_CVT_PK_F32_FP8:
            two = True
            half = a & 0xFFFF  # an SDWA WORD_1 select already moved the high half down
            TF[3, lane] = np.float32(fp8_to_f64(half & 0xFF))
            TF[4, lane] = np.float32(fp8_to_f64(half >> 8))
            continue
        if is_float:
            TF[3, lane] = f
        else:
            T[3, lane] = r & M32
    write(V, T, w, dst, 3, ex)
    if two:
        write(V, T, w, dst + 1, 4, ex)
    if P[i, F_SDST] or op == O.OP_V_DIV_SCALE_F32:
        set64(S, w, P[i, F_SDST] if P[i, F_SDST] else VCC, carry_out)

