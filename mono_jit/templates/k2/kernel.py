"""FlyDSL source of K2 part one (contract in the package docstring, decomposition in layout.py).

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


import operator
from dataclasses import replace

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl.expr import const_expr, gpu, range_constexpr

from ... import deepseek_v4
from ...deepseek_v4 import HEAD_DIM, MIXES, NOPE, STREAMS
from ...spec import Spec
from ..addressing import kv_offsets, mx_code_offset, mx_scale_offset, split_steps
from .. import schedule as stage_table
from .._dsl import (butterfly, dsl, flat_view, fresh, fresh_pointer, fresh_scalar, load, load_global, load_scalar,
                    pointer_code, pointer_load, store, store_scalar, table_entry, table_pointer, typed_view,
                    word_pointer)
from .._gemv import Fp8Weight, Mxfp8Rows, gemv_reduce, gemv_steps
from .._numerics import LOG2E, VEC, bf16_pair_f32, bf16_round, e8m0_scale, fp8x4_to_f32, load8_f32, mx_store, rope8
from .._seam import fold_row, mix_weights, seam_row
from ..base import Build, in_order
from ..geometry import (CTAS, KV_RECORD, LDS_ACC_WORDS, LDS_GATE_WORDS, LDS_RED_WORDS, PAIR_BYTES, PARTIALS,
                        PEERS, SEAM_CHUNK, SEAM_CHUNKS, SEAM_GROUP, THREADS, TILE_N, WAVE, WAVES)
from ..keytable.kernel import key_table_row
from ..router.kernel import select_top6
from ..sync_device import arrive, leave, publish, step_tag, wait
from . import K2Template, addressing as attention_addressing
from .moe_addressing import expert_scale_bytes, expert_weight_bytes, w13_tile
from .moe_kernel import PickRows, act_row, fp4_steps, logits_task, reduce_to_picks, store_down, union_task
from .allreduce import moe_push, reduce_row, stage_peer_addresses, wob_push
from .layout import (HEAD_TILE, HEADS_PER_GROUP, LDS_MOE_WORDS, LDS_PEER_WORDS, LDS_Y_WORDS, PIN_LDS_BYTES,
                     STATE_TABLE, WEIGHT_TABLE)
from .moe_layout import SCHEDULE, DOWN_TILES, EXPERTS, SHARED_K_PARTS, TOPK, K2MoeLayout
from .reference import SCALE

H = deepseek_v4.HIDDEN
KEY_STEP = 4  # keys whose loads a S2 lane has in flight together
# S2: 16 dims a lane; 28 lanes of a head read e4m3
SLICE, NOPE_SLICES = attention_addressing.SLICE, attention_addressing.NOPE_SLICES
ML_STRIDE = 2 * HEAD_TILE  # K2Layout.attn_ml_at: words from one S2 task's (max, sum) to the next
ACC_STRIDE = HEAD_TILE * HEAD_DIM  # K2Layout.attn_acc_at: from one S2 task's accumulators to the next


@fx.struct
class _Shared:
    red: fx.Array[fx.Float32, LDS_RED_WORDS, 16]  # per-wave partials of block reductions
    gate: fx.Array[fx.Float32, LDS_GATE_WORDS, 16]  # the seam's 25 sums, then pre
    acc: fx.Array[fx.Float32, LDS_ACC_WORDS, 16]  # GEMV split-K partials
    y: fx.Array[fx.Float32, LDS_Y_WORDS, 16]  # S7: the reduced row's 128 columns
    peers: fx.Array[fx.Int32, LDS_PEER_WORDS, 16]  # every rank's peer-buffer address (low, high words)
    moe: fx.Array[fx.Int32, LDS_MOE_WORDS, 16]  # S11: the union's slots, then the waves' counts


# -- S2: the sparse MQA over fp8_ds_mla records -------------------------------------------------

def _key_slice(cache, slot, page_stride, block, s):
    """Lane slice `s` (16 dims) of the record at `slot` as 16 f32: e4m3 x 2^(code - 127) for
    s < 28 (one UE8M0 code per 64 dims), the bf16 RoPE dims for s >= 28 (reference_math's
    kv_dequantize). Every byte read through a 64-bit global address from the cache's base
    pointer `cache`, the page offset in i64 (`page_stride` is an i64): a cache may pass the
    2^31 bytes a buffer resource's offsets reach (vLLM 0.33's in-tree mono reads its records
    through 64-bit addresses for the same reason: attention/back.py key_rec, attention/device.py
    gload)."""
    data, scales = kv_offsets(slot, block, page_stride)
    rope_lane = s >= NOPE_SLICES
    words = word_pointer(cache + attention_addressing.record_piece(data, s))
    first = pointer_load(words, 0, 4)
    second = pointer_load(words, 4, 4)
    code = pointer_code(cache, attention_addressing.record_code(scales, s))
    scale = e8m0_scale(code)
    nope = []
    for w in range_constexpr(4):
        nope += fp8x4_to_f32(first[w])
    rope = []
    for w in range_constexpr(4):
        rope += list(bf16_pair_f32(first[w]))
    for w in range_constexpr(4):
        rope += list(bf16_pair_f32(second[w]))
    return [rope_lane.select(rope[i], nope[i] * scale) for i in range_constexpr(SLICE)]


def _finite(value):
    """-inf (a max over nothing) as 0, so 2^(x - max) is 0 rather than NaN."""
    return (value == float("-inf")).select(0.0, value)


@dsl
def _attend_keys(cache, keys_i32, table_at, page_stride, block, begin, end, q, m_run, l_run, acc, s):
    """Keys begin .. end - 1 of a row's table (slots at keys_i32[table_at + j]) from one cache
    (its base pointer), into the running base-2 (max, sum, acc) of this lane's head."""
    for j0 in range(begin, end, KEY_STEP):
        scores, values = [], []
        for u in range_constexpr(KEY_STEP):
            j = j0 + u
            live = j < end
            slot = load_scalar(keys_i32, table_at + fx.min(j, end - 1), fx.Int32)
            k = _key_slice(cache, slot, page_stride, block, s)
            dot = q[0] * k[0]
            for i in range_constexpr(1, SLICE):
                dot = dot + q[i] * k[i]
            dot = butterfly(dot, operator.add, range(5))  # the head's 32 lanes
            scores.append(live.select(dot, float("-inf")))
            values.append(fx.Vector.from_elements(k, fx.Float32))
        m_new = m_run
        for u in range_constexpr(KEY_STEP):
            m_new = fx.max(m_new, scores[u])
        m_use = _finite(m_new)
        alpha = (m_run - m_use).exp2()
        l_run = l_run * alpha
        acc = acc * alpha
        for u in range_constexpr(KEY_STEP):
            p = (scores[u] - m_use).exp2()
            l_run = l_run + p
            acc = acc + values[u] * p
        m_run = m_new
    return m_run, l_run, acc


