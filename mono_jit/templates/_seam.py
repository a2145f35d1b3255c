"""The mHC seam as device code (FlyDSL; kernel modules only), one implementation for both
launches: K1 runs it with hc_attn_* and attn_norm on the previous FFN output, K2 with hc_ffn_*
and ffn_norm on the all-reduced attention output (reference: reference_math.py fold, seam_gate,
collapse, rms_norm, mxfp8_quantize; k2/attention_reference.py ffn_seam).

Two halves, as K1's S1 / S2 tables split them (k1/layout.py):
  fold_row   one row of a (row group, 128-column chunk) task: 512 threads = 4 streams x 128
             columns; the fold of x into R with post / comb, R stored, and the chunk's 25 partial
             sums (24 mixes and the sum of squares) into the f32 scratch;
  seam_row   one row: the 56 partials summed in a fixed order, the gate (sigmoid, softmax +
             Sinkhorn in wave 0), the collapse, the RMS norm and the MXFP8 of the normed row.
"""

import operator

import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr

from .. import deepseek_v4
from ..deepseek_v4 import EPS, HC_POST_ALPHA, MIXES, SINKHORN_ROUNDS, STREAMS
from ._dsl import butterfly, dsl, load, load_scalar, pointer_load, store, store_scalar, wave_sum
from ._numerics import LOG2E, VEC, bf16_round, bf16x8, block_sum, mx_store, rsqrt, sigmoid
from .geometry import PARTIALS, SEAM_CHUNKS, THREADS, WAVES

H = deepseek_v4.HIDDEN
ROW_CHUNKS = H // VEC  # 896
_ROW, _COLUMN = range(2), range(2, 4)  # lane bits of j and i when lane e = 4 i + j


def mix_weights(fn_view, stream, col):
    """The 24 hc_fn weights (from a view of the [24, 4 x 7168] f32 table) of this thread's
    (stream, column): kept in registers across the rows of a task, so hc_fn is read once per
    row group."""
    return [load_scalar(fn_view, k * STREAMS * H + stream * H + col, fx.Float32) for k in range_constexpr(MIXES)]


@dsl
def fold_row(residual, post_mix, res_mix, r_out, x_at, do_fold, fn, red, f32, partials_at, row, col, stream, tid,
             wave, lane):
    """Row `row`, column `col` of this thread's stream: R' = bf16(post x + comb^T R) (or R as it
    is when do_fold is 0), stored to r_out; the chunk's 25 partials of the row at `partials_at`.
    residual / r_out are bf16 views [rows, 4, 7168]; post_mix / res_mix f32 pointers.

    `x_at(row)` gives this thread's f32 x (called only when folding: layer 0 reads no x)."""
    streams = [load_scalar(residual, (row * STREAMS + i) * H + col, fx.BFloat16).to(fx.Float32)
               for i in range_constexpr(STREAMS)]
    value = fx.Float32(0.0)  # this thread's stream, picked from the four it reads
    for i in range_constexpr(STREAMS):
        value = (stream == i).select(streams[i], value)
    if do_fold != 0:  # layer 0 passes x in post_mix / res_mix: read them only here
        folded = pointer_load(post_mix, row * STREAMS + stream) * x_at(row)
        for i in range_constexpr(STREAMS):
            folded = folded + pointer_load(res_mix, row * 16 + i * STREAMS + stream) * streams[i]
        value = folded
    value = bf16_round(value)
    gpu.barrier()  # all streams of the row are read before any is written (r_out may alias)
    store_scalar(r_out, (row * STREAMS + stream) * H + col, value.to(fx.BFloat16), fx.BFloat16)
    parts = [value * fn[k] for k in range_constexpr(MIXES)] + [value * value]
    for k in range_constexpr(PARTIALS):
        total = wave_sum(parts[k])
        if lane == 0:
            fx.memref_store(total, red, k * WAVES + wave)
    gpu.barrier()
    if tid < PARTIALS:
        total = fx.memref_load(red, tid * WAVES)
        for w in range_constexpr(1, WAVES):
            total = total + fx.memref_load(red, tid * WAVES + w)
        store_scalar(f32, partials_at + tid, total, fx.Float32)
    gpu.barrier()


