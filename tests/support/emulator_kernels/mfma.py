"""One v_mfma_scale_f32_16x16x128_f8f6f4 a launch through templates/_gemv.py's `mfma`: each lane
feeds the operand registers and E8M0 scale bytes it is given (fp8 x fp8, or fp4 A x fp8 B as
K2's routed experts), so the test can hold the result against tests/support/mfma_model.py. The
"transposed" variant feeds lane l the bytes meant for lane 4 (l % 16) + l / 16 (a row-major
lane order instead of the hardware's lane = 16 group + row): a wrong layout the model rejects.

(No `from __future__ import annotations`: FlyDSL reads the kernels' real annotations.)
"""

import flydsl.expr as fx

from mono_jit.templates._dsl import flat_view, load, load_scalar, store
from mono_jit.templates._gemv import FP4, FP8, mfma, operand

from .catalogue import MicroKernel, tensors

LANE_BYTES = 32  # an fp8 operand's 8 VGPRs (fp4 reads the first 16 bytes)
ARGUMENTS = tensors("a:uint8", "scale_a:uint8", "b:uint8", "scale_b:uint8", "acc:float32", "out:float32")


def _fp8_operand(view16, lane):
    """The lane's 32 bytes as an fp8 operand (two 16-byte pieces)."""
    return operand(view16, lane * LANE_BYTES, lane * LANE_BYTES + 16)


def _fp4_operand(view16, lane):
    """The first 16 of the lane's 32 bytes as an f8f6f4 operand, words 4-7 zero (as
    k2/moe_kernel.py's fp4_operand)."""
    words = load(view16, lane * (LANE_BYTES // 16), fx.Uint8, 16).bitcast(fx.Int32)
    return words.shuffle(fx.Vector.filled(4, 0, fx.Int32), list(range(8)))


def _transposed(lane):
    return (lane % 16) * 4 + lane // 16


def _kernel(a_format: int, transposed: bool):
    """A one-wave kernel of the MFMA with A in `a_format`, lanes fed in order or transposed."""
    load_a = _fp4_operand if a_format == FP4 else _fp8_operand
    source_lane = _transposed if transposed else (lambda lane: lane)

    def scaled_mfma_kernel(A: fx.Tensor, ScaleA: fx.Tensor, B: fx.Tensor, ScaleB: fx.Tensor, Acc: fx.Tensor,
                           Out: fx.Tensor):
        lane = fx.thread_idx.x
        src = source_lane(lane)
        a, b = load_a(flat_view(A, 16), src), _fp8_operand(flat_view(B, 16), src)
        scale_a = load_scalar(flat_view(ScaleA), src, fx.Uint8).to(fx.Int32)
        scale_b = load_scalar(flat_view(ScaleB), src, fx.Uint8).to(fx.Int32)
        acc = load(flat_view(Acc, 4), lane, fx.Float32, 4)
        store(flat_view(Out, 4), lane, mfma(a, b, acc, scale_a, scale_b, a_format), fx.Float32, 4)

    return scaled_mfma_kernel


KERNELS = (
    MicroKernel("mfma_fp8_fp8", ARGUMENTS, _kernel(FP8, transposed=False)),
    MicroKernel("mfma_fp4_fp8", ARGUMENTS, _kernel(FP4, transposed=False)),
    MicroKernel("mfma_fp8_fp8_transposed", ARGUMENTS, _kernel(FP8, transposed=True)),
)
