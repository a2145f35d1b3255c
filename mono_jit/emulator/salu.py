"""The scalar ALU: SOP1 / SOP2 / SOPC / SOPK operations on SGPRs and SCC."""

from __future__ import annotations

import numpy as np

from . import ops as O
from .decode import F_DST, F_LIT, F_OFFSET, F_SRC0, F_SRC1
from .jit_cache import njit
from .numerics import mul_hi_u32, sext16, sext32
from .operands import exec_of, set64, sval
from .state import EXEC, M32, SCC


@njit(cache=True)
def salu(P, i, w, S, op):
    """SOP1 / SOP2 / SOPC / SOPK (CDNA4 pseudocode of each S_* operation)."""
    lit = P[i, F_LIT]
    dst = P[i, F_DST]
    wide = (op == O.OP_S_AND_B64 or op == O.OP_S_OR_B64 or op == O.OP_S_XOR_B64 or op == O.OP_S_ANDN2_B64
            or op == O.OP_S_CSELECT_B64 or op == O.OP_S_MOV_B64 or op == O.OP_S_BCNT1_I32_B64
            or op == O.OP_S_AND_SAVEEXEC_B64 or op == O.OP_S_OR_SAVEEXEC_B64 or op == O.OP_S_ANDN2_SAVEEXEC_B64
            or op == O.OP_S_CMP_LG_U64 or op == O.OP_S_CMP_EQ_U64 or op == O.OP_S_LSHL_B64
            or op == O.OP_S_FF1_I32_B64)
    a = sval(S, w, P[i, F_SRC0], lit, wide)
    b = sval(S, w, P[i, F_SRC1], lit, wide and op != O.OP_S_LSHL_B64)
    scc = np.int64(S[w, SCC])
    k = P[i, F_OFFSET]  # SOPK simm16
    ks = k - 0x10000 if k & 0x8000 else k
    r = np.int64(0)
    if op == O.OP_S_MOV_B32:
        S[w, dst] = a
        return
    if op == O.OP_S_MOV_B64:
        set64(S, w, dst, a)
        return
    if op == O.OP_S_ADD_U32:
        r = a + b
        S[w, SCC] = r >> 32
    elif op == O.OP_S_ADDC_U32:
        r = a + b + scc
        S[w, SCC] = r >> 32
    elif op == O.OP_S_SUB_U32:
        r = a - b
        S[w, SCC] = 1 if b > a else 0
    elif op == O.OP_S_SUBB_U32:
        r = a - b - scc
        S[w, SCC] = 1 if b + scc > a else 0
    elif op == O.OP_S_ADD_I32 or op == O.OP_S_SUB_I32:
        x, y = sext32(a), sext32(b)
        r = x + y if op == O.OP_S_ADD_I32 else x - y
        S[w, SCC] = 1 if r != sext32(r) else 0
    elif op == O.OP_S_AND_B32:
        r = a & b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_OR_B32:
        r = a | b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_XOR_B32:
        r = a ^ b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_ANDN2_B32:
        r = a & ~b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_AND_B64 or op == O.OP_S_OR_B64 or op == O.OP_S_XOR_B64 or op == O.OP_S_ANDN2_B64:
        if op == O.OP_S_AND_B64:
            r = a & b
        elif op == O.OP_S_OR_B64:
            r = a | b
        elif op == O.OP_S_XOR_B64:
            r = a ^ b
        else:
            r = a & ~b
        set64(S, w, dst, r)
        S[w, SCC] = 1 if r != 0 else 0
        return
    elif op == O.OP_S_LSHL_B32:
        r = (a << (b & 31)) & M32
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_LSHR_B32:
        r = a >> (b & 31)
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_ASHR_I32:
        r = sext32(a) >> (b & 31)
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_LSHL_B64:
        r = a << (b & 63)
        set64(S, w, dst, r)
        S[w, SCC] = 1 if r != 0 else 0
        return
    elif op == O.OP_S_LSHL1_ADD_U32 or op == O.OP_S_LSHL2_ADD_U32 or op == O.OP_S_LSHL3_ADD_U32 or op == O.OP_S_LSHL4_ADD_U32:
        shift = 1 if op == O.OP_S_LSHL1_ADD_U32 else 2 if op == O.OP_S_LSHL2_ADD_U32 else 3 if op == O.OP_S_LSHL3_ADD_U32 else 4
        r = (a << shift) + b
        S[w, SCC] = 1 if r >> 32 else 0
    elif op == O.OP_S_MUL_I32:
        r = sext32(a) * sext32(b)
    elif op == O.OP_S_MUL_HI_U32:
        r = mul_hi_u32(a, b)
    elif op == O.OP_S_MUL_HI_I32:
        r = (sext32(a) * sext32(b)) >> 32
    elif op == O.OP_S_MIN_I32:
        c = sext32(a) < sext32(b)
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_MAX_I32:
        c = sext32(a) > sext32(b)
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_CSELECT_B32:
        r = a if scc else b
    elif op == O.OP_S_CSELECT_B64:
        set64(S, w, dst, a if scc else b)
        return
    elif op == O.OP_S_BFE_U32 or op == O.OP_S_BFE_I32:
        shift, width = b & 31, b >> 16 & 0x7F
        r = (a >> shift) & ((1 << width) - 1) if width < 32 else a >> shift
        if op == O.OP_S_BFE_I32 and 0 < width < 32 and r >> (width - 1) & 1:
            r -= 1 << width
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_MIN_U32:
        c = a < b
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_BREV_B32:  # D0.u32[31 : 0] = S0.u32[0 : 31]
        r = 0
        for bit in range(32):
            r |= (a >> bit & 1) << (31 - bit)
    elif op == O.OP_S_ABS_I32:
        r = abs(sext32(a))
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_SEXT_I32_I16:
        r = sext16(a)
    elif op == O.OP_S_BCNT1_I32_B64:
        r = 0
        x = a
        for _ in range(64):
            r += x & 1
            x = x >> 1 & 0x7FFFFFFFFFFFFFFF
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_BITSET1_B32:
        r = np.int64(S[w, dst]) | (1 << (a & 31))
    elif op == O.OP_S_FF1_I32_B64:  # the lowest set bit of S0, -1 if none
        r = -1
        for bit in range(64):
            if a >> bit & 1:
                r = bit
                break
    elif op == O.OP_S_BITCMP1_B32:  # SCC = S0[S1[4:0]] == 1; no destination
        S[w, SCC] = a >> (b & 31) & 1
        return
    elif op == O.OP_S_AND_SAVEEXEC_B64 or op == O.OP_S_OR_SAVEEXEC_B64 or op == O.OP_S_ANDN2_SAVEEXEC_B64:
        ex = exec_of(S, w)
        set64(S, w, dst, ex)
        if op == O.OP_S_AND_SAVEEXEC_B64:
            ex = a & ex
        elif op == O.OP_S_OR_SAVEEXEC_B64:
            ex = a | ex
        else:
            ex = a & ~ex
        set64(S, w, EXEC, ex)
        S[w, SCC] = 1 if ex != 0 else 0
        return
    elif op == O.OP_S_MOVK_I32:
        r = ks
    elif op == O.OP_S_ADDK_I32:
        x = sext32(np.int64(S[w, dst]))
        r = x + ks
        S[w, SCC] = 1 if r != sext32(r) else 0
    elif op == O.OP_S_MULK_I32:
        r = sext32(np.int64(S[w, dst])) * ks
    elif op >= O.OP_S_CMP_EQ_U32 and op <= O.OP_S_CMP_EQ_U64:
        x, y = sext32(a), sext32(b)
        if op == O.OP_S_CMP_EQ_U32 or op == O.OP_S_CMP_EQ_I32:
            c = a == b
        elif op == O.OP_S_CMP_LG_U32 or op == O.OP_S_CMP_LG_I32 or op == O.OP_S_CMP_LG_U64:
            c = a != b
        elif op == O.OP_S_CMP_EQ_U64:
            c = a == b
        elif op == O.OP_S_CMP_GT_U32:
            c = a > b
        elif op == O.OP_S_CMP_GE_U32:
            c = a >= b
        elif op == O.OP_S_CMP_LT_U32:
            c = a < b
        elif op == O.OP_S_CMP_LE_U32:
            c = a <= b
        elif op == O.OP_S_CMP_GE_I32:
            c = x >= y
        elif op == O.OP_S_CMP_GT_I32:
            c = x > y
        elif op == O.OP_S_CMP_LE_I32:
            c = x <= y
        else:  # S_CMP_LT_I32
            c = x < y
        S[w, SCC] = 1 if c else 0
        return
    else:  # S_CMPK_*: SDST against the sign- (I32) or zero-extended (U32) immediate
        x = np.int64(S[w, dst])
        if op == O.OP_S_CMPK_LG_U32:
            c = x != k
        elif op == O.OP_S_CMPK_GT_I32:
            c = sext32(x) > ks
        elif op == O.OP_S_CMPK_LG_I32:
            c = sext32(x) != ks
        elif op == O.OP_S_CMPK_LT_I32:
            c = sext32(x) < ks
        elif op == O.OP_S_CMPK_EQ_I32:
            c = sext32(x) == ks
        elif op == O.OP_S_CMPK_GE_I32:
            c = sext32(x) >= ks
        else:  # S_CMPK_LE_I32
            c = sext32(x) <= ks
        S[w, SCC] = 1 if c else 0
        return
    S[w, dst] = r & M32

