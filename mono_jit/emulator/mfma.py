"""The matrix instructions: the dense f32 / bf16 MFMAs and the scaled fp8 / fp4 one."""

from __future__ import annotations

import math

import numpy as np

from . import ops as O
from .decode import F_DST, F_FORMAT, F_OP, F_SCALE0, F_SCALE1, F_SRC0, F_SRC1, F_SRC2
from .jit_cache import njit
from .mfma_layout import E2M1, K_OF_BYTE, K_OF_NIBBLE
from .numerics import e8m0, fp8_to_f64
from .operands import fault
from .state import FAULT_EXEC, NO_FAULT

FP8_VALUE = np.array([fp8_to_f64(code) for code in range(256)])  # e4m3 byte -> value
SCALE_VALUE = np.array([e8m0(code) for code in range(256)])  # E8M0 code -> 2^(code - 127), 255 NaN


@njit(cache=True)
def bf16_value(h):
    """The value of bf16 bits `h` (f32's upper half)."""
    e, m = h >> 7 & 0xFF, h & 0x7F
    if e == 255:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = m * 2.0 ** -133
    else:
        v = (1.0 + m / 128.0) * 2.0 ** (e - 127)
    return -v if h >> 15 & 1 else v


@njit(cache=True, error_model="numpy")
def accumulate(w, VF, A, BT, dst, c0):
    """D[row, col] = C[row, col] + the sum over k of A[row, k] BT[k, col] (A [16, K], BT [K, 16])
    into VGPRs dst.. (C from c0, or 0 for an inline constant): each element summed in f64 in the
    order C, k = 0, 1, ... and rounded to f32 once. Four columns are summed side by side (four
    independent chains in registers instead of one), each in its own order. Lane 16 g + c,
    element e is D[4 g + e, c]."""
    D = np.empty((16, 16))
    for lane in range(64):
        g, col = lane // 16, lane % 16
        for e in range(4):
            D[4 * g + e, col] = np.float64(VF[w, c0 - 256 + e, lane]) if c0 >= 256 else np.float64(0.0)
    for row in range(16):
        for c in range(0, 16, 4):
            s0, s1, s2, s3 = D[row, c], D[row, c + 1], D[row, c + 2], D[row, c + 3]
            for k in range(BT.shape[0]):
                a = A[row, k]
                s0 += a * BT[k, c]
                s1 += a * BT[k, c + 1]
                s2 += a * BT[k, c + 2]
                s3 += a * BT[k, c + 3]
            D[row, c], D[row, c + 1], D[row, c + 2], D[row, c + 3] = s0, s1, s2, s3
    for lane in range(64):
        g, col = lane // 16, lane % 16
        for e in range(4):
            VF[w, dst + e, lane] = np.float32(D[4 * g + e, col])


