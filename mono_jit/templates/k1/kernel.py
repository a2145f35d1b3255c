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

What has been verified of this kernel, and where: docs/layer.md, "What each kernel's checks
cover".
"""

from dataclasses import replace

import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from ... import deepseek_v4
from ...spec import Spec
from .._dsl import butterfly, dsl, flat_view, load_global, load_scalar, store, wave_sum
from .._gemv import Fp8Weight, Mxfp8Rows, gemv_reduce, gemv_steps
from .._numerics import VEC, bf16_round, bf16x8, e8m0, e8m0_inverse, amax8, fp8x8, block_sum, load8_f32, \
    mx_store, rope8, rsqrt
from .._seam import fold_row, mix_weights, seam_row
from ..sync_device import leave
from ..base import Build
from ..launch import template_build
from ..schedule import Stage
from ..stage_loop import StageWork, enter, run_stage
from .. import addressing, seam_layout
from . import K1Template, addressing as k1_addressing
from ...deepseek_v4 import EPS, HEAD_DIM, KV_LORA, NOPE, Q_LORA
from ..geometry import (CTAS, KV_SCALE_BLOCK, KV_SCALES, LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS,
                        PARTIALS, SEAM_CHUNK, SEAM_CHUNKS, SEAM_GROUP, TILE_N, WAVE, WAVES)
from .layout import QKV, SCHEDULE, K1Layout
from .reference import KV_AMAX_FLOOR

H = deepseek_v4.HIDDEN


@fx.struct
class _Shared:
    red: fx.Array[fx.Float32, LDS_RED_WORDS, 16]  # per-wave partials of block reductions
    gate: fx.Array[fx.Float32, LDS_GATE_WORDS, 16]  # S2: the 25 sums, then pre
    acc: fx.Array[fx.Float32, LDS_ACC_WORDS, 16]  # GEMV split-K partials


def _qkv_raw8(f32x4, lay, row, col):
    """Eight S3 outputs of a row: its two K halves added in a fixed order."""
    first = load8_f32(f32x4, lay.qkv_raw + row * QKV + col)
    second = load8_f32(f32x4, lay.qkv_raw + (lay.rows + row) * QKV + col)
    return [first[e] + second[e] for e in range_constexpr(VEC)]


# -- the stages' work (what a live task does; the schedule in layout.py says when) ----------------

@dsl
def _s1_fold(k, task, _row):
    """S1 task: fold and mix partials of one row group and 128-column chunk."""
    lay = k.lay
    group, chunk = seam_layout.fold_task(task)
    col = chunk * SEAM_CHUNK + k.tid % SEAM_CHUNK
    fn = mix_weights(flat_view(k.HcFn), k.stream, col)
    x_at = lambda row: load_scalar(flat_view(k.X), row * H + col, fx.BFloat16).to(fx.Float32)  # noqa: E731
    first = group * SEAM_GROUP
    end = fx.min(first + SEAM_GROUP, k.m)
    for row in range(first, end):
        fold_row(flat_view(k.Residual), fx.get_iter(k.PostMix), fx.get_iter(k.ResMix), flat_view(k.ROut), x_at,
                 k.do_fold, fn, k.red, k.f32,
                 lay.partials + (row * SEAM_CHUNKS + chunk) * PARTIALS, row, col, k.stream, k.tid, k.wave, k.lane)


def _s2_seam(k, task, row):
    """S2 row: the seam's gate, collapse, attn_norm, MXFP8."""
    lay = k.lay
    seam_row(k.f32, lay.partials + row * SEAM_CHUNKS * PARTIALS, k.gate, k.red, fx.get_iter(k.HcBase),
             fx.get_iter(k.HcScale), fx.get_iter(k.PostOut), fx.get_iter(k.CombOut), flat_view(k.ROut, VEC),
             fx.get_iter(k.AttnNorm), flat_view(k.XNorm, VEC), k.u8x8, k.u8,
             addressing.mx_code_offset(lay.x_codes, row, 0, H), addressing.mx_scale_offset(lay.x_scales, row, 0, H),
             row, k.tid, k.wave, k.lane)


def _s3_qkv(k, task, row):
    """S3 task: one N tile and K half of fused_wqa_wkv."""
    lay = k.lay
    n0, part = k1_addressing.s3_task(task)
    accs = gemv_steps(k.w_qkv, k.x_mx, n0, k1_addressing.s3_steps(part, k.wave), k.lane, lay.row_tiles)
    gemv_reduce(accs, k.lds_acc, k.tid, k.wave, k.lane, WAVES, lay.row_tiles, k.f32,
                lay.qkv_raw + part * lay.rows * QKV, QKV, n0, k.m)


