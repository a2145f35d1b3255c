"""FlyDSL device code of K2 part two's stages (the MoE; decomposition in moe_layout.py, semantics
in moe_reference.py); kernel.py runs them after part one's stages in the same launch.

(No `from __future__ import annotations` here: FlyDSL's rewriter reads the functions' code.)

- S9 logits: wave w of task g scores expert 8 g + w: its bf16 gate row stays in registers (56
  VGPRs as bf16) while the wave runs over the rows' x_norm; lane 0 stores the f32 logit.
- S10 top-6: wave 0 runs the router template's selection (router/kernel.select_top6).
- S11 union: thread e < 384 flags whether any live row chose expert e; a wave prefix count
  and the waves' totals in LDS give each chosen expert its slot (ascending expert order); then
  every (slot, row) entry of `pick_of` is the row's pick of that expert or -1.
- S12 / S14: the shared expert's GEMVs on K1's scaled-MFMA GEMV (templates/_gemv.py).
- S15 / S17: the routed experts' GEMVs with the weight as an fp4 operand A (cbsz 4: one 16-byte
  piece a lane, k2/moe_addressing.py) and the MXFP8 activations as operand B in K1's lane map;
  S15 sums its 8 waves' K parts through LDS and scatters each row's result to its pick; S17
  gives each wave one output tile (K = 384, no split) and gathers its B rows by pick.
- S13 / S16: the clamped SwiGLU of a row (shared) or a pick (routed), bf16, MXFP8.
- S18: a row's top-k entries summed in order (f32, then bf16), each read from its expert's pick
  (row_pick: an expert a hash row names twice counts twice), plus the shared output (bf16),
  rounded, pushed as part one's S6 pushes into the MoE peer regions; S19 reduces as S7 into
  `out`.
"""


import flydsl.expr as fx
from flydsl.expr import gpu, range_constexpr
from flydsl.expr.typing import ReductionOp

from ... import deepseek_v4
from .._dsl import dsl, load, load_code, load_scalar, store_scalar, wave_sum
from .._gemv import FP4, mfma
from .._numerics import VEC, bf16_round, load8_f32, mx_store, sigmoid
from .. import addressing
from ..router.kernel import select_top6
from ..geometry import THREADS, TILE_N, WAVE, WAVES
from . import moe_addressing
from .moe_reference import SWIGLU_LIMIT

H = deepseek_v4.HIDDEN
E = deepseek_v4.ROUTED_EXPERTS
TOPK = deepseek_v4.EXPERTS_PER_TOKEN
ROW_CHUNKS = H // (VEC * WAVE)  # 14 eight-wide chunks a lane covers a row


# -- S9 / S10 / S11: the router and the union -------------------------------------------------------