@dsl
def seam_row(f32, partials_at, gate, red, hc_base, hc_scale, post_out, comb_out, r_out8, norm, x_norm8, u8x8, u8,
             codes_at, scales_at, row, tid, wave, lane, pre_out=None):
    """Row `row`'s gate from its 56 x 25 partials at `partials_at`, then the collapse, the norm
    (bf16 weight at pointer `norm`) to x_norm8 and its MXFP8 (codes at `codes_at`, E8M0 at
    `scales_at`); hc_base / hc_scale point to the f32 [24] / [3] gate parameters, post_out /
    comb_out to the f32 outputs (and pre_out, when given, to the f32 [rows, 4] pre: K2 returns
    it to vLLM's hook); r_out8 / x_norm8 are bf16 views in chunks of 8."""
    if tid < PARTIALS:
        total = fx.Float32(0.0)
        for c in range_constexpr(SEAM_CHUNKS):
            total = total + load_scalar(f32, partials_at + c * PARTIALS + tid, fx.Float32)
        fx.memref_store(total, gate, tid)
    gpu.barrier()
    if wave == 0:
        seam_gate(gate, hc_base, hc_scale, post_out, comb_out, row, lane, pre_out)
    gpu.barrier()
    pre = [fx.memref_load(gate, i) for i in range_constexpr(STREAMS)]
    collapse_norm_quant(r_out8, norm, x_norm8, pre, red, u8x8, u8, codes_at, scales_at, row, tid, wave, lane)


@dsl
def seam_gate(gate, hc_base, hc_scale, post_out, comb_out, row, lane, pre_out=None):
    """Wave 0: mixes -> pre (into gate[0:4]), post and the Sinkhorn comb (stored).

    Lane e = 4 i + j (of every 16) holds comb[i, j]: a row sum is a butterfly over lane bits
    0-1, a column sum over bits 2-3, so each of the 39 normalisations is two shuffles and a
    division per lane instead of sixteen serial divisions.
    """
    e = lane % 16
    inv = rsqrt(fx.memref_load(gate, MIXES) / float(STREAMS * H) + EPS)
    s0, s1, s2 = (pointer_load(hc_scale, i) for i in range_constexpr(3))
    own = lane % STREAMS
    pre = sigmoid(fx.memref_load(gate, own) * inv * s0 + pointer_load(hc_base, own)) + EPS
    post = sigmoid(fx.memref_load(gate, STREAMS + own) * inv * s1 + pointer_load(hc_base, STREAMS + own)) * \
        HC_POST_ALPHA
    logit = fx.memref_load(gate, 8 + e) * inv * s2 + pointer_load(hc_base, 8 + e)
    weight = ((logit - butterfly(logit, fx.max, _ROW)) * LOG2E).exp2()
    comb = weight / butterfly(weight, operator.add, _ROW) + EPS
    comb = comb / (butterfly(comb, operator.add, _COLUMN) + EPS)
    for _ in range_constexpr(SINKHORN_ROUNDS - 1):
        comb = comb / (butterfly(comb, operator.add, _ROW) + EPS)
        comb = comb / (butterfly(comb, operator.add, _COLUMN) + EPS)
    if lane < STREAMS:  # post and comb stored through plain pointers: no buffer resource to hold
        fx.memref_store(pre, gate, lane)
        fx.generic_store(post_out + (row * STREAMS + lane), post)
        if const_expr(pre_out is not None):
            fx.generic_store(pre_out + (row * STREAMS + lane), pre)
    if lane < 16:
        fx.generic_store(comb_out + (row * 16 + lane), comb)


@dsl
def collapse_norm_quant(r8, norm, out8, pre, red, u8x8, u8, codes_at, scales_at, row, tid, wave, lane):
    """x_norm = RMSNorm(bf16(sum_i pre_i R_i)) with the weight at `norm`; its MXFP8 into the byte
    scratch."""
    passes = []
    sq = fx.Float32(0.0)
    for p in range_constexpr(2):
        chunk = tid + p * THREADS
        valid = chunk < ROW_CHUNKS
        at = valid.select(chunk, 0)
        mixed = [fx.Float32(0.0)] * VEC
        for i in range_constexpr(STREAMS):
            r = load(r8, (row * STREAMS + i) * ROW_CHUNKS + at, fx.BFloat16, VEC).to(fx.Float32)
            mixed = [mixed[e] + pre[i] * r[e] for e in range_constexpr(VEC)]
        mixed = [valid.select(bf16_round(v), 0.0) for v in mixed]
        for v in mixed:
            sq = sq + v * v
        passes.append((chunk, valid, at, mixed))
    inv = rsqrt(block_sum(sq, red, 0, wave, lane) / float(H) + EPS)
    for chunk, valid, at, mixed in passes:
        w = pointer_load(norm, at * VEC, VEC).to(fx.Float32)
        y = [bf16_round(mixed[e] * inv * w[e]) for e in range_constexpr(VEC)]
        if valid:
            store(out8, row * ROW_CHUNKS + at, bf16x8(y), fx.BFloat16, VEC)
        mx_store(y, u8x8, u8, codes_at, scales_at, at, valid)
