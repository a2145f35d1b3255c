"""FlyDSL source of the router (see the package docstring for the contract).

(No `from __future__ import annotations` here: fx.struct and @flyc.kernel read real annotations.)

Decomposition: one CTA per row, 4 waves. Each lane keeps its 14 eight-wide chunks of the row
in registers; wave w computes logits for experts w, w+4, ... (96 each) with 128-bit loads of the
gate row, a per-lane f32 dot product and a butterfly sum, and parks the logit in LDS. Wave 0 then
holds 6 experts per lane and runs six rounds of a butterfly argmax (value, then lower index);
the winner of each round is retired by giving it index 2^30 and value -inf, so a retired slot
loses even to an untaken -inf (NaN scores are mapped to -inf before selection). Lanes 0..5
compute the six weights: sqrt(softplus(logit)) of the chosen (or hashed) expert, NaN -> 0,
renormalised by their sum and scaled by 2.5. softplus uses exp2/log2 (hardware instructions,
no ocml), with log1p(t) ~ t(1 - t/2) for t < 1e-4 to keep small scores accurate.
"""


import flydsl.expr as fx
from flydsl.expr import gpu, range_constexpr
from flydsl.expr.typing import ReductionOp

from ... import deepseek_v4
from ...spec import Spec
from ..geometry import WAVE
from .._dsl import better, flat_view, load, load_scalar, store_scalar, wave_argmax, wave_sum
from ..base import Build
from ..launch import template_build
from . import BLOCK, RouterTemplate

E = deepseek_v4.ROUTED_EXPERTS
H = deepseek_v4.HIDDEN
TOPK = deepseek_v4.EXPERTS_PER_TOKEN
VEC = 8  # bf16 per 128-bit load
WAVES = BLOCK // WAVE
CHUNKS = H // (VEC * WAVE)  # 14 chunks of 8 per lane cover one row
SLOTS = E // WAVE  # experts each lane of wave 0 holds during the top-k
RETIRED = 1 << 30
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


def _score(logit):
    """sqrt(softplus(logit)), softplus = max(l, 0) + log1p(exp(-|l|))."""
    t = (fx.math.absf(logit) * (-LOG2E)).exp2()
    log1p = (t < 1.0e-4).select(t * (1.0 - 0.5 * t), fx.math.log2(t + 1.0) * LN2)
    return fx.math.sqrt(fx.max(logit, 0.0) + log1p)


@fx.struct
class _Shared:
    logits: fx.Array[fx.Float32, E, 16]


def router_kernel(X: fx.Tensor, Gate: fx.Tensor, Bias: fx.Tensor, HashIds: fx.Tensor,
                  Ids: fx.Tensor, Weights: fx.Tensor, m: fx.Int32, use_hash: fx.Int32):
    row = fx.block_idx.x
    tid = fx.thread_idx.x
    lane = tid % WAVE
    wave = tid // WAVE
    shared = fx.SharedAllocator().allocate(_Shared).peek()
    logits = shared.logits.view(fx.make_layout(E, 1))

    if row < m:
        x_view = flat_view(X, VEC)
        gate_view = flat_view(Gate, VEC)
        row_chunk = row * (H // VEC) + lane
        xs = [load(x_view, row_chunk + c * WAVE, fx.BFloat16, VEC).to(fx.Float32) for c in range_constexpr(CHUNKS)]
        for j in range(0, E // WAVES):
            expert = j * WAVES + wave
            acc = fx.Float32(0.0)
            for c in range_constexpr(CHUNKS):
                g = load(gate_view, expert * (H // VEC) + lane + c * WAVE, fx.BFloat16, VEC).to(fx.Float32)
                acc = acc + (g * xs[c]).reduce(ReductionOp.ADD)
            acc = wave_sum(acc)
            if lane == 0:
                fx.memref_store(acc, logits, expert)
    gpu.barrier()

    if (row < m) & (wave == 0):
        expert, weight, active = select_top6(lambda e: fx.memref_load(logits, e), flat_view(Bias), flat_view(HashIds),
                                             row, lane, use_hash)
        if active:
            store_scalar(flat_view(Ids), row * TOPK + lane, expert, fx.Int32)
            store_scalar(flat_view(Weights), row * TOPK + lane, weight, fx.Float32)


def select_top6(logit_of, bias_view, hash_view, row, lane, use_hash):
    """One wave: the row's experts and weights from its 384 logits (`logit_of(expert)`): top-6
    of sqrt(softplus) + bias (larger first, the lower index on ties), or the hash layer's ids
    (`use_hash`), each weight the expert's unbiased score renormalised x 2.5. Lane k < 6 gets
    the k-th (expert, weight, True). K2's part two runs this too (one implementation)."""
    neg_inf = fx.Float32(float("-inf"))
    values, indices = [], []
    for s in range_constexpr(SLOTS):
        expert = lane + s * WAVE
        biased = _score(logit_of(expert)) + load_scalar(bias_view, expert, fx.Float32)
        values.append((biased != biased).select(neg_inf, biased))
        indices.append(expert)
    chosen = []
    for _ in range_constexpr(TOPK):
        best_value, best_index = values[0], indices[0]
        for s in range_constexpr(1, SLOTS):
            take = better(values[s], indices[s], best_value, best_index)
            best_value = take.select(values[s], best_value)
            best_index = take.select(indices[s], best_index)
        best_value, best_index = wave_argmax(best_value, best_index)
        chosen.append(best_index)
        for s in range_constexpr(SLOTS):
            hit = indices[s] == best_index
            values[s] = hit.select(neg_inf, values[s])
            indices[s] = hit.select(RETIRED, indices[s])

    mine = chosen[0]
    for k in range_constexpr(1, TOPK):
        mine = (lane == k).select(chosen[k], mine)
    active = lane < TOPK
    hashed = load_scalar(hash_view, row * TOPK + active.select(lane, 0), fx.Int32)
    expert = (use_hash != 0).select(hashed, mine)
    valid = active & (expert >= 0) & (expert < E)
    raw = _score(logit_of(valid.select(expert, 0)))
    raw = (valid & (raw == raw)).select(raw, 0.0)
    weight = raw / fx.max(wave_sum(raw), 1.0e-20) * deepseek_v4.ROUTED_SCALING
    return expert, weight, active


def build(spec: Spec) -> Build:
    return template_build(RouterTemplate(), spec, router_kernel)
