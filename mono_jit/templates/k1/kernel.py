"""FlyDSL source of K1 (contract in the package docstring, decomposition in layout.py).

(No `from __future__ import annotations` here: fx.struct and @flyc.kernel read real annotations.)

Why this decomposition:
- S1 is the only stage that touches the whole residual (4 x 7168 per row) together with hc_fn
  (2.75 MB): splitting it by 128-column chunks and 16-row groups gives 56 tasks even at one row
  and reads hc_fn once per row group. Each task leaves 25 partial sums per row (24 dot products
  and the sum of squares); S2 adds the 56 partials in a fixed order, so the mixes are
  deterministic and no float atomics are needed.
- The seam's gate is 28 numbers per row: one wave computes it, a lane per entry of the 4 x 4
  comb (Sinkhorn's 39 normalisations are lane butterflies), then the CTA collapses and norms
  the row holding 8 contiguous columns per thread, which is also the MXFP8 layout: four
  neighbouring lanes form one 32-block.
- The GEMVs use the scaled MFMA v_mfma_scale_f32_16x16x128_f8f6f4 with the weight as operand A
  (16 output rows) and the MXFP8 activations as operand B (16 tokens), in the operand layout of
  the hardware-proven gfx950 code cited in addressing.py: a lane's two 16-byte pieces sit 64 K
  apart and it passes the E8M0 of K block lane / 16 (for the weight, the code of its 128 x 128
  block, the same in every lane of a step). The lane maps, task decoding, split-K slots and the
  preshuffle and KV-record offsets live in addressing.py, whose functions the CPU tests run to
  emulate S3 and S5 MFMA by MFMA (through an independent model of the MFMA) and to bound every
  GEMV access. A task's waves add their accumulators through LDS in a fixed order.
- S3 splits K in two halves so its 256 tasks give every CU 1/256 of the 14.7 MB weight; S4 adds
  the halves (fixed order, no atomics). S5 has exactly 256 tasks at TP8.
- Rows past the runtime m: their tasks still publish their flags (so consumers' counts are
  fixed by the bucket), but nothing is stored for them. Tokens past m in the MFMA's B operand
  only reach output columns that are never stored; the scratch holds whole 16-token tiles of
  operand rows, so those reads stay inside it, and every buffer resource has its real size.
- Layer 0 (do_fold 0): x, post_mix and res_mix are not read (vLLM passes x in all three).
- NaN: clamps and amaxes use IEEE maximum / minimum (v_maximum3 / v_minimum3), so a NaN stays
  NaN into the fp8 conversion and its block's code is 254, as in the reference.

Not run on hardware: there is no AMD GPU here. What CI checks is that every bucket compiles for
gfx950, its resources fit the persistent grid, the ISA holds the scaled MFMAs, the agent-scope
sync instructions, the trap and the NaN-propagating clamps, that the torch reference is right,
that the address arithmetic computes the reference GEMVs through a model of the scaled MFMA
written from vLLM's, AITER's and Triton's gfx950 code, that every GEMV access is in bounds, and
that the sync protocol holds on a model of the grid. The MFMA's real behaviour, the fp8
conversion's rounding (and its NaN encoding), the trap and the cross-CTA ordering on real
hardware are unverified until tests/test_gpu.py runs on an MI355X.
"""


import operator

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir import ir
from flydsl.expr import const_expr, gpu, range_constexpr

from ... import model
from ...spec import Spec
from .._dsl import (WAVE, butterfly, dsl, f32_bits, f32_from_bits, flat_view, load, load_global, load_scalar, store,
                    store_scalar, wave_sum)
from .._sync import arrive, leave, publish, step_tag, wait
from ..base import Build
from . import addressing as ad
from .layout import (CTAS, EPS, HEAD_DIM, KV_LORA, KV_SCALE_BLOCK, KV_SCALES, LDS_ACC_WORDS, LDS_GATE_WORDS,
                     LDS_RED_WORDS, MIXES, MX_BLOCK, NOPE, PARTIALS, PIN_LDS_BYTES, Q_LORA, QKV, ROPE, SEAM_CHUNK,
                     SEAM_CHUNKS, SEAM_GROUP, STREAMS, THREADS, TILE_N, WAVES, WEIGHT_BLOCK, K1Layout)
from .reference import E4M3_MAX, HC_POST_ALPHA, KV_AMAX_FLOOR, SINKHORN_ROUNDS

