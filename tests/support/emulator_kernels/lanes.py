"""FlyDSL micro-kernels on lanes: a vector add over four workgroups, and one wave's cross-lane
operations: those the templates' helpers use (templates/_dsl.py: shuffles, which gfx950 code
gets as ds_swizzle, v_permlane*_swap, ds_bpermute and v_readlane; wave_sum, inclusive_count,
wave_argmax), readfirstlane under a partial EXEC, and ds_swizzle's two modes.

(No `from __future__ import annotations`: FlyDSL reads the kernels' real annotations.)
"""

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm
from flydsl.expr import range_constexpr

from mono_jit.templates.base import LaunchShape
from mono_jit.templates.geometry import WAVE
from mono_jit.templates._dsl import (flat_view, inclusive_count, last_lane, load, load_scalar, store, store_scalar,
                                     wave_argmax, wave_sum)

from .catalogue import MicroKernel, tensors

ADD_BLOCK, ADD_GRID = 256, 4  # each thread adds one f32x4 chunk
SWIZZLES = (0x041F, 0x0078)  # ds_swizzle bit mode: xor 1; and 0x18, or 3 (a broadcast of lane 3 of 8)
QUAD_SWIZZLE = 0x801B  # ds_swizzle quad mode: each quad reversed
CROSS_LANE = ("xor1", "xor2", "xor4", "xor8", "xor16", "xor32", "up1", "idx63", "readlane37",
              "readfirstlane_ge7", "wave_sum", "inclusive_count", "argmax_value", "argmax_index",
              "swizzle_041f", "swizzle_0078", "permlane16_swap", "permlane32_swap")


def _swizzle(x, offset: int):
    i32 = ir.IntegerType.get_signless(32)
    return fx.Int32(fx.rocdl.ds_swizzle(i32, x.ir_value(), fx.Int32(offset).ir_value()))


def _swapped(swap, x):
    """The new VDST of a v_permlane{16,32}_swap of x with itself (the intrinsic's first result)."""
    i32 = ir.IntegerType.get_signless(32)
    pair = swap(ir.Type.parse("!llvm.struct<(i32, i32)>"), x.ir_value(), x.ir_value(), False, False)
    return fx.Int32(llvm.extractvalue(i32, pair, [0]))


def vector_add_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor):
    chunk = fx.block_idx.x * ADD_BLOCK + fx.thread_idx.x
    a = load(flat_view(A, 4), chunk, fx.Float32, 4)
    b = load(flat_view(B, 4), chunk, fx.Float32, 4)
    store(flat_view(C, 4), chunk, a + b, fx.Float32, 4)


def cross_lane_kernel(X: fx.Tensor, Flags: fx.Tensor, Values: fx.Tensor, Out: fx.Tensor):
    """Out[lane, k] is column k of CROSS_LANE."""
    lane = fx.thread_idx.x
    i32 = ir.IntegerType.get_signless(32)
    x = load_scalar(flat_view(X), lane, fx.Int32)
    results = [x.shuffle_xor(1 << bit, WAVE) for bit in range_constexpr(6)]
    results += [fx.shuffle_up(x, 1, WAVE), last_lane(x), fx.Int32(fx.rocdl.readlane(i32, x, 37))]
    first = fx.Int32(-1)
    if lane >= 7:
        first = fx.Int32(fx.rocdl.readfirstlane(i32, x))
    results += [first, wave_sum(x), inclusive_count(load_scalar(flat_view(Flags), lane, fx.Int32), lane)]
    value, index = wave_argmax(load_scalar(flat_view(Values), lane, fx.Float32), lane)
    results += [fx.Vector.filled(1, value, fx.Float32).bitcast(fx.Int32)[0], index]
    results += [_swizzle(x, offset) for offset in SWIZZLES]
    results += [_swapped(swap, x) for swap in (fx.rocdl.permlane16_swap, fx.rocdl.permlane32_swap)]
    out = flat_view(Out)
    for k in range_constexpr(len(CROSS_LANE)):
        store_scalar(out, lane * len(CROSS_LANE) + k, results[k], fx.Int32)


def quad_swizzle_kernel(X: fx.Tensor, Out: fx.Tensor):
    lane = fx.thread_idx.x
    store_scalar(flat_view(Out), lane, _swizzle(load_scalar(flat_view(X), lane, fx.Int32), QUAD_SWIZZLE), fx.Int32)


def i64_greater_kernel(A: fx.Tensor, B: fx.Tensor, Out: fx.Tensor):
    """Out[lane] = A[lane] > B[lane] as signed i64 (v_cmp_gt_i64, the K2 peer wait's deadline test)."""
    lane = fx.thread_idx.x
    a = load_scalar(flat_view(A), lane, fx.Int64)
    b = load_scalar(flat_view(B), lane, fx.Int64)
    store_scalar(flat_view(Out), lane, (a > b).select(1, 0), fx.Int32)


KERNELS = (
    MicroKernel("vector_add", tensors("a:float32", "b:float32", "c:float32"), vector_add_kernel,
                LaunchShape((ADD_GRID, 1, 1), (ADD_BLOCK, 1, 1))),
    MicroKernel("cross_lane", tensors("x:int32", "flags:int32", "values:float32", "out:int32"), cross_lane_kernel),
    MicroKernel("quad_swizzle", tensors("x:int32", "out:int32"), quad_swizzle_kernel),
    MicroKernel("i64_greater", tensors("a:int64", "b:int64", "out:int32"), i64_greater_kernel),
)
