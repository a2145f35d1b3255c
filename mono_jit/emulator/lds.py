"""The DS instructions: LDS reads, writes and ds_or, and the two that move data between lanes
without touching LDS (ds_swizzle, ds_bpermute)."""

from __future__ import annotations

import numpy as np

from . import ops as O
from .access import ds_address, ds_shape
from .decode import F_DST, F_OFFSET, F_OFFSET1, F_SRC0, F_SRC1, F_SRC2
from .jit_cache import njit
from .operands import fault, write
from .state import CNT_LDS_READ, CNT_LDS_WRITTEN, FAULT_LDS, FAULT_UNALIGNED, M32, NO_FAULT


@njit(cache=True)
def lds_op(P, i, w, V, T, LDS, CTA, CNT, CTL, c, d, ex, op):
    """DS reads, writes, swizzle and bpermute (LDS addresses are 32-bit, checked against the
    workgroup's static + dynamic LDS)."""
    dst, addr, data0, data1 = P[i, F_DST], P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2]
    off0, off1 = P[i, F_OFFSET], P[i, F_OFFSET1]
    limit = CTA[c, 3]
    if op == O.OP_DS_SWIZZLE_B32:
        # Bit-mask mode (offset bit 15 clear): within each 32 lanes, source lane =
        # ((lane & and_mask) | or_mask) ^ xor_mask, masks at offset bits 0-4, 5-9, 10-14.
        # Quad-permute mode (bit 15 set): lane j of each 4 takes lane offset[2 (j % 4) + 1 :
        # 2 (j % 4)] of its quad. (AMD Vega / CDNA ISA, DS_SWIZZLE_B32 "offset" modes; LLVM
        # SIDefines.h Swizzle::QUAD_PERM_ENC = 0x8000, BITMASK_PERM_ENC = 0.) The swizzled VGPR
        # is the instruction's ADDR field. Reads of inactive lanes give 0.
        pattern = off0 | off1 << 8
        and_mask, or_mask, xor_mask = pattern & 0x1F, pattern >> 5 & 0x1F, pattern >> 10 & 0x1F
        for lane in range(64):
            if pattern & 0x8000:
                src = (lane & ~3) | (pattern >> (2 * (lane & 3)) & 3)
            else:
                src = (lane & 0x20) | (((lane & and_mask) | or_mask) ^ xor_mask)
            T[3, lane] = V[w, addr, src] if ex >> src & 1 else 0
        write(V, T, w, dst, 3, ex)
        return NO_FAULT
    if op == O.OP_DS_BPERMUTE_B32:  # CDNA4 pseudocode DS_BPERMUTE_B32
        offset = off0 | off1 << 8
        for lane in range(64):
            src = ((np.int64(V[w, addr, lane]) + offset) & M32) // 4 % 64
            T[3, lane] = V[w, data0, src] if ex >> src & 1 else 0
        write(V, T, w, dst, 3, ex)
        return NO_FAULT
    if op == O.OP_DS_OR_B32:  # MEM[ADDR + offset] |= DATA0 (no return)
        for lane in range(64):
            if not ex >> lane & 1:
                continue
            at = (np.int64(V[w, addr, lane]) + (off0 | off1 << 8)) & M32
            if at & 3:
                return fault(CTL, FAULT_UNALIGNED, w, i, lane, at, 4, 1)
            if at + 4 > limit:
                return fault(CTL, FAULT_LDS, w, i, lane, at, 4, limit)
            v = np.int64(V[w, data0, lane])
            for byte in range(4):
                LDS[c, at + byte] |= v >> (8 * byte) & 0xFF
            CNT[d, CNT_LDS_READ] += 4
            CNT[d, CNT_LDS_WRITTEN] += 4
        return NO_FAULT
    n, two, stride = ds_shape(op)
    writing = False
    if (op == O.OP_DS_WRITE_B32 or op == O.OP_DS_WRITE_B64 or op == O.OP_DS_WRITE_B96 or op == O.OP_DS_WRITE_B128
            or op == O.OP_DS_WRITE2_B32 or op == O.OP_DS_WRITE2_B64 or op == O.OP_DS_WRITE2ST64_B32):
        writing = True
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        a = np.int64(V[w, addr, lane])
        for half in range(2 if two else 1):
            at = ds_address(a, off0, off1, half, two, stride)
            if at & 3:
                return fault(CTL, FAULT_UNALIGNED, w, i, lane, at, 4 * n, 1)
            if at + 4 * n > limit:
                return fault(CTL, FAULT_LDS, w, i, lane, at, 4 * n, limit)
            for part in range(n):
                p = at + 4 * part
                if writing:
                    src = (data0 if half == 0 else data1) + part
                    v = np.int64(V[w, src, lane])
                    LDS[c, p] = v & 0xFF
                    LDS[c, p + 1] = v >> 8 & 0xFF
                    LDS[c, p + 2] = v >> 16 & 0xFF
                    LDS[c, p + 3] = v >> 24 & 0xFF
                else:
                    V[w, dst + half * n + part, lane] = (np.int64(LDS[c, p]) | np.int64(LDS[c, p + 1]) << 8
                                                         | np.int64(LDS[c, p + 2]) << 16 | np.int64(LDS[c, p + 3]) << 24)
        if writing:
            CNT[d, CNT_LDS_WRITTEN] += 4 * n * (2 if two else 1)
        else:
            CNT[d, CNT_LDS_READ] += 4 * n * (2 if two else 1)
    return NO_FAULT

