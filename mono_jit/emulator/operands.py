"""A wave's operands: scalar and vector sources read, results written under EXEC, SDWA selects and
float source modifiers, 64-bit SGPR pairs, and the fault record every family reports through."""

from __future__ import annotations

import numpy as np

from .decode import SEL_DWORD
from .jit_cache import njit
from .state import C_ADDRESS, C_DETAIL, C_FAULT, C_LANE, C_ROW, C_SIZE, C_WAVE, EXEC, M32, SCC, VCC

_F32_CONST = np.array([0x3F000000, 0xBF000000, 0x3F800000, 0xBF800000, 0x40000000, 0xC0000000, 0x40800000,
                       0xC0800000, 0x3E22F983], np.int64)  # inline 240..248: 0.5 -0.5 1 -1 2 -2 4 -4 1/(2 pi)


@njit(cache=True)
def sval(S, w, code, lit, wide):
    """A non-VGPR operand's value (64 bits when `wide`)."""
    if code < 128:
        if wide:
            return np.int64(S[w, code]) | np.int64(S[w, code + 1]) << 32
        return np.int64(S[w, code])
    if code <= 192:
        return np.int64(code - 128)
    if code <= 208:
        v = np.int64(192 - code)
        return v if wide else v & M32
    if 240 <= code <= 248:
        return _F32_CONST[code - 240]
    if code == 255:
        return np.int64(lit)
    if code == 253:
        return np.int64(S[w, SCC])
    if code == 251:
        return np.int64(1) if S[w, VCC] == 0 and S[w, VCC + 1] == 0 else np.int64(0)
    if code == 252:
        return np.int64(1) if S[w, EXEC] == 0 and S[w, EXEC + 1] == 0 else np.int64(0)
    return np.int64(-1)


@njit(cache=True)
def read(S, V, T, w, code, lit, row, hi):
    """Operand `code` (dword `hi` of it) for all 64 lanes into T[row]."""
    if code >= 256:
        r = code - 256 + hi
        for lane in range(64):
            T[row, lane] = V[w, r, lane]
    else:
        v = sval(S, w, code + hi if code < 128 else code, lit, False)
        if hi and code >= 128:
            v = 0 if code >= 240 or code == 255 or code <= 192 else M32  # a constant's upper dword
        for lane in range(64):
            T[row, lane] = v


@njit(cache=True)
def write(V, T, w, dst, row, ex):
    """T[row] into VGPR dst under EXEC: inactive lanes keep their value (a select, not a
    branch, so that LLVM vectorises the partial-EXEC loop too)."""
    if ex == -1:
        for lane in range(64):
            V[w, dst, lane] = T[row, lane]
        return
    for lane in range(64):
        V[w, dst, lane] = T[row, lane] if ex >> lane & 1 else V[w, dst, lane]


@njit(cache=True)
def sdwa_select(T, row, sel, sext):
    """Apply an SDWA source select (BYTE_0..3, WORD_0/1) with optional sign extension."""
    if sel == SEL_DWORD:
        return
    for lane in range(64):
        x = np.int64(T[row, lane])
        if sel < 4:
            x = x >> (8 * sel) & 0xFF
            if sext and x & 0x80:
                x -= 0x100
        else:
            x = x >> (16 * (sel - 4)) & 0xFFFF
            if sext and x & 0x8000:
                x -= 0x10000
        T[row, lane] = x & M32


@njit(cache=True)
def float_modifiers(T, row, neg, abs_):
    if abs_:
        for lane in range(64):
            T[row, lane] = T[row, lane] & 0x7FFFFFFF
    if neg:
        for lane in range(64):
            T[row, lane] = T[row, lane] ^ 0x80000000


@njit(cache=True)
def exec_of(S, w):
    return np.int64(S[w, EXEC]) | np.int64(S[w, EXEC + 1]) << 32


@njit(cache=True)
def set64(S, w, r, value):
    S[w, r] = value & M32
    S[w, r + 1] = value >> 32 & M32


@njit(cache=True)
def fault(CTL, kind, w, row, lane, address, size, detail):
    CTL[C_FAULT], CTL[C_WAVE], CTL[C_ROW], CTL[C_LANE] = kind, w, row, lane
    CTL[C_ADDRESS], CTL[C_SIZE], CTL[C_DETAIL] = address, size, detail
    return kind

