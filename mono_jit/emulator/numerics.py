"""Bit-level number formats of gfx950, as numba functions on int64 bit patterns and floats.

- f32 <-> bits go through a float32 view of the caller's scratch row (numba has no bitcast).
- bf16: round to nearest even from f32, NaN kept quiet (CDNA4 ISA `V_CVT_PK_BF16_F32`, "ROUND_MODE
  = ROUND_NEAREST_EVEN"; the same rounding as torch's f32 -> bf16).
- fp8 is OCP e4m3 on gfx950 (bias 7, max 448, no infinity, S.1111.111 is NaN): AMD's
  `amd_hip_ocp_fp_cxx.hpp` (`__AMD_OCP_E4M3` for gfx950) and ck_tile `float8.hpp`'s IEEE/OCP
  column. `V_CVT_PK_FP8_F32` rounds to nearest even (CDNA4 ISA pseudocode); a finite value past
  the largest e4m3 (448, rounding boundary 464) becomes NaN here, and so do inf and NaN. The
  kernels clamp to +-448 before converting (`templates/_numerics.py`), so they never reach that
  choice; it is the conservative reading (a kernel that forgot to clamp would show NaN).
- fp4 is OCP e2m1 (its value table is `mfma_layout.E2M1`, with the MFMA's operand layout).
- E8M0 scale codes are 2^(code - 127); 255 is NaN (OCP MX specification).
- Integers: sign extension from 32, 24 and 16 bits, and the high half of a 32 x 32 product.
"""

from __future__ import annotations

import math

import numpy as np

from .jit_cache import njit

M32 = 0xFFFFFFFF


@njit(cache=True)
def fp8_to_f64(code: int) -> float:
    """An e4m3 byte's value (NaN for S.1111.111)."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent = code >> 3 & 0xF
    mantissa = code & 7
    if exponent == 15 and mantissa == 7:
        return math.nan
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9
    return sign * (8 + mantissa) * 2.0 ** (exponent - 10)


@njit(cache=True)
def f32_to_fp8(value: float) -> int:
    """The e4m3 byte nearest `value` (ties to even); NaN (0x7F / 0xFF) for NaN, inf and overflow."""
    if value != value:
        return 0x7F
    sign = 0x80 if value < 0.0 or (value == 0.0 and math.copysign(1.0, value) < 0.0) else 0
    magnitude = abs(value)
    if magnitude == 0.0:
        return sign
    if math.isinf(magnitude):
        return sign | 0x7F
    exponent = max(math.floor(math.log2(magnitude)), -6)
    if 2.0 ** exponent > magnitude:  # log2 rounding just below a power of two
        exponent -= 1
    exponent = max(exponent, -6)
    quantum = 2.0 ** (exponent - 3)
    rounded = np.rint(magnitude / quantum) * quantum
    if rounded > 448.0:
        return sign | 0x7F
    if rounded < 2.0 ** -6:
        return sign | int(rounded / 2.0 ** -9)
    e = math.floor(math.log2(rounded))
    if 2.0 ** e > rounded:
        e -= 1
    mantissa = int(rounded / 2.0 ** e * 8.0) - 8
    return sign | (e + 7) << 3 | mantissa


@njit(cache=True)
def f32bits_to_bf16(bits: int) -> int:
    """bf16 of an f32 bit pattern, round to nearest even, NaN made quiet."""
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x7FFFFF:
        return (bits >> 16 | 0x40) & 0xFFFF
    return ((bits + 0x7FFF + (bits >> 16 & 1)) >> 16) & 0xFFFF


@njit(cache=True)
def e8m0(code: int) -> float:
    if code == 255:
        return math.nan
    return 2.0 ** (code - 127)


@njit(cache=True)
def fma32(a: float, b: float, c: float) -> np.float32:
    """f32 fused multiply-add: the product is exact in f64; the f64 sum then rounds to f32 (two
    roundings, so a result can differ from one rounding by one ulp in rare halfway cases)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(cache=True)
def maximum(a: float, b: float) -> float:
    """IEEE 754-2019 maximum (`v_maximum_f32`): NaN if either is NaN, +0 above -0."""
    if a != a or b != b:
        return math.nan
    if a == b:
        return b if math.copysign(1.0, a) < 0.0 else a
    return a if a > b else b


@njit(cache=True)
def minimum(a: float, b: float) -> float:
    """IEEE 754-2019 minimum (`v_minimum_f32`): NaN if either is NaN, -0 below +0."""
    if a != a or b != b:
        return math.nan
    if a == b:
        return a if math.copysign(1.0, a) < 0.0 else b
    return a if a < b else b


@njit(cache=True)
def f32_exponent(bits: int) -> int:
    return bits >> 23 & 0xFF


@njit(cache=True)
def cvt_u32(value: float) -> int:
    """`V_CVT_U32_F32`: truncate, NaN and negatives give 0, large values saturate."""
    if value != value or value <= 0.0:
        return 0
    if value >= 4294967295.0:
        return M32
    return int(value)


@njit(cache=True)
def cvt_i32(value: float) -> int:
    """`V_CVT_I32_F32`: truncate, NaN gives 0, saturate to the i32 range."""
    if value != value:
        return 0
    if value >= 2147483647.0:
        return 0x7FFFFFFF
    if value <= -2147483648.0:
        return 0x80000000
    return int(value) & M32


@njit(cache=True)
def sext32(x):
    x &= M32
    return x - (1 << 32) if x & 0x80000000 else x


@njit(cache=True)
def sext24(x):
    x &= 0xFFFFFF
    return x - (1 << 24) if x & 0x800000 else x


@njit(cache=True)
def sext16(x):
    x &= 0xFFFF
    return x - (1 << 16) if x & 0x8000 else x


@njit(cache=True)
def mul_hi_u32(a, b):
    """The upper 32 bits of an unsigned 32 x 32 product (in uint64: the product can pass 2^63)."""
    return np.int64((np.uint64(a) * np.uint64(b)) >> np.uint64(32))

