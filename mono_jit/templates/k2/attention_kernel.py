"""FlyDSL device code of K2 part one's stages (the attention; decomposition in
attention_layout.py, semantics in attention_reference.py); kernel.py runs them, then part two's
(moe_kernel.py), in the same launch. How each stage runs on a CTA: kernel.py's docstring.

(No `from __future__ import annotations` here: FlyDSL's rewriter reads the functions' code.)
"""

import operator

import flydsl.expr as fx
from flydsl.expr import range_constexpr

from ...deepseek_v4 import HEAD_DIM, NOPE
from ..addressing import kv_offsets
from .._dsl import (
    butterfly, dsl, load, load_global, load_scalar, pointer_code, pointer_load, store, store_scalar, word_pointer,
)
from .._numerics import LOG2E, VEC, bf16_pair_f32, bf16_round, e8m0_scale, fp8x4_to_f32, load8_f32, mx_store, rope8
from ..geometry import THREADS, WAVE
from . import attention_addressing
from .attention_layout import HEAD_TILE
from .attention_reference import SCALE

KEY_STEP = 4  # keys whose loads a S2 lane has in flight together
# S2: 16 dims a lane; 28 lanes of a head read e4m3
SLICE, NOPE_SLICES = attention_addressing.SLICE, attention_addressing.NOPE_SLICES
ML_STRIDE = 2 * HEAD_TILE  # K2Layout.attn_ml_at: words from one S2 task's (max, sum) to the next
ACC_STRIDE = HEAD_TILE * HEAD_DIM  # K2Layout.attn_acc_at: from one S2 task's accumulators to the next


# -- S2: the sparse MQA over fp8_ds_mla records -------------------------------------------------

def key_slice(cache, slot, page_stride, block, s):
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
def attend_keys(cache, keys_i32, table_at, page_stride, block, begin, end, q, m_run, l_run, acc, s):
    """Keys begin .. end - 1 of a row's table (slots at keys_i32[table_at + j]) from one cache
    (its base pointer), into the running base-2 (max, sum, acc) of this lane's head."""
    for j0 in range(begin, end, KEY_STEP):
        scores, values = [], []
        for u in range_constexpr(KEY_STEP):
            j = j0 + u
            live = j < end
            slot = load_scalar(keys_i32, table_at + fx.min(j, end - 1), fx.Int32)
            k = key_slice(cache, slot, page_stride, block, s)
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
def attention_task(lay, task, q_view, SwaCache, CompCache, i32, f32x4, f32, swa_page_stride, swa_block,
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
    m_run, l_run, acc = attend_keys(fx.get_iter(SwaCache), i32, table_at, swa_page_stride.to(fx.Int64), swa_block,
                                     begin, fx.min(end, swa), q, m_run, l_run, acc, s)
    m_run, l_run, acc = attend_keys(fx.get_iter(CompCache), i32, table_at, comp_page_stride.to(fx.Int64),
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
def merge_task(lay, task, attn_sink, rope, Positions, f32, f32x4, u8x8, u8, lane):
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
def z_quant_row(lay, row, f32x4, u8x8, u8, tid):
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
