"""Device numerics the persistent kernels share (FlyDSL; kernel modules only): the bf16 and
MXFP8 roundings of templates/reference_math.py, the E8M0 code arithmetic and a CTA-wide sum.

One implementation for K1 and K2: the FFN seam rounds exactly as the attention seam, and every
MXFP8 operand of either launch is made by `mx_store`.
"""


import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import gpu, range_constexpr

from ..deepseek_v4 import ROPE
from ._dsl import butterfly, dsl, f32_bits, f32_from_bits, load, pointer_load, store, store_scalar, wave_sum
from .geometry import E4M3_MAX, MX_BLOCK, WAVES

VEC = 8  # values per lane in the row-wise stages (one 16-byte bf16 load)
LOG2E = 1.4426950408889634


def rsqrt(value):
    return 1.0 / fx.math.sqrt(value)


def sigmoid(value):
    return 1.0 / (1.0 + (value * (-LOG2E)).exp2())


def bf16_pair_f32(word):
    """(low, high) bf16 of an i32 as two f32 (a bf16 is the top half of its f32)."""
    lo = fx.Vector.filled(1, word << 16, fx.Int32).bitcast(fx.Float32)[0]
    hi = fx.Vector.filled(1, word & -65536, fx.Int32).bitcast(fx.Float32)[0]
    return lo, hi


def bf16_round(value):
    """Round an f32 scalar or vector to bf16 and back (RNE), as the reference's .to(bfloat16)."""
    return value.to(fx.BFloat16).to(fx.Float32)


def e8m0(amax):
    """clamp(ceil(log2(amax / 448)) + 127, 0, 254) from the f32 bits (reference.e8m0_code)."""
    bits = f32_bits(fx.math.absf(amax))
    biased = bits >> 23
    code = biased - 8 + ((bits & 0x7FFFFF) > 0x600000).select(1, 0)
    return (biased == 255).select(254, fx.min(fx.max(code, 0), 254))


def e8m0_inverse(code):
    """2^(127 - code) as f32 from its exponent bits; 2^-126 for code 254, which only inf / NaN
    blocks get (reference.e8m0_inverse)."""
    return f32_from_bits(fx.max(254 - code, 1) << 23)


def e8m0_scale(code):
    """2^(code - 127) as f32 (code >= 1; code 0 reads as 0): a UE8M0 / E8M0 code's scale."""
    return f32_from_bits(code << 23)


def fp8x8(values, multiplier):
    """Eight f32 values times `multiplier`, clamped to +-448, as eight e4m3 bytes (2 x i32)."""
    i32 = ir.IntegerType.get_signless(32)
    words = []
    for half in range_constexpr(2):
        word = fx.Int32(0)
        for pair in range_constexpr(2):
            a = fx.min(fx.max(values[half * 4 + pair * 2] * multiplier, -E4M3_MAX), E4M3_MAX)
            b = fx.min(fx.max(values[half * 4 + pair * 2 + 1] * multiplier, -E4M3_MAX), E4M3_MAX)
            word = fx.Int32(fx.rocdl.cvt_pk_fp8_f32(i32, a, b, word, pair == 1))
        words.append(word)
    return fx.Vector.from_elements(words, fx.Int32).bitcast(fx.Uint8)


def fp8x4_to_f32(word):
    """The four e4m3 bytes of an i32 as four f32 (v_cvt_pk_f32_fp8, low then high half)."""
    f32x2 = ir.VectorType.get([2], ir.F32Type.get())
    out = []
    for high in range_constexpr(2):
        pair = fx.Vector(fx.rocdl.cvt_pk_f32_fp8(f32x2, word, high == 1), (2,), fx.Float32)
        out += [pair[0], pair[1]]
    return out


def amax8(values):
    amax = fx.math.absf(values[0])
    for i in range_constexpr(1, VEC):
        amax = fx.max(amax, fx.math.absf(values[i]))
    return amax


def bf16x8(values):
    """Eight f32 scalars as one bf16 vector (for a 16-byte store)."""
    return fx.Vector.from_elements([v.to(fx.BFloat16) for v in values], fx.BFloat16)


def load8_f32(f32x4, offset):
    """Eight f32 at an 8-aligned element offset (two 128-bit loads: buffer loads stop at 128 bits)."""
    lo = load(f32x4, offset // 4, fx.Float32, 4)
    hi = load(f32x4, offset // 4 + 1, fx.Float32, 4)
    return [lo[e] for e in range_constexpr(4)] + [hi[e] for e in range_constexpr(4)]


@dsl
def block_sum(value, red, slot, wave, lane):
    """Sum over the CTA's 512 threads; every thread gets the total. Uses red[slot]."""
    value = wave_sum(value)
    if lane == 0:
        fx.memref_store(value, red, slot * WAVES + wave)
    gpu.barrier()
    total = fx.memref_load(red, slot * WAVES)
    for w in range_constexpr(1, WAVES):
        total = total + fx.memref_load(red, slot * WAVES + w)
    gpu.barrier()  # red[slot] is free again
    return total


@dsl
def mx_store(values, u8x8, u8, codes_at, scales_at, chunk, valid):
    """MXFP8 of this lane's 8 values; 4 neighbouring lanes share a 32-block and its code."""
    code = e8m0(butterfly(amax8(values), fx.max, range(2)))  # 4 lanes x 8 values = one 32-block
    if valid:
        store(u8x8, (codes_at + chunk * VEC) // VEC, fp8x8(values, e8m0_inverse(code)), fx.Uint8, VEC)
        if chunk % (MX_BLOCK // VEC) == 0:
            store_scalar(u8, scales_at + chunk // (MX_BLOCK // VEC), code.to(fx.Uint8), fx.Uint8)


def rope8(values, rope, position, pair0, inverse: bool = False):
    """GPT-J RoPE on 8 values = 4 pairs from pair index pair0 (`rope` points to a [P, 64] f32
    cos | sin table): e' =
    e cos - o sin, o' = o cos + e sin; `inverse` rotates back (the sine negated, as vLLM's
    _inverse_rope_gptj_kernel)."""
    out = list(values)
    for p in range_constexpr(VEC // 2):
        cos = pointer_load(rope, position * ROPE + pair0 + p)
        sin = pointer_load(rope, position * ROPE + ROPE // 2 + pair0 + p)
        if inverse:
            sin = -sin
        even, odd = values[2 * p], values[2 * p + 1]
        out[2 * p] = even * cos - odd * sin
        out[2 * p + 1] = odd * cos + even * sin
    return out