@dsl
def _s4_norms(k, task, row):
    """S4 row: q_norm, kv_norm, RoPE, KV insert."""
    _qr_norm_quant(k.f32x4, k.QNorm, k.QrOut, k.red, k.u8x8, k.u8, k.lay, row, k.tid, k.wave, k.lane)
    if k.wave == Q_LORA // VEC // WAVE:
        _kv_insert(k.f32x4, k.KvNorm, k.Rope, k.Positions, k.SlotMapping, k.KvCache, k.lay, row, k.lane,
                   k.page_stride, k.block_size)


def _s5_qb(k, task, row):
    """S5 task: two N tiles of wq_b."""
    lay = k.lay
    tile_row, first = k1_addressing.s5_tile(task, k.wave)
    steps = [(first + s, None) for s in range_constexpr(k1_addressing.S5_STEPS)]
    accs = gemv_steps(k.w_qb, k.qr_mx, tile_row, steps, k.lane, lay.row_tiles)
    gemv_reduce(accs, k.lds_acc, k.tid, k.wave, k.lane, k1_addressing.S5_WAVES_PER_TILE, lay.row_tiles, k.f32,
                lay.q_raw, lay.q_width, task * 2 * TILE_N, k.m)


def _s6_heads(k, task, row):
    """S6 task: per-head RMS and RoPE of q, one wave per head."""
    head = (task % k.lay.head_groups) * WAVES + k.wave
    _q_head(k.f32x4, k.Rope, k.Positions, k.QOut, k.lay, row, head, k.lane)


STAGE_WORK = {1: StageWork(_s1_fold), 2: StageWork(_s2_seam), 3: StageWork(_s3_qkv), 4: StageWork(_s4_norms),
              5: StageWork(_s5_qb), 6: StageWork(_s6_heads)}


# -- the kernel ------------------------------------------------------------------------------

ALL_STAGES = frozenset(s.number for s in SCHEDULE)


def make_kernel(lay: K1Layout, stages: frozenset[int] = ALL_STAGES):
    """The K1 kernel with the given stages (all of them for K1 itself), run in SCHEDULE's order.

    A build with a subset is a standalone launch of those stages: a stage whose producer is
    left out does not wait for it and reads its inputs from the buffers as the caller prepared
    them, so each stage can be tested alone against its reference on a GPU or the emulator.
    """
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
        k = enter(lay, Sync, m, _Shared)
        f32 = flat_view(WorkF32, 1, lay.f32_words * 4)  # scratch: sized by the layout
        f32x4 = flat_view(WorkF32, 4, lay.f32_words * 4)
        u8 = flat_view(WorkU8, 1, lay.bytes)
        u8x8 = flat_view(WorkU8, VEC, lay.bytes)
        u8x16 = flat_view(WorkU8, 16, lay.bytes)
        w_qkv = Fp8Weight(flat_view(WQkv, 16), fx.get_iter(SQkv), H, qkv_stride, qkv_shuffled)
        w_qb = Fp8Weight(flat_view(WQb, 16), fx.get_iter(SQb), Q_LORA, qb_stride, qb_shuffled)
        x_mx = Mxfp8Rows(u8x16, u8, lay.x_codes, lay.x_scales, H)
        qr_mx = Mxfp8Rows(u8x16, u8, lay.qr_codes, lay.qr_scales, Q_LORA)
        stream = k.tid // SEAM_CHUNK  # S1: the mHC stream this thread folds
        k = k.but(X=X, Residual=Residual, PostMix=PostMix, ResMix=ResMix, HcFn=HcFn, HcBase=HcBase, HcScale=HcScale,
                  AttnNorm=AttnNorm, QNorm=QNorm, KvNorm=KvNorm, Rope=Rope, Positions=Positions,
                  SlotMapping=SlotMapping, KvCache=KvCache, ROut=ROut, PostOut=PostOut, CombOut=CombOut,
                  XNorm=XNorm, QrOut=QrOut, QOut=QOut, do_fold=do_fold, page_stride=page_stride,
                  block_size=block_size, f32=f32, f32x4=f32x4, u8=u8, u8x8=u8x8, w_qkv=w_qkv, w_qb=w_qb,
                  x_mx=x_mx, qr_mx=qr_mx, stream=stream)

        for stage in lay.schedule:
            if const_expr(stage.number in stages):
                run_stage(k, stage, stages, STAGE_WORK[stage.number])

        leave(Sync, k.tag, CTAS, k.tid)

    return k1_kernel