@dsl
def _attention_task(lay, task, q_view, SwaCache, CompCache, i32, f32x4, f32, swa_page_stride, swa_block,
                    comp_page_stride, comp_block, tid):
    """S2 task `task` = (row, head tile, key chunk): the chunk's state per head to the scratch."""
    row, tile, chunk = lay.s2_task(task)
    h, s = attention_addressing.s2_lane(tid)
    head = fx.min(tile * HEAD_TILE + h, lay.heads - 1)
    q_at = attention_addressing.q_chunk(lay, row, head, s)
    q = []
    for half in range_constexpr(2):
        q_part = load(q_view, q_at + half, fx.BFloat16, VEC).to(fx.Float32)
        q += [q_part[e] * (SCALE * LOG2E) for e in range_constexpr(VEC)]
    count = load_scalar(i32, lay.key_counts + 2 * row, fx.Int32)
    swa = load_scalar(i32, lay.key_counts + 2 * row + 1, fx.Int32)
    begin = chunk * lay.chunk
    end = fx.min(begin + lay.chunk, count)
    table_at = lay.key_slots + row * lay.keys
    m_run, l_run = fx.Float32(float("-inf")), fx.Float32(0.0)
    acc = fx.Vector.filled(SLICE, 0.0, fx.Float32)
    m_run, l_run, acc = _attend_keys(fx.get_iter(SwaCache), i32, table_at, swa_page_stride.to(fx.Int64), swa_block,
                                     begin, fx.min(end, swa), q, m_run, l_run, acc, s)
    m_run, l_run, acc = _attend_keys(fx.get_iter(CompCache), i32, table_at, comp_page_stride.to(fx.Int64),
                                     comp_block, fx.max(begin, swa), end, q, m_run, l_run, acc, s)
    ml_at, acc_at = lay.attn_ml_at(task, 0, h), lay.attn_acc_at(task, h, s * SLICE)
    if tile * HEAD_TILE + h < lay.heads:
        if s == 0:
            store_scalar(f32, ml_at, m_run, fx.Float32)
            store_scalar(f32, ml_at + HEAD_TILE, l_run, fx.Float32)
        for v in range_constexpr(SLICE // 4):
            store(f32x4, acc_at // 4 + v, fx.Vector.from_elements([acc[4 * v + e] for e in range_constexpr(4)],
                                                                  fx.Float32), fx.Float32, 4)


