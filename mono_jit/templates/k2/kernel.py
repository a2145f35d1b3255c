"""FlyDSL source of K2 (contract in the package docstring, decomposition in attention_layout.py and
moe_layout.py): each stage's work per task (STAGE_WORK), whose loops stage_loop.run_stage runs
from the schedule table; the stages' device code lives in attention_kernel.py (part one)
and moe_kernel.py (part two).

(No `from __future__ import annotations` here: fx.struct and @flyc.kernel read real annotations.)

How each stage runs on a CTA of 512 threads (8 waves of 64):
- S1 key table: wave 0 runs the `keytable` template's row function (keytable/kernel.py), one
  implementation for both; graph-pad rows (slot -1) and rows past m get no keys.
- S2 attention: thread t holds head t / 32 of the tile and 16 dims 16 (t % 32) .. + 15 of the
  512: its q slice (pre-scaled by 512^-0.5 log2 e) and its accumulator slice. Keys go four at a
  time (their loads in flight together): a lane reads 16 e4m3 bytes and its 64-dim block's
  UE8M0 code, or 32 bytes of bf16 RoPE dims (the last four lanes of a head), the head's score
  is a butterfly over its 32 lanes, and the running (max, sum, acc) rescales once a group. The
  SWA keys read the SWA cache, the rest the compressed cache (two loops, one state).
- S3 merge: wave 0, a lane per 8 dims: the chunks' states and the sink merged in base 2, bf16,
  the inverse RoPE on lanes 56..63, MXFP8 per 32 (numerics.mx_store).
- S4 wo_a / S6 wo_b: the shared scaled-MFMA GEMV (templates/_gemv.py, templates/addressing.py's operand layout).
  S6 reduces its waves' accumulators through LDS, rounds to bf16 and pushes (bf16 pair, tag)
  as one 8-byte system-scope store per pair to the peers (allreduce.wob_push).
- S7 reduce + fold: 64 threads sum a row's 128 columns over the ranks in rank order (f32, then
  bf16) into LDS, and the CTA folds the row with the shared seam code (templates/_seam.py).
- S8: the shared seam row with hc_ffn_* and ffn_norm.

Cross-rank hand-offs (S6's and S18's pushes, S7's and S19's polls and rank-order sums, and the
gfx950 facts they rest on): allreduce.py.

What has been verified of this kernel, and where: docs/layer.md, "What each kernel's checks
cover".
"""


from dataclasses import replace

import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr

from ... import deepseek_v4
from ...deepseek_v4 import HEAD_DIM, MIXES, STREAMS
from ...spec import Spec
from ..addressing import mx_code_offset, mx_scale_offset, split_steps
from .. import schedule as stage_table
from .._dsl import (dsl, flat_view, fresh, fresh_pointer, fresh_scalar, load_global, load_scalar,
                    store_scalar, table_entry, table_pointer, typed_view)
from .._gemv import Fp8Weight, Mxfp8Rows, gemv_reduce, gemv_steps
from .._numerics import VEC
from .._seam import fold_row, mix_weights, seam_row
from ..base import Build
from ..launch import template_build
from ..geometry import (CTAS, LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS, PAIR_BYTES, PARTIALS,
                        SEAM_CHUNK, SEAM_CHUNKS, SEAM_GROUP, TILE_N, WAVE, WAVES)
from ..keytable.kernel import key_table_row
from ..stage_loop import Frame, StageWork, enter, run_stage
from ..sync_device import leave
from . import K2Template, attention_addressing
from .moe_addressing import expert_scale_bytes, expert_weight_bytes, w13_tile
from .attention_kernel import attention_task, merge_task, z_quant_row
from .moe_kernel import PickRows, act_row, fp4_steps, logits_task, reduce_to_picks, store_down, top6_row, union_task
from .allreduce import moe_push, reduce_row, stage_peer_addresses, wob_push
from .attention_layout import (
    HEADS_PER_GROUP, LDS_MOE_WORDS, LDS_PEER_WORDS, LDS_Y_WORDS, STATE_TABLE, WEIGHT_TABLE,
)
from .moe_layout import SCHEDULE, DOWN_TILES, EXPERTS, SHARED_K_PARTS, K2MoeLayout