@dsl
def _qr_norm_quant(f32x4, QNorm, QrOut, red, u8x8, u8, lay, row, tid, wave, lane):
    """qr = q_norm(bf16(raw)) for threads 0..191 (8 each); its MXFP8 for S5."""
    chunks = Q_LORA // VEC
    valid = tid < chunks
    at = valid.select(tid, 0)
    raw = _qkv_raw8(f32x4, lay, row, at * VEC)
    v = [valid.select(bf16_round(raw[e]), 0.0) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = rsqrt(block_sum(sq, red, 1, wave, lane) / float(Q_LORA) + EPS)
    w = load_global(QNorm, at * VEC, VEC).to(fx.Float32)
    y = [bf16_round(v[e] * inv * w[e]) for e in range_constexpr(VEC)]
    if valid:
        store(flat_view(QrOut, VEC), row * chunks + at, bf16x8(y), fx.BFloat16, VEC)
    mx_store(y, u8x8, u8, addressing.mx_code_offset(lay.qr_codes, row, 0, Q_LORA),
              addressing.mx_scale_offset(lay.qr_scales, row, 0, Q_LORA), at, valid)


@dsl
def _kv_insert(f32x4, KvNorm, Rope, Positions, SlotMapping, KvCache, lay, row, lane, page_stride, block_size):
    """One wave: kv = kv_norm(bf16(raw)); RoPE on lanes 56..63; the 584-byte record at the slot."""
    raw = _qkv_raw8(f32x4, lay, row, Q_LORA + lane * VEC)
    v = [bf16_round(raw[e]) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = rsqrt(wave_sum(sq) / float(KV_LORA) + EPS)
    w = load_global(KvNorm, lane * VEC, VEC).to(fx.Float32)
    y = [bf16_round(v[e] * inv * w[e]) for e in range_constexpr(VEC)]
    nope_lanes = NOPE // VEC  # 56
    position = load_global(Positions, row).to(fx.Int32)
    pair0 = (lane - nope_lanes) * (VEC // 2)
    rotated = rope8(y, fx.get_iter(Rope), position, fx.max(pair0, 0))
    y = [(lane >= nope_lanes).select(bf16_round(rotated[e]), y[e]) for e in range_constexpr(VEC)]
    per_block = KV_SCALE_BLOCK // VEC  # 8 lanes share a UE8M0 code
    code = e8m0(fx.max(butterfly(amax8(y), fx.max, range(3)), KV_AMAX_FLOOR))  # 8 lanes: 64 dims
    slot = load_global(SlotMapping, row)
    if slot >= 0:
        block = block_size.to(fx.Int64)
        record, scales = addressing.kv_offsets(slot, block, page_stride.to(fx.Int64))
        cache = fx.get_iter(KvCache)
        if lane < nope_lanes:
            fx.generic_store(cache + (record + lane * VEC), fp8x8(y, e8m0_inverse(code)))
            if lane % per_block == 0:
                fx.generic_store(cache + (scales + lane // per_block), code.to(fx.Uint8))
            if lane == 0:  # the record's pad byte, 0 as vLLM's insert writes it
                fx.generic_store(cache + (scales + KV_SCALES - 1), fx.Uint8(0))
        else:
            rope_bytes = bf16x8(y).bitcast(fx.Uint8)
            fx.generic_store(cache + (record + NOPE + (lane - nope_lanes) * 2 * VEC), rope_bytes)


def _q_head(f32x4, Rope, Positions, QOut, lay, row, head, lane):
    """One wave: q head = RMS(bf16(raw)) without weight, RoPE on dims 448..511, bf16."""
    base = row * lay.q_width + head * HEAD_DIM
    raw = load8_f32(f32x4, lay.q_raw + base + lane * VEC)
    v = [bf16_round(raw[e]) for e in range_constexpr(VEC)]
    sq = fx.Float32(0.0)
    for e in range_constexpr(VEC):
        sq = sq + v[e] * v[e]
    inv = rsqrt(wave_sum(sq) / float(HEAD_DIM) + EPS)
    y = [v[e] * inv for e in range_constexpr(VEC)]
    nope_lanes = NOPE // VEC
    position = load_global(Positions, row).to(fx.Int32)
    rotated = rope8(y, fx.get_iter(Rope), position, fx.max((lane - nope_lanes) * (VEC // 2), 0))
    y = [(lane >= nope_lanes).select(rotated[e], y[e]) for e in range_constexpr(VEC)]
    store(flat_view(QOut, VEC), base // VEC + lane, bf16x8(y), fx.BFloat16, VEC)


def build(spec: Spec, stages: frozenset[int] = ALL_STAGES, schedule: tuple[Stage, ...] = SCHEDULE) -> Build:
    """K1 holding `stages`, run as `schedule` says (SCHEDULE; the tests pass a wrong one to see
    the kernel follow it)."""
    lay = replace(K1Layout.of(spec), schedule=schedule)
    return template_build(K1Template(), spec, make_kernel(lay, frozenset(stages)))