H = model.HIDDEN
VEC = 8  # values per lane in the row-wise stages (one 16-byte bf16 load)
ROW_CHUNKS = H // VEC  # 896
LOG2E = 1.4426950408889634


@fx.struct
class _Shared:
    red: fx.Array[fx.Float32, LDS_RED_WORDS, 16]  # per-wave partials of block reductions
    gate: fx.Array[fx.Float32, LDS_GATE_WORDS, 16]  # S2: the 25 sums, then pre
    acc: fx.Array[fx.Float32, LDS_ACC_WORDS, 16]  # GEMV split-K partials


# -- small numeric helpers -------------------------------------------------------------------

def _rsqrt(value):
    return 1.0 / fx.math.sqrt(value)


def _sigmoid(value):
    return 1.0 / (1.0 + (value * (-LOG2E)).exp2())


def _bf16(value):
    """Round an f32 scalar or vector to bf16 and back (RNE), as the reference's .to(bfloat16)."""
    return value.to(fx.BFloat16).to(fx.Float32)


def _e8m0(amax):
    """clamp(ceil(log2(amax / 448)) + 127, 0, 254) from the f32 bits (reference.e8m0_code)."""
    bits = f32_bits(fx.math.absf(amax))
    biased = bits >> 23
    code = biased - 8 + ((bits & 0x7FFFFF) > 0x600000).select(1, 0)
    return (biased == 255).select(254, fx.min(fx.max(code, 0), 254))


def _e8m0_inverse(code):
    """2^(127 - code) as f32 from its exponent bits; 2^-126 for code 254, which only inf / NaN
    blocks get (reference.e8m0_inverse)."""
    return f32_from_bits(fx.max(254 - code, 1) << 23)


def _fp8x8(values, multiplier):
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


def _amax8(values):
    amax = fx.math.absf(values[0])
    for i in range_constexpr(1, VEC):
        amax = fx.max(amax, fx.math.absf(values[i]))
    return amax


@dsl
def _block_sum(value, red, slot, wave, lane):
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