@dsl
def logits_task(gate8, x8, f32, logits_at, task, m, wave, lane):
    """Expert 8 task + wave's f32 logit for every live row: bf16 gate . bf16 x_norm."""
    expert = task * WAVES + wave
    gate = [load(gate8, expert * (H // VEC) + lane + c * WAVE, fx.BFloat16, VEC) for c in range_constexpr(ROW_CHUNKS)]
    for row in range(0, m):
        acc = fx.Float32(0.0)
        for c in range_constexpr(ROW_CHUNKS):
            x = load(x8, row * (H // VEC) + lane + c * WAVE, fx.BFloat16, VEC).to(fx.Float32)
            acc = acc + (gate[c].to(fx.Float32) * x).reduce(ReductionOp.ADD)
        acc = wave_sum(acc)
        if lane == 0:
            store_scalar(f32, logits_at + row * E + expert, acc, fx.Float32)


def row_pick(ids, row, expert):
    """The pick S11 gives `expert` in row `row` (`ids`: the row's six ids): row x 6 + the last
    entry naming it, or -1. A hash row may name an expert twice (tid2eid is the checkpoint's);
    S15-S17 then compute it once, at this pick, and S18 reads this pick for both entries, so
    each counts, as vLLM's FusedMoE counts every top-k entry (their weights are one score over
    one sum, bit for bit equal)."""
    pick = fx.Int32(-1)
    for j in range_constexpr(TOPK):
        pick = (ids[j] == expert).select(row * TOPK + j, pick)
    return pick


@dsl
def union_task(i32, lds_moe, ids_at, union_at, size_at, pick_at, slot_of_at, rows: int, m, tid):
    """The step's union of chosen experts (slot order = expert order), its size, each expert's
    slot (-1 if not chosen: S16 waits on its expert's slot's S15 tasks) and pick_of (for the
    union's slots: the routed stages read no other).
    Slots come from a count over the 384 flags in LDS (no lane prefix and wave totals: this
    stage runs where the kernel's SGPRs peak)."""
    chosen = fx.Int32(0)
    for row in range(0, m):
        for j in range_constexpr(TOPK):
            chosen = chosen | (load_scalar(i32, ids_at + row * TOPK + j, fx.Int32) == tid).select(1, 0)
    if tid < E:
        fx.memref_store(chosen, lds_moe, tid)
    gpu.barrier()
    slot, size = fx.Int32(0), fx.Int32(0)  # chosen experts below tid; in all
    for e in range(0, E):
        flag = fx.memref_load(lds_moe, e)
        slot = slot + (e < tid).select(flag, 0)
        size = size + flag
    gpu.barrier()
    if tid < E:
        store_scalar(i32, slot_of_at + tid, (chosen != 0).select(slot, -1), fx.Int32)
    if (tid < E) & (chosen != 0):
        fx.memref_store(tid, lds_moe, slot)
    gpu.barrier()
    if tid < E:
        store_scalar(i32, union_at + tid, (tid < size).select(fx.memref_load(lds_moe, fx.min(tid, E - 1)), -1),
                     fx.Int32)
    if tid == 0:
        store_scalar(i32, size_at, size, fx.Int32)
    for base in range(0, size * rows, THREADS):  # the union's slots only (a run-time count: not unrolled)
        entry = base + tid
        entry_slot, row = entry // rows, entry % rows
        pick = fx.Int32(-1)
        if row < m:
            expert = fx.memref_load(lds_moe, fx.min(entry_slot, E - 1))
            pick = row_pick([load_scalar(i32, ids_at + row * TOPK + j, fx.Int32) for j in range_constexpr(TOPK)],
                            row, expert)
        if entry < size * rows:
            store_scalar(i32, pick_at + entry, pick, fx.Int32)
    gpu.barrier()  # lds_moe is free again


# -- S13 / S16: the clamped SwiGLU ------------------------------------------------------------------

def swiglu(gate, up):
    """silu(min(g, 10)) x clamp(u, -10, 10) (moe_reference.swiglu)."""
    g = fx.min(gate, SWIGLU_LIMIT)
    u = fx.min(fx.max(up, -SWIGLU_LIMIT), SWIGLU_LIMIT)
    return g * sigmoid(g) * u


@dsl
def act_row(f32x4, u8x8, u8, gate_at, up_at, parts: int, part_stride: int, round_inputs: bool, inter: int,
            codes_at, scales_at, lane):
    """One wave: h = bf16(swiglu(g, u)) of one row, g and u the sums of `parts` f32 parts
    `part_stride` words apart (bf16-rounded first when `round_inputs`), MXFP8 per 32."""
    valid = lane < inter // VEC
    col = valid.select(lane, 0) * VEC
    gate, up = [fx.Float32(0.0)] * VEC, [fx.Float32(0.0)] * VEC
    for p in range_constexpr(parts):
        g = load8_f32(f32x4, gate_at + p * part_stride + col)
        u = load8_f32(f32x4, up_at + p * part_stride + col)
        gate = [gate[e] + g[e] for e in range_constexpr(VEC)]
        up = [up[e] + u[e] for e in range_constexpr(VEC)]
    if round_inputs:
        gate, up = [bf16_round(v) for v in gate], [bf16_round(v) for v in up]
    h = [bf16_round(swiglu(gate[e], up[e])) for e in range_constexpr(VEC)]
    mx_store(h, u8x8, u8, codes_at, scales_at, valid.select(lane, 0), valid)


# -- S15 / S17: the routed experts' fp4 GEMVs -------------------------------------------------------

def fp4_operand(view16, offset):
    """A lane's 16 fp4 bytes as the 8 x i32 of an f8f6f4 operand (words 4-7 unread: zeros)."""
    words = load(view16, offset // 16, fx.Uint8, 16).bitcast(fx.Int32)
    return words.shuffle(fx.Vector.filled(4, 0, fx.Int32), list(range(8)))


def fp4_loads(w16, s8, expert, tile, w_rows: int, k: int, acts, rows, step, lane):
    """Every operand of one K step of expert `expert`'s fp4 tile `tile`: (A, A's scale code,
    [(B, B's scale code) of each row tile's operand row in `rows`])."""
    pieces, block = addressing.operand_pieces(step, lane), addressing.operand_block(step, lane)
    a = fp4_operand(w16, moe_addressing.weight_offset(expert, tile, step, lane, w_rows, k))
    scale_a = load_code(s8, moe_addressing.scale_offset(expert, tile, step, lane, w_rows, k))
    return a, scale_a, [(acts.operand(row, pieces), acts.scale(row, block)) for row in rows]


def fp4_steps(w16, s8, expert, tile, w_rows: int, k: int, acts, steps, lane, row_tiles: int):
    """Accumulators [row tile] of expert `expert`'s fp4 tile `tile` over `steps` x every token.

    A step's loads are issued before the previous step's MFMAs, so they are in flight while
    those run (the MFMAs wait only for their own step's loads: s_waitcnt vmcnt(N > 0)); loading
    each step right before its MFMAs made every MFMA wait for all of the wave's loads."""
    accs = [fx.Vector.filled(4, 0.0, fx.Float32) for _ in range_constexpr(row_tiles)]
    # each row tile's operand row, read once: a pick read among a step's loads would make the
    # next step's addresses wait for every load before it
    rows = [acts.row(addressing.operand_token(t, lane)) for t in range_constexpr(row_tiles)]
    steps = list(steps)
    ahead = fp4_loads(w16, s8, expert, tile, w_rows, k, acts, rows, steps[0][0], lane)
    for i, (_, keep) in enumerate(steps):
        a, scale_a, operands = ahead
        if i + 1 < len(steps):
            ahead = fp4_loads(w16, s8, expert, tile, w_rows, k, acts, rows, steps[i + 1][0], lane)
            fx.rocdl.sched_barrier(0)  # the scheduler may not sink them past this step's MFMAs
        for t, (b, scale_b) in enumerate(operands):
            acc = mfma(a, b, accs[t], scale_a, scale_b, FP4)
            accs[t] = acc if keep is None else keep.select(acc, accs[t])
    return accs


@dsl
def reduce_to_picks(accs, lds_acc, i32, f32, pick_at, out_at, out_width: int, col0, m, rows: int, tid, wave, lane):
    """S15: the 8 waves' K parts of one 16-row tile added (fixed order); row `token`'s result
    stored at out_at + pick x out_width + col0 + tile row when the token picked this slot."""
    row_tiles = len(accs)
    for t in range_constexpr(row_tiles):
        for e in range_constexpr(4):
            fx.memref_store(accs[t][e], lds_acc, addressing.lds_acc_slot(wave, t, lane, e, row_tiles))
    gpu.barrier()
    for rep in range_constexpr((row_tiles * WAVE * 4 + THREADS - 1) // THREADS):
        _, t, src_lane, e, real = addressing.split_k_sum(tid + rep * THREADS, WAVES, row_tiles)
        t = fx.min(t, row_tiles - 1)
        total = fx.Float32(0.0)
        for w in range_constexpr(WAVES):
            total = total + fx.memref_load(lds_acc, addressing.lds_acc_slot(w, t, src_lane, e, row_tiles))
        row, column = addressing.result_lane(src_lane, e)
        token = t * TILE_N + column
        if real & (token < m):
            pick = load_scalar(i32, pick_at + fx.min(token, rows - 1), fx.Int32)
            if pick >= 0:
                store_scalar(f32, out_at + pick * out_width + col0 + row, total, fx.Float32)
    gpu.barrier()  # lds_acc is free again


class PickRows:
    """S17's operand B: the routed h rows of the picks of one union slot (a token that did not
    pick it reads pick 0's row: its products reach only outputs that are not stored)."""

    def __init__(self, u8x16, u8, i32, codes, scales, pick_at, rows: int, k: int):
        self.u8x16, self.u8, self.i32, self.codes, self.scales = u8x16, u8, i32, codes, scales
        self.pick_at, self.rows, self.k = pick_at, rows, k

    def pick(self, token):
        return load_scalar(self.i32, self.pick_at + fx.min(token, self.rows - 1), fx.Int32)

    def row(self, token):
        """The h row a token's operand lanes read: its pick's (pick 0's when it has none)."""
        return fx.max(self.pick(token), 0)

    def operand(self, row, pieces):
        first = load(self.u8x16, addressing.mx_code_offset(self.codes, row, pieces[0], self.k) // 16, fx.Uint8, 16)
        second = load(self.u8x16, addressing.mx_code_offset(self.codes, row, pieces[1], self.k) // 16, fx.Uint8, 16)
        return first.bitcast(fx.Int32).shuffle(second.bitcast(fx.Int32), list(range(8)))

    def scale(self, row, block):
        return load_code(self.u8, addressing.mx_scale_offset(self.scales, row, block, self.k))


@dsl
def store_down(accs, acts, f32, weights_at, y_at, tile, m, lane):
    """S17, one wave: its tile's results times each pick's routing weight, to the pick's y row."""
    for t in range_constexpr(len(accs)):
        token = addressing.operand_token(t, lane)
        pick = acts.pick(token)
        if (token < m) & (pick >= 0):
            weight = load_scalar(f32, weights_at + pick, fx.Float32)
            for e in range_constexpr(4):
                row, _ = addressing.result_lane(lane, e)
                store_scalar(f32, y_at + pick * H + tile * TILE_N + row, accs[t][e] * weight, fx.Float32)


# -- S18: the rank's MoE partial -------------------------------------------------------------------

def partial_pair(f32, i32, ids_at, y_at, shared_at, row, col, live):
    """(bf16 pair word inputs) of (row, col, col + 1): bf16(bf16(sum of the row's valid entries
    in top-k order) + bf16(shared)), 0 for a pad row (moe_reference.moe_partial); each entry's
    down output read from its expert's pick in the row (row_pick: an expert named twice counts
    twice)."""
    ids = [load_scalar(i32, ids_at + row * TOPK + j, fx.Int32) for j in range_constexpr(TOPK)]
    routed = [fx.Float32(0.0), fx.Float32(0.0)]
    for j in range_constexpr(TOPK):
        expert = ids[j]
        valid = (expert >= 0) & (expert < E)
        pick = row_pick(ids, row, expert)  # row x 6 + j or a later entry: a row of y_at either way
        for d in range_constexpr(2):
            y = load_scalar(f32, y_at + pick * H + col + d, fx.Float32)
            routed[d] = routed[d] + valid.select(y, 0.0)
    out = []
    for d in range_constexpr(2):
        shared = bf16_round(load_scalar(f32, shared_at + row * H + col + d, fx.Float32))
        out.append(live.select(bf16_round(bf16_round(routed[d]) + shared), 0.0))
    return out


@dsl
def top6_row(f32, i32, bias, route_ids, logits_at, ids_at, weights_at, row, lane, use_hash):
    """S10, wave 0: the row's six experts and weights (router/kernel.select_top6) to the scratch."""
    expert, weight, active = select_top6(lambda e: load_scalar(f32, logits_at + row * E + e, fx.Float32), bias,
                                         route_ids, row, lane, use_hash)
    if active:
        store_scalar(i32, ids_at + row * TOPK + lane, expert, fx.Int32)
        store_scalar(f32, weights_at + row * TOPK + lane, weight, fx.Float32)