@njit(cache=True, error_model="numpy")
def mfma_f32_16x16_dense(w, V, VF, dst, a0, b0, c0, per_lane):
    """V_MFMA_F32_16X16X4_F32 (`per_lane` 1, f32), V_MFMA_F32_16X16X16_BF16 (4) and
    V_MFMA_F32_16X16X32_BF16 (8): lane 16 q + i holds A[i, k] and B[k, i] for k = per_lane q + e,
    element e of the lane's operand (an f32 VGPR, or the e-th bf16 of its VGPRs, low half first);
    lane 16 g + c, element e of D is D[4 g + e, c]. (AMD's matrix instruction calculator for
    v_mfma_f32_16x16x4f32 / _16x16x16bf16_1k and gfx950's _16x16x32_bf16; Triton
    AccelerateAMDMatmul.cpp kWidth 4 / 8 for the bf16 forms; the result layout is the scaled
    MFMA's, mfma_layout.D_ROW.) The products and C are summed in f64 and rounded once."""
    K = 4 * per_lane
    A = np.empty((16, K))
    BT = np.empty((K, 16))  # BT[k, i] = B[k, i]
    for lane in range(64):
        i, q = lane % 16, lane // 16
        for e in range(per_lane):
            k = per_lane * q + e
            if per_lane == 1:
                A[i, k], BT[k, i] = VF[w, a0, lane], VF[w, b0, lane]
            else:
                shift = 16 * (e % 2)
                A[i, k] = bf16_value(V[w, a0 + e // 2, lane] >> shift & 0xFFFF)
                BT[k, i] = bf16_value(V[w, b0 + e // 2, lane] >> shift & 0xFFFF)
    accumulate(w, VF, A, BT, dst, c0)


@njit(cache=True, error_model="numpy")
def mfma(P, i, w, V, VF, ex, CTL):
    """The dense MFMAs (`mfma_f32_16x16_dense`), and
    V_MFMA_SCALE_F32_16X16X128_F8F6F4: D = C + (A x scaleA)(B x scaleB)^T, summed in f64 and
    rounded to f32 once (the hardware's summation order inside the 128-step is undocumented).
    The operands are decoded through value tables (FP8_VALUE, E2M1) with their E8M0 scales
    applied, then each result element is one 128-term dot product (`accumulate`)."""
    if ex != -1:
        return fault(CTL, FAULT_EXEC, w, i, -1, ex, 0, 0)
    dst, a0, b0, c0 = P[i, F_DST], P[i, F_SRC0] - 256, P[i, F_SRC1] - 256, P[i, F_SRC2]
    op = P[i, F_OP]
    if op == O.OP_V_MFMA_F32_16X16X4_F32 or op == O.OP_V_MFMA_F32_16X16X16_BF16 or op == O.OP_V_MFMA_F32_16X16X32_BF16:
        per_lane = 1 if op == O.OP_V_MFMA_F32_16X16X4_F32 else 4 if op == O.OP_V_MFMA_F32_16X16X16_BF16 else 8
        mfma_f32_16x16_dense(w, V, VF, dst, a0, b0, c0, per_lane)
        return NO_FAULT
    fa, fb = P[i, F_FORMAT] & 0xF, P[i, F_FORMAT] >> 4
    sa, sb = P[i, F_SCALE0] - 256, P[i, F_SCALE1] - 256
    A = np.empty((16, 128))  # A[row, k] x its scale
    BT = np.empty((128, 16))  # BT[k, col] = B[col, k] x its scale
    R = np.empty((16, 4))  # (row, K block) -> scale of the operand being decoded
    for m in range(2):
        base = a0 if m == 0 else b0
        fmt = fa if m == 0 else fb
        scales = sa if m == 0 else sb
        for lane in range(64):  # the scale of (row r, K block b) is byte 0 of lane 16 b + r
            R[lane % 16, lane // 16] = SCALE_VALUE[V[w, scales, lane] & 0xFF]
        for lane in range(64):
            row = lane % 16
            if fmt == 0:
                for byte in range(32):
                    code = V[w, base + byte // 4, lane] >> (8 * (byte % 4)) & 0xFF
                    kk = K_OF_BYTE[lane, byte]
                    value = FP8_VALUE[code] * R[row, kk // 32]
                    if m == 0:
                        A[row, kk] = value
                    else:
                        BT[kk, row] = value
            else:
                for byte in range(16):
                    code = V[w, base + byte // 4, lane] >> (8 * (byte % 4)) & 0xFF
                    lo, hi = K_OF_NIBBLE[lane, 2 * byte], K_OF_NIBBLE[lane, 2 * byte + 1]
                    low, high = E2M1[code & 0xF] * R[row, lo // 32], E2M1[code >> 4] * R[row, hi // 32]
                    if m == 0:
                        A[row, lo], A[row, hi] = low, high
                    else:
                        BT[lo, row], BT[hi, row] = low, high
    accumulate(w, VF, A, BT, dst, c0)
    return NO_FAULT