@dsl
def _merge_task(lay, task, attn_sink, rope, Positions, f32, f32x4, u8x8, u8, lane):
    """S3 task `task` = (row, head), one wave: the chunks and the sink merged (reference.merge),
    o in bf16, the inverse RoPE, MXFP8 per 32 into wo_a's operand rows."""
    row, head = lay.s3_task(task)
    h = head % HEAD_TILE
    first = (row * lay.head_tiles + head // HEAD_TILE) * lay.chunks
    sink2 = pointer_load(attn_sink, head) * LOG2E
    ml_at = lay.attn_ml_at(first, 0, h)  # chunk c's max at ml_at + c ML_STRIDE, its sum HEAD_TILE on
    acc_at = lay.attn_acc_at(first, h, lane * VEC)  # its 8 dims at acc_at + c ACC_STRIDE
    top = sink2
    for c in range(0, lay.chunks):
        top = fx.max(top, load_scalar(f32, ml_at + c * ML_STRIDE, fx.Float32))
    top = _finite(top)
    denominator = (sink2 - top).exp2()
    acc = fx.Vector.filled(VEC, 0.0, fx.Float32)
    for c in range(0, lay.chunks):
        weight = (load_scalar(f32, ml_at + c * ML_STRIDE, fx.Float32) - top).exp2()
        denominator = denominator + load_scalar(f32, ml_at + c * ML_STRIDE + HEAD_TILE, fx.Float32) * weight
        acc = acc + fx.Vector.from_elements(load8_f32(f32x4, acc_at + c * ACC_STRIDE), fx.Float32) * weight
    live = denominator > 0.0
    inverse = 1.0 / live.select(denominator, 1.0)
    o = [live.select(bf16_round(acc[e] * inverse), 0.0) for e in range_constexpr(VEC)]
    nope_lanes = NOPE // VEC
    position = load_global(Positions, row).to(fx.Int32)
    turned = rope8(o, rope, position, fx.max(lane - nope_lanes, 0) * (VEC // 2), inverse=True)
    o = [(lane >= nope_lanes).select(turned[e], o[e]) for e in range_constexpr(VEC)]
    mx_store(o, u8x8, u8, *attention_addressing.xo_row(lay, row, head), lane, lane < WAVE)


@dsl
def _z_quant_row(lay, row, f32x4, u8x8, u8, tid):
    """S5 row `row`: wo_a's two K halves added, bf16, MXFP8 per 32 into wo_b's operand rows."""
    chunks = lay.o_width // VEC
    for p in range_constexpr((chunks + THREADS - 1) // THREADS):
        chunk = tid + p * THREADS
        valid = chunk < chunks
        at = valid.select(chunk, 0) * VEC
        first = load8_f32(f32x4, lay.woa_raw + row * lay.o_width + at)
        second = load8_f32(f32x4, lay.woa_raw + (lay.rows + row) * lay.o_width + at)
        z = [bf16_round(first[e] + second[e]) for e in range_constexpr(VEC)]
        mx_store(z, u8x8, u8, *attention_addressing.z_row(lay, row), valid.select(chunk, 0), valid)


@dsl
def _top6_row(f32, i32, bias, route_ids, logits_at, ids_at, weights_at, row, lane, use_hash):
    """S10, wave 0: the row's six experts and weights (router/kernel.select_top6) to the scratch."""
    expert, weight, active = select_top6(lambda e: load_scalar(f32, logits_at + row * EXPERTS + e, fx.Float32), bias,
                                         route_ids, row, lane, use_hash)
    if active:
        store_scalar(i32, ids_at + row * TOPK + lane, expert, fx.Int32)
        store_scalar(f32, weights_at + row * TOPK + lane, weight, fx.Float32)


# -- the kernel ------------------------------------------------------------------------------

def _entry(table, names: tuple[str, ...], name: str, dtype, like):
    """Entry `name` of an address table whose order is `names`, as a pointer to `dtype` (from
    `like`'s f32 pointer type: its 4-byte alignment serves f32, bf16 and byte views)."""
    return fx.recast_iter(dtype, table_pointer(table, names.index(name), like))


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


ALL_STAGES = frozenset(s.number for s in SCHEDULE)
PEER_STAGES = stage_table.peer_stages(SCHEDULE)  # the stages that push to or poll the peer buffers


def make_kernel(lay: K2MoeLayout, stages: frozenset[int] = ALL_STAGES):
    """The K2 kernel with the given stages (all of them for K2 itself), each stage's tasks,
    waits and flags as lay.schedule states them; a subset is a standalone launch of those stages
    that reads its inputs from the buffers as the caller prepared them (k1/kernel.make_kernel),
    for the per-stage tests on a GPU."""
    rows, row_tiles, csa = lay.rows, lay.seam.row_tiles, lay.ratio == deepseek_v4.CSA_RATIO
    half_words = lay.half_bytes // PAIR_BYTES

    def await_producers(stage: int, task, m, sync, tag, tid, i32) -> None:
        """Stage `stage`'s waits for `task`, as lay.schedule states them, those whose producer
        this build holds (a stage subset reads the rest as the caller prepared it)."""
        for w in stage_table.stage(lay.schedule, stage).waits_kept(stages):
            first, count, *stride = stage_table.awaited(lay, w, task, m, _Scratch(lay, i32))
            wait(sync, first, count, tag, tid, *stride)

    @flyc.kernel
    def k2_kernel(Positions: fx.Tensor, SlotMapping: fx.Tensor, SwaIndices: fx.Tensor, SwaLens: fx.Tensor,
                  TopK: fx.Tensor, TokenReq: fx.Tensor, BlockTable: fx.Tensor, SwaCache: fx.Tensor,
                  CompCache: fx.Tensor, Weights: fx.Tensor, State: fx.Tensor,
                  Sync: fx.Tensor, Work: fx.Tensor, Mailbox: fx.Tensor, Peers: fx.Tensor, RouteIds: fx.Tensor,
                  m: fx.Int32, rank: fx.Int32, swa_page_stride: fx.Int32, swa_block: fx.Int32,
                  comp_page_stride: fx.Int32, comp_block: fx.Int32, bt_stride: fx.Int32, per_page: fx.Int32,
                  use_hash: fx.Int32, peer_wait_us: fx.Int32):
        m = fx.min(fx.max(m, 0), rows)  # a bad m must not write past the bucket or wait on other flags
        tid = fx.thread_idx.x
        lane = tid % WAVE
        wave = tid // WAVE
        cta = fx.block_idx.x
        shared = fx.SharedAllocator().allocate(_Shared).peek()
        red = shared.red.view(fx.make_layout(LDS_RED_WORDS, 1))
        gate = shared.gate.view(fx.make_layout(LDS_GATE_WORDS, 1))
        lds_acc = shared.acc.view(fx.make_layout(LDS_ACC_WORDS, 1))
        y = shared.y.view(fx.make_layout(LDS_Y_WORDS, 1))
        lds_peers = shared.peers.view(fx.make_layout(LDS_PEER_WORDS, 1))
        lds_moe = shared.moe.view(fx.make_layout(LDS_MOE_WORDS, 1))
        tag = step_tag(Sync)
        half_at = ((tag - 1) & 1) * half_words  # the peer half of this launch's epoch parity
        arrive(Sync, tid)
        if const_expr(bool(stages & PEER_STAGES)):
            stage_peer_addresses(Peers, lds_peers, tid)

        def work_views():
            """The work buffer's views (f32, f32x4, i32, u8, u8x8, u8x16), each bounded by its
            region's size, built for the stage that uses them (_dsl.fresh_pointer)."""
            work = fresh_pointer(fx.get_iter(Work))
            u8_at = work + lay.u8_at // 4
            return (typed_view(work, fx.Float32, lay.f32_words), typed_view(work, fx.Float32, lay.f32_words, 4),
                    typed_view(work + lay.i32_at // 4, fx.Int32, lay.i32_words),
                    typed_view(u8_at, fx.Uint8, lay.bytes), typed_view(u8_at, fx.Uint8, lay.bytes, VEC),
                    typed_view(u8_at, fx.Uint8, lay.bytes, 16))

        def lanes():
            """(tid, lane, wave, cta) recomputed for a stage (_dsl.fresh): no lane mask or loop guard
            lives across stages."""
            fresh_tid = fresh(fx.thread_idx.x)
            return fresh_tid, fresh_tid % WAVE, wave, fresh_scalar(fx.block_idx.x)

        def stage():
            """A stage's own lanes, loop guard and work views (lanes, work_views)."""
            return (*lanes(), work_views())

        def weight(name, dtype):
            """The layer's weight `name` (layout.WEIGHT_TABLE) as a pointer to `dtype`."""
            return _entry(Weights, WEIGHT_TABLE, name, dtype, Work)

        def state(name, dtype):
            """The runner's buffer `name` (layout.STATE_TABLE) as a pointer to `dtype`."""
            return _entry(State, STATE_TABLE, name, dtype, Work)

        def layer_int(name):
            """An integer entry of the layer's table (a weight's stride or layout flag)."""
            return table_entry(Weights, WEIGHT_TABLE.index(name)).to(fx.Int32)

        # ---- S1: key table -------------------------------------------------------------------
        if const_expr(1 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for row in range(cta, rows, CTAS):
                if wave == 0:
                    count, swa = fx.Int32(0), fx.Int32(0)
                    if row < m:  # slot_mapping holds m rows: read no further
                        if load_global(SlotMapping, row) >= 0:
                            count, swa = key_table_row(SwaIndices, SwaLens, TokenReq, TopK, BlockTable, i32, row,
                                                       lay.key_slots + row * lay.keys, lane, lay.topk_width, csa,
                                                       bt_stride, per_page)
                    if lane == 0:
                        store_scalar(i32, lay.key_counts + 2 * row, count, fx.Int32)
                        store_scalar(i32, lay.key_counts + 2 * row + 1, swa, fx.Int32)
                publish(Sync, lay.f_keys + row, tag, tid)

        # ---- S2: attention over a key chunk ---------------------------------------------------
        if const_expr(2 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for task in range(cta, lay.s2_tasks, CTAS):
                if lay.row_of(2, task) < m:
                    await_producers(2, task, m, Sync, tag, tid, i32)
                    q = typed_view(state("q", fx.BFloat16), fx.BFloat16, rows * lay.heads * HEAD_DIM, VEC)
                    _attention_task(lay, task, q, SwaCache, CompCache, i32, f32x4, f32, swa_page_stride,
                                    swa_block, comp_page_stride, comp_block, tid)
                publish(Sync, lay.f_attn + task, tag, tid)

        # ---- S3: merge, inverse RoPE, MXFP8 ---------------------------------------------------
        if const_expr(3 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for task in range(cta, lay.s3_tasks, CTAS):
                if lay.row_of(3, task) < m:
                    await_producers(3, task, m, Sync, tag, tid, i32)
                    if wave == 0:
                        _merge_task(lay, task, weight("attn_sink", fx.Float32), weight("rope", fx.Float32),
                                    Positions, f32, f32x4, u8x8, u8, lane)
                publish(Sync, lay.f_merge + task, tag, tid)

        # ---- S4: wo_a -------------------------------------------------------------------------
        if const_expr(4 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            woa_stride = layer_int("woa_stride")
            w_oa = Fp8Weight(typed_view(weight("w_oa", fx.Uint8), fx.Uint8, lay.o_width * woa_stride, 16),
                             weight("s_oa", fx.Uint8), HEADS_PER_GROUP * HEAD_DIM, woa_stride,
                             layer_int("woa_shuffled"))
            for task in range(cta, lay.s4_tasks, CTAS):
                await_producers(4, task, m, Sync, tag, tid, i32)
                n0, part, group = attention_addressing.woa_task(lay, task)
                acts = Mxfp8Rows(u8x16, u8, *attention_addressing.woa_operand(lay, group))
                accs = gemv_steps(w_oa, acts, n0, attention_addressing.woa_steps(part, wave), lane, row_tiles)
                gemv_reduce(accs, lds_acc, tid, wave, lane, WAVES, row_tiles, f32,
                            lay.woa_raw + part * rows * lay.o_width, lay.o_width, n0, m)
                publish(Sync, lay.f_woa + task, tag, tid)

        # ---- S5: z = bf16(wo_a), MXFP8 --------------------------------------------------------
        if const_expr(5 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for row in range(cta, rows, CTAS):
                if row < m:
                    await_producers(5, row, m, Sync, tag, tid, i32)
                    _z_quant_row(lay, row, f32x4, u8x8, u8, tid)
                publish(Sync, lay.f_z + row, tag, tid)

        # ---- S6: wo_b, pushed to the peers ----------------------------------------------------
        if const_expr(6 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            wob_stride = layer_int("wob_stride")
            w_ob = Fp8Weight(typed_view(weight("w_ob", fx.Uint8), fx.Uint8, H * wob_stride, 16),
                             weight("s_ob", fx.Uint8), lay.o_width, wob_stride, layer_int("wob_shuffled"))
            z_mx = Mxfp8Rows(u8x16, u8, lay.z_codes, lay.z_scales, lay.o_width)
            for task in range(cta, lay.s6_tasks, CTAS):
                await_producers(6, task, m, Sync, tag, tid, i32)
                accs = gemv_steps(w_ob, z_mx, task * TILE_N, attention_addressing.wob_steps(lay, wave), lane, row_tiles)
                wob_push(lay, task, accs, lds_acc, lds_peers, Mailbox, half_at, rank, tag, m, tid, wave, lane)

        # ---- S7: all-reduce and the FFN seam's fold -------------------------------------------
        if const_expr(7 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            stream = tid // SEAM_CHUNK
            for task in range(cta, lay.s7_tasks, CTAS):
                group, chunk = lay.s7_task(task)
                col = chunk * SEAM_CHUNK + tid % SEAM_CHUNK
                fn = mix_weights(typed_view(weight("hc_fn", fx.Float32), fx.Float32, MIXES * STREAMS * H), stream,
                                 col)
                residual = typed_view(state("residual", fx.BFloat16), fx.BFloat16, rows * STREAMS * H)
                r_out = typed_view(state("r_out", fx.BFloat16), fx.BFloat16, rows * STREAMS * H)
                post_in, comb_in = state("post_in", fx.Float32), state("comb_in", fx.Float32)
                x_at = lambda row: fx.memref_load(y, tid % SEAM_CHUNK)  # noqa: E731
                first = group * SEAM_GROUP
                for row in range(first, fx.min(first + SEAM_GROUP, rows)):
                    live = row < m
                    reduce_row(lay, chunk, row, live, Mailbox, lds_peers, half_at, rank, tag, peer_wait_us, y, tid)
                    if live:
                        fold_row(residual, post_in, comb_in, r_out, x_at, fx.Int32(1), fn, red, f32,
                                 lay.partials + (row * SEAM_CHUNKS + chunk) * PARTIALS, row, col, stream, tid,
                                 wave, lane)
                publish(Sync, lay.f_seam + task, tag, tid)

        # ---- S8: the FFN seam's gate, collapse, ffn_norm, MXFP8 -------------------------------
        if const_expr(8 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for row in range(cta, rows, CTAS):
                if row < m:
                    await_producers(8, row, m, Sync, tag, tid, i32)
                    seam_row(f32, lay.partials + row * SEAM_CHUNKS * PARTIALS, gate, red,
                             weight("hc_base", fx.Float32), weight("hc_scale", fx.Float32),
                             state("post_out", fx.Float32), state("comb_out", fx.Float32),
                             typed_view(state("r_out", fx.BFloat16), fx.BFloat16, rows * STREAMS * H, VEC),
                             weight("ffn_norm", fx.BFloat16),
                             typed_view(state("x_norm", fx.BFloat16), fx.BFloat16, rows * H, VEC), u8x8, u8,
                             mx_code_offset(lay.ffn_codes, row, 0, H), mx_scale_offset(lay.ffn_scales, row, 0, H),
                             row, tid, wave, lane, state("pre_out", fx.Float32))
                publish(Sync, lay.f_norm + row, tag, tid)

        # ==== part two: the MoE (moe_layout.py, moe_kernel.py) =====================================
        moe_words = lay.moe_at // PAIR_BYTES  # the MoE's regions in a half, after part one's
        inter = lay.inter


        # ---- S9: router logits ---------------------------------------------------------------
        if const_expr(9 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for task in range(cta, lay.s9_tasks, CTAS):
                await_producers(9, task, m, Sync, tag, tid, i32)
                logits_task(typed_view(weight("gate", fx.BFloat16), fx.BFloat16, EXPERTS * H, VEC),
                               typed_view(state("x_norm", fx.BFloat16), fx.BFloat16, rows * H, VEC), f32,
                               lay.logits, task, m, wave, lane)
                publish(Sync, lay.f_logits + task, tag, tid)

        # ---- S10: top-6 a row --------------------------------------------------------------------
        if const_expr(10 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for row in range(cta, lay.tasks(10), CTAS):
                if lay.row_of(10, row) < m:
                    await_producers(10, row, m, Sync, tag, tid, i32)
                    if wave == 0:
                        # a hash layer has no bias: its view holds 0 bytes, so every read is 0 and
                        # touches no memory (the table entry may be 0)
                        bias = typed_view(weight("bias", fx.Float32), fx.Float32, (use_hash == 0).select(EXPERTS, 0))
                        _top6_row(f32, i32, bias,
                                  flat_view(RouteIds), lay.logits, lay.ids, lay.route_weights, row, lane, use_hash)
                publish(Sync, lay.f_top + row, tag, tid)

        # ---- S11: the union of chosen experts ----------------------------------------------------
        if const_expr(11 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for task in range(cta, lay.tasks(11), CTAS):
                await_producers(11, task, m, Sync, tag, tid, i32)
                union_task(i32, lds_moe, lay.ids, lay.union, lay.union_size, lay.pick_of, lay.slot_of, rows, m,
                              tid)
                publish(Sync, lay.f_union, tag, tid)

        # ---- S12: shared gate / up ---------------------------------------------------------------
        if const_expr(12 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            w_sgu = Fp8Weight(typed_view(weight("sgu", fx.Uint8), fx.Uint8, 2 * inter * layer_int("sgu_stride"), 16),
                              weight("sgu_s", fx.Uint8), H, layer_int("sgu_stride"), layer_int("sgu_shuffled"))
            x_mx = Mxfp8Rows(u8x16, u8, lay.ffn_codes, lay.ffn_scales, H)
            quarter = H // 128 // SHARED_K_PARTS
            for task in range(cta, lay.s12_tasks, CTAS):
                await_producers(12, task, m, Sync, tag, tid, i32)
                tile, part = task // SHARED_K_PARTS, task % SHARED_K_PARTS
                accs = gemv_steps(w_sgu, x_mx, tile * TILE_N, split_steps(part * quarter, quarter, wave), lane,
                                  row_tiles)
                gemv_reduce(accs, lds_acc, tid, wave, lane, WAVES, row_tiles, f32,
                            lay.sgu_raw + part * rows * 2 * inter, 2 * inter, tile * TILE_N, m)
                publish(Sync, lay.f_sgu + task, tag, tid)

        # ---- S13: shared SwiGLU, MXFP8 -------------------------------------------------------------
        if const_expr(13 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for row in range(cta, lay.tasks(13), CTAS):
                if lay.row_of(13, row) < m:
                    await_producers(13, row, m, Sync, tag, tid, i32)
                    if wave == 0:
                        first = lay.sgu_raw + row * 2 * inter
                        act_row(f32x4, u8x8, u8, first, first + inter, SHARED_K_PARTS, rows * 2 * inter, True,
                                   inter, lay.sh_codes + row * inter, lay.sh_scales + row * inter // 32, lane)
                publish(Sync, lay.f_sact + row, tag, tid)

        # ---- S14: shared down ----------------------------------------------------------------------
        if const_expr(14 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            w_sw2 = Fp8Weight(typed_view(weight("sw2", fx.Uint8), fx.Uint8, H * layer_int("sw2_stride"), 16),
                              weight("sw2_s", fx.Uint8), inter, layer_int("sw2_stride"), layer_int("sw2_shuffled"))
            h_mx = Mxfp8Rows(u8x16, u8, lay.sh_codes, lay.sh_scales, inter)
            for task in range(cta, lay.s14_tasks, CTAS):
                await_producers(14, task, m, Sync, tag, tid, i32)
                accs = gemv_steps(w_sw2, h_mx, task * TILE_N, split_steps(0, inter // 128, wave), lane,
                                  row_tiles)
                gemv_reduce(accs, lds_acc, tid, wave, lane, WAVES, row_tiles, f32, lay.shared_raw, H,
                            task * TILE_N, m)
                publish(Sync, lay.f_sdown + task, tag, tid)

        # ---- S15: routed gate / up over the union ----------------------------------------------------
        if const_expr(15 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            w13 = typed_view(weight("w13", fx.Uint8), fx.Uint8, expert_weight_bytes(EXPERTS * 2 * inter, H), 16)
            w13_s = typed_view(weight("w13_s", fx.Uint8), fx.Uint8, expert_scale_bytes(EXPERTS * 2 * inter, H))
            x_mx = Mxfp8Rows(u8x16, u8, lay.ffn_codes, lay.ffn_scales, H)
            blocks = inter // TILE_N
            for task in range(cta, lay.s15_tasks, CTAS):
                await_producers(15, task, m, Sync, tag, tid, i32)
                slot, block = task // blocks, task % blocks
                if slot < load_scalar(i32, lay.union_size, fx.Int32):
                    expert = load_scalar(i32, lay.union + slot, fx.Int32)
                    for up in range_constexpr(2):
                        accs = fp4_steps(w13, w13_s, expert, w13_tile(block, up), 2 * inter, H, x_mx,
                                            split_steps(0, H // 128, wave), lane, row_tiles)
                        reduce_to_picks(accs, lds_acc, i32, f32, lay.pick_of + slot * rows, lay.gu, 2 * inter,
                                           up * inter + block * TILE_N, m, rows, tid, wave, lane)
                publish(Sync, lay.f_rgu + task, tag, tid)

        # ---- S16: routed SwiGLU a pick, MXFP8 (waits on the union, then on its expert's slot's S15
        # tasks: the schedule reads the slot from the scratch) ---------------------------------------
        if const_expr(16 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for pick in range(cta, lay.picks, CTAS):
                if lay.row_of(16, pick) < m:
                    await_producers(16, pick, m, Sync, tag, tid, i32)
                    if wave == 0:
                        first = lay.gu + pick * 2 * inter
                        act_row(f32x4, u8x8, u8, first, first + inter, 1, 0, False, inter,
                                   lay.rh_codes + pick * inter, lay.rh_scales + pick * inter // 32, lane)
                publish(Sync, lay.f_ract + pick, tag, tid)

        # ---- S17: routed down over the union, a wave a tile ------------------------------------------
        if const_expr(17 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            w2 = typed_view(weight("w2", fx.Uint8), fx.Uint8, expert_weight_bytes(EXPERTS * H, inter), 16)
            w2_s = typed_view(weight("w2_s", fx.Uint8), fx.Uint8, expert_scale_bytes(EXPERTS * H, inter))
            per_slot = H // TILE_N // DOWN_TILES
            for task in range(cta, lay.s17_tasks, CTAS):
                await_producers(17, task, m, Sync, tag, tid, i32)
                slot = task // per_slot
                if slot < load_scalar(i32, lay.union_size, fx.Int32):
                    expert = load_scalar(i32, lay.union + slot, fx.Int32)
                    tile = task % per_slot * DOWN_TILES + wave
                    acts = PickRows(u8x16, u8, i32, lay.rh_codes, lay.rh_scales, lay.pick_of + slot * rows, rows,
                                       inter)
                    accs = fp4_steps(w2, w2_s, expert, tile, H, inter, acts,
                                        [(s, None) for s in range_constexpr(inter // 128)], lane, row_tiles)
                    store_down(accs, acts, f32, lay.route_weights, lay.routed_y, tile, m, lane)
                publish(Sync, lay.f_rdown + task, tag, tid)

        # ---- S18: the rank's MoE partial, pushed (waits on its shared tile, then on its tiles' S17
        # task in every union slot) -------------------------------------------------------------------
        if const_expr(18 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            for task in range(cta, lay.tasks(18), CTAS):
                await_producers(18, task, m, Sync, tag, tid, i32)
                moe_push(lay, task, f32, i32, lds_peers, Mailbox, half_at + moe_words, rank, tag, m, tid)

        # ---- S19: the MoE all-reduce into out --------------------------------------------------------
        if const_expr(19 in stages):
            tid, lane, wave, cta, (f32, f32x4, i32, u8, u8x8, u8x16) = stage()
            out = typed_view(state("out", fx.BFloat16), fx.BFloat16, rows * H)
            for task in range(cta, lay.tasks(19), CTAS):
                group, chunk = lay.s7_task(task)
                first = group * SEAM_GROUP
                for row in range(first, fx.min(first + SEAM_GROUP, rows)):
                    live = row < m
                    reduce_row(lay, chunk, row, live, Mailbox, lds_peers, half_at + moe_words, rank, tag,
                                peer_wait_us, y, tid)
                    if live & (tid < SEAM_CHUNK):
                        store_scalar(out, row * H + chunk * SEAM_CHUNK + tid, fx.memref_load(y, tid).to(fx.BFloat16),
                                     fx.BFloat16)
                    gpu.barrier()  # y is read before the next row's reduce writes it
                publish(Sync, lay.f_out + task, tag, tid)

        leave(Sync, tag, CTAS, tid)

    return k2_kernel


def build(spec: Spec, stages: frozenset[int] = ALL_STAGES, schedule: tuple[stage_table.Stage, ...] = SCHEDULE) -> Build:
    """K2 holding `stages`, run as `schedule` says (SCHEDULE; the tests pass a wrong one to see
    the kernel follow it)."""
    lay = replace(K2MoeLayout.of(spec), schedule=schedule)
    kernel = make_kernel(lay, frozenset(stages))

    @flyc.jit
    def launch_k2(Positions: fx.Tensor, SlotMapping: fx.Tensor, SwaIndices: fx.Tensor, SwaLens: fx.Tensor,
                  TopK: fx.Tensor, TokenReq: fx.Tensor, BlockTable: fx.Tensor, SwaCache: fx.Tensor,
                  CompCache: fx.Tensor, Weights: fx.Tensor, State: fx.Tensor,
                  Sync: fx.Tensor, Work: fx.Tensor, Mailbox: fx.Tensor, Peers: fx.Tensor, RouteIds: fx.Tensor,
                  m: fx.Int32, rank: fx.Int32, swa_page_stride: fx.Int32, swa_block: fx.Int32,
                  comp_page_stride: fx.Int32, comp_block: fx.Int32, bt_stride: fx.Int32, per_page: fx.Int32,
                  use_hash: fx.Int32, peer_wait_us: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        kernel(Positions, SlotMapping, SwaIndices, SwaLens, TopK, TokenReq, BlockTable, SwaCache, CompCache, Weights,
               State, Sync, Work, Mailbox, Peers, RouteIds, m, rank, swa_page_stride, swa_block, comp_page_stride,
               comp_block, bt_stride, per_page, use_hash, peer_wait_us).launch(
            grid=(CTAS, 1, 1), block=(THREADS, 1, 1), smem=PIN_LDS_BYTES, stream=stream)

    names = [argument.name for argument in K2Template().arguments(spec)]
    return Build(launch_k2, in_order("k2", names, placeholders(lay)))


def placeholders(lay: K2MoeLayout) -> dict[str, torch.Tensor | int]:
    """CPU tensors with the bucket's shapes (flat) and scalars, by argument name, for flyc.compile."""
    rows = lay.rows

    def empty(n: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(n, dtype=dtype)

    f32, u8, i32, i64 = torch.float32, torch.uint8, torch.int32, torch.int64
    block = 64
    record_page = block * KV_RECORD
    return dict(
        positions=empty(rows, i64), slot_mapping=empty(rows, i64),
        swa_indices=empty(rows * deepseek_v4.SWA_WINDOW, i32), swa_lens=empty(rows, i32),
        topk=empty(rows * lay.topk_width, i32), token_req=empty(rows, i32), block_table=empty(rows * 64, i32),
        swa_cache=empty(4 * record_page, u8), comp_cache=empty(4 * record_page, u8),
        weights=empty(len(WEIGHT_TABLE), i64), state=empty(len(STATE_TABLE), i64),
        sync=empty(lay.sync_words, i32), work=empty(lay.work_words, f32),
        mailbox=empty(lay.peer_bytes // PAIR_BYTES, i64), peers=empty(PEERS, i64), route_ids=empty(rows * TOPK, i32),
        m=rows, rank=0, swa_page_stride=record_page, swa_block=block, comp_page_stride=record_page, comp_block=block,
        bt_stride=64, per_page=block, use_hash=0, peer_wait_us=1,
    )