H = deepseek_v4.HIDDEN


@fx.struct
class _Shared:
    red: fx.Array[fx.Float32, LDS_RED_WORDS, 16]  # per-wave partials of block reductions
    gate: fx.Array[fx.Float32, LDS_GATE_WORDS, 16]  # the seam's 25 sums, then pre
    acc: fx.Array[fx.Float32, LDS_ACC_WORDS, 16]  # GEMV split-K partials
    y: fx.Array[fx.Float32, LDS_Y_WORDS, 16]  # S7: the reduced row's 128 columns
    peers: fx.Array[fx.Int32, LDS_PEER_WORDS, 16]  # every rank's peer-buffer address (low, high words)
    moe: fx.Array[fx.Int32, LDS_MOE_WORDS, 16]  # S11: the union's slots, then the waves' counts


# -- the stages' work (what a task does; the schedule in layout.py and moe_layout.py says when) ----

def _entry(table, names: tuple[str, ...], name: str, dtype, like):
    """Entry `name` of an address table whose order is `names`, as a pointer to `dtype` (from
    `like`'s f32 pointer type: its 4-byte alignment serves f32, bf16 and byte views)."""
    return fx.recast_iter(dtype, table_pointer(table, names.index(name), like))


def _weight(k, name: str, dtype):
    """The layer's weight `name` (layout.WEIGHT_TABLE) as a pointer to `dtype`."""
    return _entry(k.Weights, WEIGHT_TABLE, name, dtype, k.Work)


def _state(k, name: str, dtype):
    """The runner's buffer `name` (layout.STATE_TABLE) as a pointer to `dtype`."""
    return _entry(k.State, STATE_TABLE, name, dtype, k.Work)


def _layer_int(k, name: str):
    """An integer entry of the layer's table (a weight's stride or layout flag)."""
    return table_entry(k.Weights, WEIGHT_TABLE.index(name)).to(fx.Int32)


class _Scratch:
    """The i32 scratch as a schedule.Lookup: a wait that depends on what an earlier stage wrote
    (S16's on its expert's slot) loads those words, and selects and takes maxima as DSL ops."""

    def __init__(self, lay: K2MoeLayout, i32):
        self.lay, self.i32 = lay, i32

    def read(self, region: str, index):
        return load_scalar(self.i32, getattr(self.lay, region) + index, fx.Int32)

    @staticmethod
    def select(cond, a, b):
        return cond.select(a, b)

    @staticmethod
    def max(a, b):
        return fx.max(a, b)