def _rope8(values, rope, position, pair0):
    """GPT-J RoPE on 8 values = 4 pairs starting at pair index pair0 (cos | sin table rows)."""
    out = list(values)
    for p in range_constexpr(VEC // 2):
        cos = load_global(rope, position * ROPE + pair0 + p)
        sin = load_global(rope, position * ROPE + ROPE // 2 + pair0 + p)
        even, odd = values[2 * p], values[2 * p + 1]
        out[2 * p] = even * cos - odd * sin
        out[2 * p + 1] = odd * cos + even * sin
    return out


def _load8_f32(f32x4, offset):
    """Eight f32 at an 8-aligned element offset (two 128-bit loads: buffer loads stop at 128 bits)."""
    lo = load(f32x4, offset // 4, fx.Float32, 4)
    hi = load(f32x4, offset // 4 + 1, fx.Float32, 4)
    return [lo[e] for e in range_constexpr(4)] + [hi[e] for e in range_constexpr(4)]


def _qkv_raw8(f32x4, lay, row, col):
    """Eight S3 outputs of a row: its two K halves added in a fixed order."""
    first = _load8_f32(f32x4, lay.qkv_raw + row * QKV + col)
    second = _load8_f32(f32x4, lay.qkv_raw + (lay.rows + row) * QKV + col)
    return [first[e] + second[e] for e in range_constexpr(VEC)]


def _bf16x8(values):
    """Eight f32 scalars as one bf16 vector (for a 16-byte store)."""
    return fx.Vector.from_elements([v.to(fx.BFloat16) for v in values], fx.BFloat16)


# -- the scaled-MFMA GEMV tile ---------------------------------------------------------------

def _mfma(a, b, acc, scale_a, scale_b):
    f32x4 = ir.VectorType.get([4], ir.F32Type.get())
    out = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(f32x4, [a, b, acc, 0, 0, 0, scale_a, 0, scale_b])
    return fx.Vector(out, (4,), fx.Float32)


def _operand(view16, lo, hi):
    """Two 16-byte pieces at 16-aligned byte offsets as the 8 x i32 of an f8 MFMA operand."""
    first = load(view16, lo // 16, fx.Uint8, 16).bitcast(fx.Int32)
    second = load(view16, hi // 16, fx.Uint8, 16).bitcast(fx.Int32)
    return first.shuffle(second, list(range(8)))


class _Fp8Weight:
    """An e4m3 weight [N, K] with E8M0 codes per 128 x 128 block, as vLLM may hold it: row-major
    with a row stride in bytes (rows padded by VLLM_ROCM_FP8_PADDING), or AITER's (16, 16)
    preshuffle, [N/16][K/32][2][16 rows][16 bytes] (aiter/ops/shuffle.py, shuffle_weight)."""

    def __init__(self, tensor, scales, k: int, stride, shuffled):
        self.view, self.scales, self.k = flat_view(tensor, 16), scales, k
        self.stride, self.shuffled = stride, shuffled != 0

    def _offset(self, row, k0):
        return self.shuffled.select(ad.preshuffled_offset(row, k0, self.k), ad.row_major_offset(row, k0, self.stride))

    def operand(self, row, pieces):
        """The two 16-byte pieces (K pieces[0] .. + 15, pieces[1] .. + 15) of `row`."""
        return _operand(self.view, self._offset(row, pieces[0]), self._offset(row, pieces[1]))

    def scale(self, row, step):
        return load_global(self.scales, ad.block_scale_index(row, step, self.k)).to(fx.Int32)


class _Mxfp8Rows:
    """MXFP8 activations in the byte scratch: rows of k e4m3 bytes at `codes`, k / 32 codes at `scales`."""

    def __init__(self, u8x16, u8, codes: int, scales: int, k: int):
        self.u8x16, self.u8, self.codes, self.scales, self.k = u8x16, u8, codes, scales, k

    def operand(self, token, pieces):
        return _operand(self.u8x16, ad.mx_code_offset(self.codes, token, pieces[0], self.k),
                        ad.mx_code_offset(self.codes, token, pieces[1], self.k))

    def scale(self, token, block):
        return load_scalar(self.u8, ad.mx_scale_offset(self.scales, token, block, self.k), fx.Uint8).to(fx.Int32)


def _gemv_steps(weight, acts, w_row, steps, lane, row_tiles):
    """Accumulators [row tile] over K steps for weight rows w_row .. w_row + 15 x all tokens.

    `steps` lists (step, keep): keep None, or a predicate under which the step counts (a wave
    with nothing to do computes a duplicate step and drops it, keeping control flow uniform).
    Operand lanes follow addressing.py's layout: two 16-byte pieces 64 K apart and the scale of
    K block lane / 16, for the weight and the activations alike.
    """
    accs = [fx.Vector.filled(4, 0.0, fx.Float32) for _ in range_constexpr(row_tiles)]
    row = w_row + ad.operand_row(lane)
    for step, keep in steps:
        pieces = ad.operand_pieces(step, lane)
        block = ad.operand_block(step, lane)
        a, scale_a = weight.operand(row, pieces), weight.scale(row, step)
        for t in range_constexpr(row_tiles):
            token = ad.operand_token(t, lane)
            acc = _mfma(a, acts.operand(token, pieces), accs[t], scale_a, acts.scale(token, block))
            accs[t] = acc if keep is None else keep.select(acc, accs[t])
    return accs


@dsl
def _gemv_reduce(accs, lds_acc, tid, wave, lane, waves_per_tile, row_tiles, out, out_base, out_width, n0, m):
    """Add the accumulators of the `waves_per_tile` waves of each tile; store rows < m (f32).

    Wave w works on tile w // waves_per_tile; lane l's accumulator element e is output row
    n0(tile) + 4 (l / 16) + e for token l % 16 (+ 16 per row tile).
    """
    for t in range_constexpr(row_tiles):
        for e in range_constexpr(4):
            fx.memref_store(accs[t][e], lds_acc, ad.lds_acc_slot(wave, t, lane, e, row_tiles))
    gpu.barrier()
    tiles = WAVES // waves_per_tile
    for rep in range_constexpr((tiles * row_tiles * WAVE * 4 + THREADS - 1) // THREADS):
        tile, t, src_lane, e, real = ad.split_k_sum(tid + rep * THREADS, waves_per_tile, row_tiles)
        tile = fx.min(tile, tiles - 1)  # spare slots read a real accumulator and store nothing
        total = fx.Float32(0.0)
        for w in range_constexpr(waves_per_tile):
            total = total + fx.memref_load(lds_acc, ad.lds_acc_slot(tile * waves_per_tile + w, t, src_lane, e,
                                                                     row_tiles))
        row, column = ad.result_lane(src_lane, e)
        token = t * TILE_N + column
        if real & (token < m):
            store_scalar(out, out_base + token * out_width + n0 + tile * TILE_N + row, total, fx.Float32)


# -- the kernel ------------------------------------------------------------------------------

ALL_STAGES = frozenset(range(1, 7))


def make_kernel(lay: K1Layout, stages: frozenset[int] = ALL_STAGES):
    """The K1 kernel with the given stages (all of them for K1 itself).

    A build with a subset is a standalone launch of those stages: a stage whose producer is
    left out does not wait for it and reads its inputs from the buffers as the caller prepared
    them, so each stage can be tested alone against its reference on a GPU (DESIGN.md).
    """
    rows, q_width, row_tiles = lay.rows, lay.q_width, lay.row_tiles

    @flyc.kernel
    def k1_kernel(X: fx.Tensor, Residual: fx.Tensor, PostMix: fx.Tensor, ResMix: fx.Tensor,
                  HcFn: fx.Tensor, HcBase: fx.Tensor, HcScale: fx.Tensor, AttnNorm: fx.Tensor,
                  WQkv: fx.Tensor, SQkv: fx.Tensor, QNorm: fx.Tensor, KvNorm: fx.Tensor,
                  WQb: fx.Tensor, SQb: fx.Tensor, Rope: fx.Tensor, Positions: fx.Tensor,
                  SlotMapping: fx.Tensor, KvCache: fx.Tensor,
                  ROut: fx.Tensor, PostOut: fx.Tensor, CombOut: fx.Tensor, XNorm: fx.Tensor,
                  QrOut: fx.Tensor, QOut: fx.Tensor,
                  Sync: fx.Tensor, WorkF32: fx.Tensor, WorkU8: fx.Tensor,
                  m: fx.Int32, do_fold: fx.Int32, qkv_stride: fx.Int32, qkv_shuffled: fx.Int32,
                  qb_stride: fx.Int32, qb_shuffled: fx.Int32,
                  page_stride: fx.Int32, block_size: fx.Int32):
        m = fx.min(fx.max(m, 0), rows)  # a bad m must not write past the bucket or wait on other flags
        tid = fx.thread_idx.x
        lane = tid % WAVE
        wave = tid // WAVE
        cta = fx.block_idx.x
        shared = fx.SharedAllocator().allocate(_Shared).peek()
        red = shared.red.view(fx.make_layout(LDS_RED_WORDS, 1))
        gate = shared.gate.view(fx.make_layout(LDS_GATE_WORDS, 1))
        lds_acc = shared.acc.view(fx.make_layout(LDS_ACC_WORDS, 1))
        tag = step_tag(Sync)
        arrive(Sync, tid)

        f32 = flat_view(WorkF32, 1, lay.f32_words * 4)  # scratch: sized by the layout
        f32x4 = flat_view(WorkF32, 4, lay.f32_words * 4)
        u8 = flat_view(WorkU8, 1, lay.bytes)
        u8x8 = flat_view(WorkU8, VEC, lay.bytes)
        u8x16 = flat_view(WorkU8, 16, lay.bytes)
        w_qkv = _Fp8Weight(WQkv, SQkv, H, qkv_stride, qkv_shuffled)
        w_qb = _Fp8Weight(WQb, SQb, Q_LORA, qb_stride, qb_shuffled)
        x_mx = _Mxfp8Rows(u8x16, u8, lay.x_codes, lay.x_scales, H)
        qr_mx = _Mxfp8Rows(u8x16, u8, lay.qr_codes, lay.qr_scales, Q_LORA)

        # ---- S1: fold and mix partials ------------------------------------------------------
        if const_expr(1 in stages):
            stream = tid // SEAM_CHUNK
            for task in range(cta, lay.s1_tasks, CTAS):
                group, chunk = ad.s1_task(task)
                col = chunk * SEAM_CHUNK + tid % SEAM_CHUNK
                fn_view = flat_view(HcFn)
                fn = [load_scalar(fn_view, k * STREAMS * H + stream * H + col, fx.Float32)
                      for k in range_constexpr(MIXES)]
                first = group * SEAM_GROUP
                end = fx.min(first + SEAM_GROUP, m)
                for row in range(first, end):
                    res_view = flat_view(Residual)
                    streams = [load_scalar(res_view, (row * STREAMS + i) * H + col, fx.BFloat16).to(fx.Float32)
                               for i in range_constexpr(STREAMS)]
                    value = fx.Float32(0.0)  # this thread's stream, picked from the four it reads
                    for i in range_constexpr(STREAMS):
                        value = (stream == i).select(streams[i], value)
                    if do_fold != 0:  # layer 0 passes x in post_mix / res_mix: read them only here
                        folded = load_global(PostMix, row * STREAMS + stream) * \
                            load_scalar(flat_view(X), row * H + col, fx.BFloat16).to(fx.Float32)
                        for i in range_constexpr(STREAMS):
                            folded = folded + load_global(ResMix, row * 16 + i * STREAMS + stream) * streams[i]
                        value = folded
                    value = _bf16(value)
                    gpu.barrier()  # all streams of the row are read before any is written (r_out may alias)
                    store_scalar(flat_view(ROut), (row * STREAMS + stream) * H + col, value.to(fx.BFloat16),
                                 fx.BFloat16)
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
                        store_scalar(f32, lay.partials + (row * SEAM_CHUNKS + chunk) * PARTIALS + tid, total,
                                     fx.Float32)
                    gpu.barrier()
                publish(Sync, lay.f1 + task, tag, tid)

        # ---- S2: the seam's gate, collapse, attn_norm, MXFP8 ---------------------------------
        if const_expr(2 in stages):
            for row in range(cta, rows, CTAS):
                if row < m:
                    if const_expr(1 in stages):
                        wait(Sync, *lay.s2_awaits(row), tag, tid)
                    if tid < PARTIALS:
                        total = fx.Float32(0.0)
                        for c in range_constexpr(SEAM_CHUNKS):
                            at = lay.partials + (row * SEAM_CHUNKS + c) * PARTIALS + tid
                            total = total + load_scalar(f32, at, fx.Float32)
                        fx.memref_store(total, gate, tid)
                    gpu.barrier()
                    if wave == 0:
                        _seam_gate(gate, HcBase, HcScale, PostOut, CombOut, row, lane)
                    gpu.barrier()
                    pre = [fx.memref_load(gate, i) for i in range_constexpr(STREAMS)]
                    _collapse_norm_quant(ROut, AttnNorm, XNorm, pre, red, u8x8, u8, lay, row, tid, wave, lane)
                publish(Sync, lay.f2 + row, tag, tid)

        # ---- S3: fused_wqa_wkv -------------------------------------------------------------
        if const_expr(3 in stages):
            for task in range(cta, lay.s3_tasks, CTAS):
                if const_expr(2 in stages):
                    wait(Sync, *lay.s3_awaits(m), tag, tid)
                n0, part = ad.s3_task(task)
                accs = _gemv_steps(w_qkv, x_mx, n0, ad.s3_steps(part, wave), lane, row_tiles)
                _gemv_reduce(accs, lds_acc, tid, wave, lane, WAVES, row_tiles, f32,
                             lay.qkv_raw + part * rows * QKV, QKV, n0, m)
                publish(Sync, lay.f3 + task, tag, tid)

        # ---- S4: q_norm, kv_norm, RoPE, KV insert ------------------------------------------
        if const_expr(4 in stages):
            for row in range(cta, rows, CTAS):
                if row < m:
                    if const_expr(3 in stages):
                        wait(Sync, *lay.s4_awaits(), tag, tid)
                    _qr_norm_quant(f32x4, QNorm, QrOut, red, u8x8, u8, lay, row, tid, wave, lane)
                    if wave == Q_LORA // VEC // WAVE:
                        _kv_insert(f32x4, KvNorm, Rope, Positions, SlotMapping, KvCache, lay, row, lane,
                                   page_stride, block_size)
                publish(Sync, lay.f4 + row, tag, tid)

        # ---- S5: wq_b ----------------------------------------------------------------------
        if const_expr(5 in stages):
            for task in range(cta, lay.s5_tasks, CTAS):
                if const_expr(4 in stages):
                    wait(Sync, *lay.s5_awaits(m), tag, tid)
                tile_row, first = ad.s5_tile(task, wave)
                steps = [(first + s, None) for s in range_constexpr(ad.S5_STEPS)]
                accs = _gemv_steps(w_qb, qr_mx, tile_row, steps, lane, row_tiles)
                _gemv_reduce(accs, lds_acc, tid, wave, lane, ad.S5_WAVES_PER_TILE, row_tiles, f32, lay.q_raw,
                             q_width, task * 2 * TILE_N, m)
                publish(Sync, lay.f5 + task, tag, tid)

        # ---- S6: per-head RMS and RoPE of q --------------------------------------------------
        if const_expr(6 in stages):
            for task in range(cta, lay.s6_tasks, CTAS):
                row = lay.s6_row(task)
                head = (task % lay.head_groups) * WAVES + wave
                if row < m:
                    if const_expr(5 in stages):
                        wait(Sync, *lay.s6_awaits(task), tag, tid)
                    _q_head(f32x4, Rope, Positions, QOut, lay, row, head, lane)
                gpu.barrier()

        leave(Sync, tag, CTAS, tid)

    return k1_kernel


_ROW, _COLUMN = range(2), range(2, 4)  # lane bits of j and i when lane e = 4 i + j


@dsl
def _seam_gate(gate, HcBase, HcScale, PostOut, CombOut, row, lane):
    """Wave 0: mixes -> pre (into gate[0:4]), post and the Sinkhorn comb (stored).

    Lane e = 4 i + j (of every 16) holds comb[i, j]: a row sum is a butterfly over lane bits
    0-1, a column sum over bits 2-3, so each of the 39 normalisations is two shuffles and a
    division per lane instead of sixteen serial divisions.
    """
    e = lane % 16
    inv = _rsqrt(fx.memref_load(gate, MIXES) / float(STREAMS * H) + EPS)
    s0, s1, s2 = (load_global(HcScale, i) for i in range_constexpr(3))
    own = lane % STREAMS
    pre = _sigmoid(fx.memref_load(gate, own) * inv * s0 + load_global(HcBase, own)) + EPS
    post = _sigmoid(fx.memref_load(gate, STREAMS + own) * inv * s1 + load_global(HcBase, STREAMS + own)) * \
        HC_POST_ALPHA
    logit = fx.memref_load(gate, 8 + e) * inv * s2 + load_global(HcBase, 8 + e)
    weight = ((logit - butterfly(logit, fx.max, _ROW)) * LOG2E).exp2()
    comb = weight / butterfly(weight, operator.add, _ROW) + EPS
    comb = comb / (butterfly(comb, operator.add, _COLUMN) + EPS)
    for _ in range_constexpr(SINKHORN_ROUNDS - 1):
        comb = comb / (butterfly(comb, operator.add, _ROW) + EPS)
        comb = comb / (butterfly(comb, operator.add, _COLUMN) + EPS)
    if lane < STREAMS:
        fx.memref_store(pre, gate, lane)
        store_scalar(flat_view(PostOut), row * STREAMS + lane, post, fx.Float32)
    if lane < 16:
        store_scalar(flat_view(CombOut), row * 16 + lane, comb, fx.Float32)


@dsl
def _mx_store(values, u8x8, u8, codes_at, scales_at, chunk, valid):
    """MXFP8 of this lane's 8 values; 4 neighbouring lanes share a 32-block and its code."""
    code = _e8m0(butterfly(_amax8(values), fx.max, range(2)))  # 4 lanes x 8 values = one 32-block
    if valid:
        store(u8x8, (codes_at + chunk * VEC) // VEC, _fp8x8(values, _e8m0_inverse(code)), fx.Uint8, VEC)
        if chunk % (MX_BLOCK // VEC) == 0:
            store_scalar(u8, scales_at + chunk // (MX_BLOCK // VEC), code.to(fx.Uint8), fx.Uint8)


@dsl
def _collapse_norm_quant(ROut, AttnNorm, XNorm, pre, red, u8x8, u8, lay, row, tid, wave, lane):
    """x_norm = RMSNorm(bf16(sum_i pre_i R_i)) with attn_norm; its MXFP8 into the byte scratch."""
    r8, out8 = flat_view(ROut, VEC), flat_view(XNorm, VEC)
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
        mixed = [valid.select(_bf16(v), 0.0) for v in mixed]
        for v in mixed:
            sq = sq + v * v
        passes.append((chunk, valid, at, mixed))
    inv = _rsqrt(_block_sum(sq, red, 0, wave, lane) / float(H) + EPS)
    for chunk, valid, at, mixed in passes:
        w = load_global(AttnNorm, at * VEC, VEC).to(fx.Float32)
        y = [_bf16(mixed[e] * inv * w[e]) for e in range_constexpr(VEC)]
        if valid:
            store(out8, row * ROW_CHUNKS + at, _bf16x8(y), fx.BFloat16, VEC)
        _mx_store(y, u8x8, u8, ad.mx_code_offset(lay.x_codes, row, 0, H), ad.mx_scale_offset(lay.x_scales, row, 0, H),
                  at, valid)


@dsl
def _qr_norm_quant(f32x4, QNorm, QrOut, red, u8x8, u8, lay, row, tid, wave, lane):
    """qr = q_norm(bf16(raw)) for threads 0..191 (8 each); its MXFP8 for S5."""
    chunks = Q_LORA // VEC
    valid = tid < chunks
    at = valid.select(tid, 0)
    raw = _qkv_raw8(f32x4, lay, row, at * VEC)
    v = [valid.select(_bf16(raw[e]), 0.0) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = _rsqrt(_block_sum(sq, red, 1, wave, lane) / float(Q_LORA) + EPS)
    w = load_global(QNorm, at * VEC, VEC).to(fx.Float32)
    y = [_bf16(v[e] * inv * w[e]) for e in range_constexpr(VEC)]
    if valid:
        store(flat_view(QrOut, VEC), row * chunks + at, _bf16x8(y), fx.BFloat16, VEC)
    _mx_store(y, u8x8, u8, ad.mx_code_offset(lay.qr_codes, row, 0, Q_LORA),
              ad.mx_scale_offset(lay.qr_scales, row, 0, Q_LORA), at, valid)


@dsl
def _kv_insert(f32x4, KvNorm, Rope, Positions, SlotMapping, KvCache, lay, row, lane, page_stride, block_size):
    """One wave: kv = kv_norm(bf16(raw)); RoPE on lanes 56..63; the 584-byte record at the slot."""
    raw = _qkv_raw8(f32x4, lay, row, Q_LORA + lane * VEC)
    v = [_bf16(raw[e]) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = _rsqrt(wave_sum(sq) / float(KV_LORA) + EPS)
    w = load_global(KvNorm, lane * VEC, VEC).to(fx.Float32)
    y = [_bf16(v[e] * inv * w[e]) for e in range_constexpr(VEC)]
    nope_lanes = NOPE // VEC  # 56
    position = load_global(Positions, row).to(fx.Int32)
    pair0 = (lane - nope_lanes) * (VEC // 2)
    rotated = _rope8(y, Rope, position, fx.max(pair0, 0))
    y = [(lane >= nope_lanes).select(_bf16(rotated[e]), y[e]) for e in range_constexpr(VEC)]
    per_block = KV_SCALE_BLOCK // VEC  # 8 lanes share a UE8M0 code
    code = _e8m0(fx.max(butterfly(_amax8(y), fx.max, range(3)), KV_AMAX_FLOOR))  # 8 lanes: 64 dims
    slot = load_global(SlotMapping, row)
    if slot >= 0:
        block = block_size.to(fx.Int64)
        record, scales = ad.kv_offsets(slot, block, page_stride.to(fx.Int64))
        cache = fx.get_iter(KvCache)
        if lane < nope_lanes:
            fx.generic_store(cache + (record + lane * VEC), _fp8x8(y, _e8m0_inverse(code)))
            if lane % per_block == 0:
                fx.generic_store(cache + (scales + lane // per_block), code.to(fx.Uint8))
            if lane == 0:  # the record's pad byte, 0 as vLLM's insert writes it
                fx.generic_store(cache + (scales + KV_SCALES - 1), fx.Uint8(0))
        else:
            rope_bytes = _bf16x8(y).bitcast(fx.Uint8)
            fx.generic_store(cache + (record + NOPE + (lane - nope_lanes) * 2 * VEC), rope_bytes)


def _q_head(f32x4, Rope, Positions, QOut, lay, row, head, lane):
    """One wave: q head = RMS(bf16(raw)) without weight, RoPE on dims 448..511, bf16."""
    base = row * lay.q_width + head * HEAD_DIM
    raw = _load8_f32(f32x4, lay.q_raw + base + lane * VEC)
    v = [_bf16(raw[e]) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = _rsqrt(wave_sum(sq) / float(HEAD_DIM) + EPS)
    y = [v[e] * inv for e in range_constexpr(VEC)]
    nope_lanes = NOPE // VEC
    position = load_global(Positions, row).to(fx.Int32)
    rotated = _rope8(y, Rope, position, fx.max((lane - nope_lanes) * (VEC // 2), 0))
    y = [(lane >= nope_lanes).select(rotated[e], y[e]) for e in range_constexpr(VEC)]
    store(flat_view(QOut, VEC), base // VEC + lane, _bf16x8(y), fx.BFloat16, VEC)


def build(spec: Spec, stages: frozenset[int] = ALL_STAGES) -> Build:
    lay = K1Layout.of(spec)
    kernel = make_kernel(lay, frozenset(stages))

    @flyc.jit
    def launch_k1(X: fx.Tensor, Residual: fx.Tensor, PostMix: fx.Tensor, ResMix: fx.Tensor,
                  HcFn: fx.Tensor, HcBase: fx.Tensor, HcScale: fx.Tensor, AttnNorm: fx.Tensor,
                  WQkv: fx.Tensor, SQkv: fx.Tensor, QNorm: fx.Tensor, KvNorm: fx.Tensor,
                  WQb: fx.Tensor, SQb: fx.Tensor, Rope: fx.Tensor, Positions: fx.Tensor,
                  SlotMapping: fx.Tensor, KvCache: fx.Tensor,
                  ROut: fx.Tensor, PostOut: fx.Tensor, CombOut: fx.Tensor, XNorm: fx.Tensor,
                  QrOut: fx.Tensor, QOut: fx.Tensor,
                  Sync: fx.Tensor, WorkF32: fx.Tensor, WorkU8: fx.Tensor,
                  m: fx.Int32, do_fold: fx.Int32, qkv_stride: fx.Int32, qkv_shuffled: fx.Int32,
                  qb_stride: fx.Int32, qb_shuffled: fx.Int32,
                  page_stride: fx.Int32, block_size: fx.Int32,
                  stream: fx.Stream = fx.Stream(None)):
        kernel(X, Residual, PostMix, ResMix, HcFn, HcBase, HcScale, AttnNorm, WQkv, SQkv, QNorm, KvNorm,
               WQb, SQb, Rope, Positions, SlotMapping, KvCache, ROut, PostOut, CombOut, XNorm, QrOut, QOut,
               Sync, WorkF32, WorkU8, m, do_fold, qkv_stride, qkv_shuffled, qb_stride, qb_shuffled, page_stride,
               block_size).launch(
            grid=(CTAS, 1, 1), block=(THREADS, 1, 1), smem=PIN_LDS_BYTES, stream=stream)

    return Build(launch_k1, placeholders(lay))


def placeholders(lay: K1Layout) -> tuple:
    """CPU tensors with the bucket's shapes (flat), in argument order, for flyc.compile."""
    rows = lay.rows

    def empty(n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype)

    bf16, f32, u8, i64 = torch.bfloat16, torch.float32, torch.uint8, torch.int64
    block = 64
    return (
        empty(rows * H, bf16), empty(rows * STREAMS * H, bf16), empty(rows * STREAMS, f32), empty(rows * 16, f32),
        empty(MIXES * STREAMS * H, f32), empty(MIXES, f32), empty(3, f32), empty(H, bf16),
        empty(QKV * H, u8), empty((QKV // WEIGHT_BLOCK) * (H // WEIGHT_BLOCK), u8), empty(Q_LORA, bf16),
        empty(KV_LORA, bf16),
        empty(lay.q_width * Q_LORA, u8), empty((lay.q_width // WEIGHT_BLOCK) * (Q_LORA // WEIGHT_BLOCK), u8),
        empty(1024 * ROPE, f32), empty(rows, i64), empty(rows, i64), empty(block * 584, u8),
        empty(rows * STREAMS * H, bf16), empty(rows * STREAMS, f32), empty(rows * 16, f32), empty(rows * H, bf16),
        empty(rows * Q_LORA, bf16), empty(rows * lay.q_width, bf16),
        empty(lay.sync_words, torch.int32), empty(lay.f32_words, f32), empty(lay.bytes, u8),
        rows, 1, H, 0, Q_LORA, 0, block * 584, block,
    )
