"""FlyDSL micro-kernels of number formats, one wave each: templates/_numerics.py's fp8x8 (f32 ->
clamped e4m3 pairs), bf16x8 and fp8x4_to_f32; a UE8M0 byte widened and turned into its scale
as k2/kernel.py's KV dequantisation does; gfx950's fp4 conversions (scale 1); and an i32 -> f32
of a lane index (which LLVM emits as v_cvt_f32_ubyte0).

(No `from __future__ import annotations`: FlyDSL reads the kernels' real annotations.)
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl.expr import range_constexpr

from mono_jit.templates.geometry import WAVE
from mono_jit.templates._dsl import flat_view, load_code, load_scalar, store, store_scalar
from mono_jit.templates._numerics import bf16x8, e8m0_scale, fp8x4_to_f32, fp8x8, load8_f32

from .catalogue import MicroKernel, tensors

FP8_MULTIPLIER = 2.0  # fp8x8's multiplier, applied before the clamp to +-448
CODES_PER_LANE = 4  # byte_codes covers all 256 byte values


def fp8_bf16_kernel(F: fx.Tensor, Codes: fx.Tensor, Fp8: fx.Tensor, Bf16: fx.Tensor, Decoded: fx.Tensor):
    lane = fx.thread_idx.x
    chunk = load8_f32(flat_view(F, 4), lane * 8)
    store(flat_view(Fp8, 8), lane, fp8x8(chunk, FP8_MULTIPLIER), fx.Uint8, 8)
    store(flat_view(Bf16, 8), lane, bf16x8(chunk), fx.BFloat16, 8)
    word = load_scalar(flat_view(Codes), lane, fx.Int32)
    store(flat_view(Decoded, 4), lane, fx.Vector.from_elements(fp8x4_to_f32(word), fx.Float32), fx.Float32, 4)


def byte_codes_kernel(Codes: fx.Tensor, Widened: fx.Tensor, Scales: fx.Tensor):
    lane = fx.thread_idx.x
    for rep in range_constexpr(CODES_PER_LANE):
        at = rep * WAVE + lane
        code = load_code(flat_view(Codes), at)  # the templates' one path for a scale code
        store_scalar(flat_view(Widened), at, code, fx.Int32)
        store_scalar(flat_view(Scales), at, e8m0_scale(code), fx.Float32)


def fp4_kernel(F: fx.Tensor, Codes: fx.Tensor, Packed: fx.Tensor, Decoded: fx.Tensor):
    """Packed[lane]: the lane's 8 f32 as e2m1 nibbles (value 2 p + h in nibble 2 p + h);
    Decoded[8 lane ..]: the 8 nibbles of Codes[lane] as f32."""
    lane = fx.thread_idx.x
    f32x2 = ir.VectorType.get([2], ir.F32Type.get())
    i32 = ir.IntegerType.get_signless(32)
    chunk = load8_f32(flat_view(F, 4), lane * 8)
    word = fx.Int32(0)
    for pair in range_constexpr(4):
        word = fx.Int32(fx.rocdl.cvt_scalef32_pk_fp4_f32(i32, word, chunk[2 * pair], chunk[2 * pair + 1], 1.0, pair))
    store_scalar(flat_view(Packed), lane, word, fx.Int32)
    codes = load_scalar(flat_view(Codes), lane, fx.Int32)
    values = []
    for pair in range_constexpr(4):
        two = fx.Vector(fx.rocdl.cvt_scalef32_pk_f32_fp4(f32x2, codes, 1.0, pair), (2,), fx.Float32)
        values += [two[0], two[1]]
    for half in range_constexpr(2):
        store(flat_view(Decoded, 4), lane * 2 + half, fx.Vector.from_elements(values[4 * half:4 * half + 4],
                                                                              fx.Float32), fx.Float32, 4)


def lane_to_float_kernel(Out: fx.Tensor):
    lane = fx.thread_idx.x
    store_scalar(flat_view(Out), lane, lane.to(fx.Float32), fx.Float32)


KERNELS = (
    MicroKernel("fp8_bf16", tensors("f:float32", "codes:int32", "fp8:uint8", "bf16:bfloat16", "decoded:float32"),
                fp8_bf16_kernel),
    MicroKernel("byte_codes", tensors("codes:uint8", "widened:int32", "scales:float32"), byte_codes_kernel),
    MicroKernel("fp4", tensors("f:float32", "codes:int32", "packed:int32", "decoded:float32"), fp4_kernel),
    MicroKernel("lane_to_float", tensors("out:float32"), lane_to_float_kernel),
)