def _stage_frame(k: Frame) -> Frame:
    """Every stage's setup: its own tid, lane and cta (_dsl.fresh: no lane mask or loop guard
    lives across stages) and its own work views (f32, f32x4, i32, u8, u8x8, u8x16, each bounded
    by its region's size; _dsl.fresh_pointer), and the i32 scratch its waits read."""
    lay = k.lay
    fresh_tid = fresh(fx.thread_idx.x)
    tid, lane, cta = fresh_tid, fresh_tid % WAVE, fresh_scalar(fx.block_idx.x)
    work = fresh_pointer(fx.get_iter(k.Work))
    u8_at = work + lay.u8_at // 4
    f32, f32x4 = typed_view(work, fx.Float32, lay.f32_words), typed_view(work, fx.Float32, lay.f32_words, 4)
    i32 = typed_view(work + lay.i32_at // 4, fx.Int32, lay.i32_words)
    u8, u8x8 = typed_view(u8_at, fx.Uint8, lay.bytes), typed_view(u8_at, fx.Uint8, lay.bytes, VEC)
    u8x16 = typed_view(u8_at, fx.Uint8, lay.bytes, 16)
    return k.but(tid=tid, lane=lane, cta=cta, f32=f32, f32x4=f32x4, i32=i32, u8=u8, u8x8=u8x8, u8x16=u8x16,
                 data=_Scratch(lay, i32))


@dsl
def _s1_key_table(k, task, _row):
    """S1 task = row, wave 0: the row's key table (keytable/kernel.py); a graph-pad row (slot -1)
    or one past m gets no keys."""
    lay, row = k.lay, task
    if k.wave == 0:
        count, swa = fx.Int32(0), fx.Int32(0)
        if row < k.m:  # slot_mapping holds m rows: read no further
            if load_global(k.SlotMapping, row) >= 0:
                count, swa = key_table_row(k.SwaIndices, k.SwaLens, k.TokenReq, k.TopK, k.BlockTable, k.i32, row,
                                           lay.key_slots + row * lay.keys, k.lane, lay.topk_width,
                                           lay.ratio == deepseek_v4.CSA_RATIO, k.bt_stride, k.per_page)
        if k.lane == 0:
            store_scalar(k.i32, lay.key_counts + 2 * row, count, fx.Int32)
            store_scalar(k.i32, lay.key_counts + 2 * row + 1, swa, fx.Int32)


def _s2_attention(k, task, _row):
    """S2 task: attention over one key chunk (attention_task)."""
    q = typed_view(_state(k, "q", fx.BFloat16), fx.BFloat16, k.lay.rows * k.lay.heads * HEAD_DIM, VEC)
    attention_task(k.lay, task, q, k.SwaCache, k.CompCache, k.i32, k.f32x4, k.f32, k.swa_page_stride, k.swa_block,
                    k.comp_page_stride, k.comp_block, k.tid)


@dsl
def _s3_merge(k, task, _row):
    """S3 task, wave 0: merge, inverse RoPE, MXFP8 (merge_task)."""
    if k.wave == 0:
        merge_task(k.lay, task, _weight(k, "attn_sink", fx.Float32), _weight(k, "rope", fx.Float32), k.Positions,
                    k.f32, k.f32x4, k.u8x8, k.u8, k.lane)


def _s4_setup(k: Frame) -> Frame:
    """S4's frame: wo_a's weight view, built once for the stage."""
    k = _stage_frame(k)
    woa_stride = _layer_int(k, "woa_stride")
    w_oa = Fp8Weight(typed_view(_weight(k, "w_oa", fx.Uint8), fx.Uint8, k.lay.o_width * woa_stride, 16),
                     _weight(k, "s_oa", fx.Uint8), HEADS_PER_GROUP * HEAD_DIM, woa_stride,
                     _layer_int(k, "woa_shuffled"))
    return k.but(w_oa=w_oa)


def _s4_woa(k, task, _row):
    """S4 task: one N tile and K half of wo_a, its f32 half to the scratch."""
    lay = k.lay
    n0, part, group = attention_addressing.woa_task(lay, task)
    acts = Mxfp8Rows(k.u8x16, k.u8, *attention_addressing.woa_operand(lay, group))
    accs = gemv_steps(k.w_oa, acts, n0, attention_addressing.woa_steps(part, k.wave), k.lane, k.row_tiles)
    gemv_reduce(accs, k.lds_acc, k.tid, k.wave, k.lane, WAVES, k.row_tiles, k.f32,
                lay.woa_raw + part * lay.rows * lay.o_width, lay.o_width, n0, k.m)


def _s5_z(k, _task, row):
    """S5 row: z = bf16(wo_a), MXFP8 (z_quant_row)."""
    z_quant_row(k.lay, row, k.f32x4, k.u8x8, k.u8, k.tid)


def _s6_setup(k: Frame) -> Frame:
    """S6's frame: wo_b's weight view and z's MXFP8 rows, built once for the stage."""
    k = _stage_frame(k)
    lay = k.lay
    wob_stride = _layer_int(k, "wob_stride")
    w_ob = Fp8Weight(typed_view(_weight(k, "w_ob", fx.Uint8), fx.Uint8, H * wob_stride, 16),
                     _weight(k, "s_ob", fx.Uint8), lay.o_width, wob_stride, _layer_int(k, "wob_shuffled"))
    return k.but(w_ob=w_ob, z_mx=Mxfp8Rows(k.u8x16, k.u8, lay.z_codes, lay.z_scales, lay.o_width))


def _s6_wob(k, task, _row):
    """S6 task: one N tile of wo_b, pushed to the peers (allreduce.wob_push)."""
    accs = gemv_steps(k.w_ob, k.z_mx, task * TILE_N, attention_addressing.wob_steps(k.lay, k.wave), k.lane,
                      k.row_tiles)
    wob_push(k.lay, task, accs, k.lds_acc, k.lds_peers, k.Mailbox, k.half_at, k.rank, k.tag, k.m, k.tid, k.wave,
             k.lane)


def _s7_setup(k: Frame) -> Frame:
    """S7's frame: the mHC stream each thread folds."""
    k = _stage_frame(k)
    return k.but(stream=k.tid // SEAM_CHUNK)


@dsl
def _s7_reduce_seam(k, task, _row):
    """S7 task = (row group, column chunk): each row's all-reduce (a row past m only pushes),
    then the FFN seam's fold of the live rows."""
    lay, tid, rows = k.lay, k.tid, k.lay.rows
    group, chunk = lay.s7_task(task)
    col = chunk * SEAM_CHUNK + tid % SEAM_CHUNK
    fn = mix_weights(typed_view(_weight(k, "hc_fn", fx.Float32), fx.Float32, MIXES * STREAMS * H), k.stream, col)
    residual = typed_view(_state(k, "residual", fx.BFloat16), fx.BFloat16, rows * STREAMS * H)
    r_out = typed_view(_state(k, "r_out", fx.BFloat16), fx.BFloat16, rows * STREAMS * H)
    post_in, comb_in = _state(k, "post_in", fx.Float32), _state(k, "comb_in", fx.Float32)
    x_at = lambda row: fx.memref_load(k.y, tid % SEAM_CHUNK)  # noqa: E731
    first = group * SEAM_GROUP
    for row in range(first, fx.min(first + SEAM_GROUP, rows)):
        live = row < k.m
        reduce_row(lay, chunk, row, live, k.Mailbox, k.lds_peers, k.half_at, k.rank, k.tag, k.peer_wait_us, k.y, tid)
        if live:
            fold_row(residual, post_in, comb_in, r_out, x_at, fx.Int32(1), fn, k.red, k.f32,
                     lay.partials + (row * SEAM_CHUNKS + chunk) * PARTIALS, row, col, k.stream, tid, k.wave, k.lane)


def _s8_seam_gate(k, _task, row):
    """S8 row: the FFN seam's gate, collapse, ffn_norm, MXFP8 (_seam.seam_row)."""
    lay, rows = k.lay, k.lay.rows
    seam_row(k.f32, lay.partials + row * SEAM_CHUNKS * PARTIALS, k.gate, k.red,
             _weight(k, "hc_base", fx.Float32), _weight(k, "hc_scale", fx.Float32),
             _state(k, "post_out", fx.Float32), _state(k, "comb_out", fx.Float32),
             typed_view(_state(k, "r_out", fx.BFloat16), fx.BFloat16, rows * STREAMS * H, VEC),
             _weight(k, "ffn_norm", fx.BFloat16),
             typed_view(_state(k, "x_norm", fx.BFloat16), fx.BFloat16, rows * H, VEC), k.u8x8, k.u8,
             mx_code_offset(lay.ffn_codes, row, 0, H), mx_scale_offset(lay.ffn_scales, row, 0, H),
             row, k.tid, k.wave, k.lane, _state(k, "pre_out", fx.Float32))


# ==== part two: the MoE (moe_layout.py, moe_kernel.py) =========================================

def _s9_logits(k, task, _row):
    """S9 task: the router logits of 8 experts, one a wave (moe_kernel.logits_task)."""
    logits_task(typed_view(_weight(k, "gate", fx.BFloat16), fx.BFloat16, EXPERTS * H, VEC),
                typed_view(_state(k, "x_norm", fx.BFloat16), fx.BFloat16, k.lay.rows * H, VEC), k.f32,
                k.lay.logits, task, k.m, k.wave, k.lane)


@dsl
def _s10_top6(k, _task, row):
    """S10 row, wave 0: its six experts and weights (top6_row)."""
    lay = k.lay
    if k.wave == 0:
        # a hash layer has no bias: its view holds 0 bytes, so every read is 0 and touches no
        # memory (the table entry may be 0)
        bias = typed_view(_weight(k, "bias", fx.Float32), fx.Float32, (k.use_hash == 0).select(EXPERTS, 0))
        top6_row(k.f32, k.i32, bias, flat_view(k.RouteIds), lay.logits, lay.ids, lay.route_weights, row, k.lane,
                  k.use_hash)


def _s11_union(k, _task, _row):
    """S11's one task: the union of chosen experts (moe_kernel.union_task)."""
    lay = k.lay
    union_task(k.i32, k.lds_moe, lay.ids, lay.union, lay.union_size, lay.pick_of, lay.slot_of, lay.rows, k.m, k.tid)


def _s12_setup(k: Frame) -> Frame:
    """S12's frame: the shared gate / up's weight view and the FFN seam's MXFP8 rows."""
    k = _stage_frame(k)
    lay = k.lay
    w_sgu = Fp8Weight(typed_view(_weight(k, "sgu", fx.Uint8), fx.Uint8, 2 * lay.inter * _layer_int(k, "sgu_stride"),
                                 16),
                      _weight(k, "sgu_s", fx.Uint8), H, _layer_int(k, "sgu_stride"), _layer_int(k, "sgu_shuffled"))
    return k.but(w_sgu=w_sgu, x_mx=Mxfp8Rows(k.u8x16, k.u8, lay.ffn_codes, lay.ffn_scales, H))


def _s12_shared_gate_up(k, task, _row):
    """S12 task: one 16-row tile and K quarter of the shared gate / up, its f32 part to the scratch."""
    lay, rows, inter = k.lay, k.lay.rows, k.lay.inter
    quarter = H // 128 // SHARED_K_PARTS
    tile, part = task // SHARED_K_PARTS, task % SHARED_K_PARTS
    accs = gemv_steps(k.w_sgu, k.x_mx, tile * TILE_N, split_steps(part * quarter, quarter, k.wave), k.lane,
                      k.row_tiles)
    gemv_reduce(accs, k.lds_acc, k.tid, k.wave, k.lane, WAVES, k.row_tiles, k.f32,
                lay.sgu_raw + part * rows * 2 * inter, 2 * inter, tile * TILE_N, k.m)


@dsl
def _s13_shared_act(k, _task, row):
    """S13 row, wave 0: the shared SwiGLU of the summed quarters, MXFP8 (moe_kernel.act_row)."""
    lay, inter = k.lay, k.lay.inter
    if k.wave == 0:
        first = lay.sgu_raw + row * 2 * inter
        act_row(k.f32x4, k.u8x8, k.u8, first, first + inter, SHARED_K_PARTS, lay.rows * 2 * inter, True, inter,
                lay.sh_codes + row * inter, lay.sh_scales + row * inter // 32, k.lane)


def _s14_setup(k: Frame) -> Frame:
    """S14's frame: the shared down's weight view and the shared h's MXFP8 rows."""
    k = _stage_frame(k)
    lay = k.lay
    w_sw2 = Fp8Weight(typed_view(_weight(k, "sw2", fx.Uint8), fx.Uint8, H * _layer_int(k, "sw2_stride"), 16),
                      _weight(k, "sw2_s", fx.Uint8), lay.inter, _layer_int(k, "sw2_stride"),
                      _layer_int(k, "sw2_shuffled"))
    return k.but(w_sw2=w_sw2, h_mx=Mxfp8Rows(k.u8x16, k.u8, lay.sh_codes, lay.sh_scales, lay.inter))


def _s14_shared_down(k, task, _row):
    """S14 task: one 16-row tile of the shared down, f32 to the scratch."""
    accs = gemv_steps(k.w_sw2, k.h_mx, task * TILE_N, split_steps(0, k.lay.inter // 128, k.wave), k.lane,
                      k.row_tiles)
    gemv_reduce(accs, k.lds_acc, k.tid, k.wave, k.lane, WAVES, k.row_tiles, k.f32, k.lay.shared_raw, H,
                task * TILE_N, k.m)


def _s15_setup(k: Frame) -> Frame:
    """S15's frame: the experts' w13 and its scales, and the FFN seam's MXFP8 rows."""
    k = _stage_frame(k)
    lay = k.lay
    w13 = typed_view(_weight(k, "w13", fx.Uint8), fx.Uint8, expert_weight_bytes(EXPERTS * 2 * lay.inter, H), 16)
    w13_s = typed_view(_weight(k, "w13_s", fx.Uint8), fx.Uint8, expert_scale_bytes(EXPERTS * 2 * lay.inter, H))
    return k.but(w13=w13, w13_s=w13_s, x_mx=Mxfp8Rows(k.u8x16, k.u8, lay.ffn_codes, lay.ffn_scales, H))


@dsl
def _s15_routed_gate_up(k, task, _row):
    """S15 task = (union slot, 16-column block): its expert's gate and up tiles to each pick;
    a slot past the step's union does nothing."""
    lay, rows, inter, i32 = k.lay, k.lay.rows, k.lay.inter, k.i32
    blocks = inter // TILE_N
    slot, block = task // blocks, task % blocks
    if slot < load_scalar(i32, lay.union_size, fx.Int32):
        expert = load_scalar(i32, lay.union + slot, fx.Int32)
        for up in range_constexpr(2):
            accs = fp4_steps(k.w13, k.w13_s, expert, w13_tile(block, up), 2 * inter, H, k.x_mx,
                             split_steps(0, H // 128, k.wave), k.lane, k.row_tiles)
            reduce_to_picks(accs, k.lds_acc, i32, k.f32, lay.pick_of + slot * rows, lay.gu, 2 * inter,
                            up * inter + block * TILE_N, k.m, rows, k.tid, k.wave, k.lane)


@dsl
def _s16_routed_act(k, pick, _row):
    """S16 pick, wave 0: its routed SwiGLU, MXFP8 (moe_kernel.act_row)."""
    lay, inter = k.lay, k.lay.inter
    if k.wave == 0:
        first = lay.gu + pick * 2 * inter
        act_row(k.f32x4, k.u8x8, k.u8, first, first + inter, 1, 0, False, inter, lay.rh_codes + pick * inter,
                lay.rh_scales + pick * inter // 32, k.lane)


def _s17_setup(k: Frame) -> Frame:
    """S17's frame: the experts' w2 and its scales."""
    k = _stage_frame(k)
    inter = k.lay.inter
    w2 = typed_view(_weight(k, "w2", fx.Uint8), fx.Uint8, expert_weight_bytes(EXPERTS * H, inter), 16)
    w2_s = typed_view(_weight(k, "w2_s", fx.Uint8), fx.Uint8, expert_scale_bytes(EXPERTS * H, inter))
    return k.but(w2=w2, w2_s=w2_s)


@dsl
def _s17_routed_down(k, task, _row):
    """S17 task = (union slot, 8 output tiles), a wave a tile: each pick's down output times its
    routing weight; a slot past the step's union does nothing."""
    lay, rows, inter, i32 = k.lay, k.lay.rows, k.lay.inter, k.i32
    per_slot = H // TILE_N // DOWN_TILES
    slot = task // per_slot
    if slot < load_scalar(i32, lay.union_size, fx.Int32):
        expert = load_scalar(i32, lay.union + slot, fx.Int32)
        tile = task % per_slot * DOWN_TILES + k.wave
        acts = PickRows(k.u8x16, k.u8, i32, lay.rh_codes, lay.rh_scales, lay.pick_of + slot * rows, rows, inter)
        accs = fp4_steps(k.w2, k.w2_s, expert, tile, H, inter, acts,
                         [(s, None) for s in range_constexpr(inter // 128)], k.lane, k.row_tiles)
        store_down(accs, acts, k.f32, lay.route_weights, lay.routed_y, tile, k.m, k.lane)


def _moe_half(k):
    """The peer half's MoE regions, in 8-byte pairs: after part one's (moe_layout.moe_at)."""
    return k.half_at + k.lay.moe_at // PAIR_BYTES


def _s18_push(k, task, _row):
    """S18 task: the rank's MoE partial of one 16-column tile, pushed (allreduce.moe_push)."""
    moe_push(k.lay, task, k.f32, k.i32, k.lds_peers, k.Mailbox, _moe_half(k), k.rank, k.tag, k.m, k.tid)


def _s19_setup(k: Frame) -> Frame:
    """S19's frame: the layer's `out`."""
    k = _stage_frame(k)
    return k.but(out=typed_view(_state(k, "out", fx.BFloat16), fx.BFloat16, k.lay.rows * H))


@dsl
def _s19_reduce(k, task, _row):
    """S19 task = (row group, column chunk): each row's MoE all-reduce into `out` (a row past m
    only pushes)."""
    lay, tid, rows = k.lay, k.tid, k.lay.rows
    group, chunk = lay.s7_task(task)
    first = group * SEAM_GROUP
    for row in range(first, fx.min(first + SEAM_GROUP, rows)):
        live = row < k.m
        reduce_row(lay, chunk, row, live, k.Mailbox, k.lds_peers, _moe_half(k), k.rank, k.tag, k.peer_wait_us, k.y,
                   tid)
        if live & (tid < SEAM_CHUNK):
            store_scalar(k.out, row * H + chunk * SEAM_CHUNK + tid, fx.memref_load(k.y, tid).to(fx.BFloat16),
                         fx.BFloat16)
        gpu.barrier()  # y is read before the next row's reduce writes it


STAGE_WORK = {
    1: StageWork(_s1_key_table, _stage_frame), 2: StageWork(_s2_attention, _stage_frame),
    3: StageWork(_s3_merge, _stage_frame), 4: StageWork(_s4_woa, _s4_setup), 5: StageWork(_s5_z, _stage_frame),
    6: StageWork(_s6_wob, _s6_setup), 7: StageWork(_s7_reduce_seam, _s7_setup),
    8: StageWork(_s8_seam_gate, _stage_frame), 9: StageWork(_s9_logits, _stage_frame),
    10: StageWork(_s10_top6, _stage_frame), 11: StageWork(_s11_union, _stage_frame),
    12: StageWork(_s12_shared_gate_up, _s12_setup), 13: StageWork(_s13_shared_act, _stage_frame),
    14: StageWork(_s14_shared_down, _s14_setup), 15: StageWork(_s15_routed_gate_up, _s15_setup),
    16: StageWork(_s16_routed_act, _stage_frame), 17: StageWork(_s17_routed_down, _s17_setup),
    18: StageWork(_s18_push, _stage_frame), 19: StageWork(_s19_reduce, _s19_setup),
}


# -- the kernel ------------------------------------------------------------------------------

ALL_STAGES = frozenset(s.number for s in SCHEDULE)
PEER_STAGES = stage_table.peer_stages(SCHEDULE)  # the stages that push to or poll the peer buffers


def make_kernel(lay: K2MoeLayout, stages: frozenset[int] = ALL_STAGES):
    """The K2 kernel with the given stages (all of them for K2 itself), each stage's loop run
    from lay.schedule (stage_loop.run_stage) with its work from STAGE_WORK; a subset is a
    standalone launch of those stages that reads its inputs from the buffers as the caller
    prepared them (k1/kernel.make_kernel), for the per-stage tests on a GPU."""
    half_words = lay.half_bytes // PAIR_BYTES

    def k2_kernel(Positions: fx.Tensor, SlotMapping: fx.Tensor, SwaIndices: fx.Tensor, SwaLens: fx.Tensor,
                  TopK: fx.Tensor, TokenReq: fx.Tensor, BlockTable: fx.Tensor, SwaCache: fx.Tensor,
                  CompCache: fx.Tensor, Weights: fx.Tensor, State: fx.Tensor,
                  Sync: fx.Tensor, Work: fx.Tensor, Mailbox: fx.Tensor, Peers: fx.Tensor, RouteIds: fx.Tensor,
                  m: fx.Int32, rank: fx.Int32, swa_page_stride: fx.Int32, swa_block: fx.Int32,
                  comp_page_stride: fx.Int32, comp_block: fx.Int32, bt_stride: fx.Int32, per_page: fx.Int32,
                  use_hash: fx.Int32, peer_wait_us: fx.Int32):
        k = enter(lay, Sync, m, _Shared)
        y = k.shared.y.view(fx.make_layout(LDS_Y_WORDS, 1))
        lds_peers = k.shared.peers.view(fx.make_layout(LDS_PEER_WORDS, 1))
        lds_moe = k.shared.moe.view(fx.make_layout(LDS_MOE_WORDS, 1))
        half_at = ((k.tag - 1) & 1) * half_words  # the peer half of this launch's epoch parity
        if const_expr(bool(stages & PEER_STAGES)):
            stage_peer_addresses(Peers, lds_peers, k.tid)
        k = k.but(Positions=Positions, SlotMapping=SlotMapping, SwaIndices=SwaIndices, SwaLens=SwaLens, TopK=TopK,
                  TokenReq=TokenReq, BlockTable=BlockTable, SwaCache=SwaCache, CompCache=CompCache, Weights=Weights,
                  State=State, Work=Work, Mailbox=Mailbox, RouteIds=RouteIds, rank=rank,
                  swa_page_stride=swa_page_stride, swa_block=swa_block, comp_page_stride=comp_page_stride,
                  comp_block=comp_block, bt_stride=bt_stride, per_page=per_page, use_hash=use_hash,
                  peer_wait_us=peer_wait_us, y=y, lds_peers=lds_peers, lds_moe=lds_moe, half_at=half_at,
                  row_tiles=lay.row_tiles)

        last = k
        for stage in lay.schedule:
            if const_expr(stage.number in stages):
                last = run_stage(k, stage, stages, STAGE_WORK[stage.number])

        leave(Sync, k.tag, CTAS, last.tid)  # the last stage's own tid: the kernel's is dead after its first stage

    return k2_kernel


def build(spec: Spec, stages: frozenset[int] = ALL_STAGES, schedule: tuple[stage_table.Stage, ...] = SCHEDULE) -> Build:
    """K2 holding `stages`, run as `schedule` says (SCHEDULE; the tests pass a wrong one to see
    the kernel follow it)."""
    lay = replace(K2MoeLayout.of(spec), schedule=schedule)
    return template_build(K2Template(), spec, make_kernel(lay, frozenset(stages)))
