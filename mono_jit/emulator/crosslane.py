"""The cross-lane VALU operations: readlane / readfirstlane / writelane, mbcnt and the permlane
swaps."""

from __future__ import annotations

import numpy as np

from . import ops as O
from .decode import F_DST, F_LIT, F_SRC0, F_SRC1
from .jit_cache import njit
from .operands import read, sval, write
from .state import M32


@njit(cache=True)
def crosslane(P, i, w, S, V, T, ex, op):
    """readlane / readfirstlane / writelane / mbcnt / permlane swaps (CDNA4 pseudocode)."""
    lit, dst, s0, s1 = P[i, F_LIT], P[i, F_DST], P[i, F_SRC0], P[i, F_SRC1]
    if op == O.OP_V_READFIRSTLANE_B32:
        lane = 0
        for k in range(64):
            if ex >> k & 1:
                lane = k
                break
        S[w, dst] = V[w, s0 - 256, lane] if s0 >= 256 else sval(S, w, s0, lit, False)
    elif op == O.OP_V_READLANE_B32:
        S[w, dst] = V[w, s0 - 256, sval(S, w, s1, lit, False) & 63]
    elif op == O.OP_V_WRITELANE_B32:
        V[w, dst, sval(S, w, s1, lit, False) & 63] = sval(S, w, s0, lit, False)
    elif op == O.OP_V_MBCNT_LO_U32_B32 or op == O.OP_V_MBCNT_HI_U32_B32:
        read(S, V, T, w, s0, lit, 0, 0)
        read(S, V, T, w, s1, lit, 1, 0)
        for lane in range(64):
            below = (np.int64(1) << lane) - 1 if lane < 63 else np.int64(0x7FFFFFFFFFFFFFFF)
            part = below & M32 if op == O.OP_V_MBCNT_LO_U32_B32 else below >> 32 & M32
            x = np.int64(T[0, lane]) & part
            n = 0
            for _ in range(32):
                n += x & 1
                x >>= 1
            T[3, lane] = (np.int64(T[1, lane]) + n) & M32
        write(V, T, w, dst, 3, ex)
    else:  # V_PERMLANE16_SWAP_B32 / V_PERMLANE32_SWAP_B32: swap VDST's and SRC0's lane halves
        src = s0 - 256
        if op == O.OP_V_PERMLANE16_SWAP_B32:
            for half in range(2):
                for lane in range(16):
                    a, b = half * 32 + lane, half * 32 + lane + 16
                    t = V[w, src, a]
                    V[w, src, a] = V[w, dst, b]
                    V[w, dst, b] = t
        else:
            for lane in range(32):
                t = V[w, src, lane]
                V[w, src, lane] = V[w, dst, lane + 32]
                V[w, dst, lane + 32] = t

