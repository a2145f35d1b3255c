"""K2's cross-rank hand-offs as device code (FlyDSL; kernel modules only): the pushes of S6 (the
attention's wo_b partial) and S18 (the MoE's partial) into the peers' buffers, the tagged polls of
this rank's own buffer, and S7's and S19's all-reduce in rank order (one hop: every rank sums all
partials; two hops: each column's owner sums and sends the sums back). The buffers' regions and
offsets are attention_layout.py's (PART, RS, AG); the stages that call these are kernel.py's.

gfx950 facts, each from code that runs there:
- a pair is stored by one atomic 64-bit store at system scope (LLVM syncscope "", monotonic),
  which LLVM's AMDGPU backend lowers on gfx942 / gfx950 to `global_store_dwordx2 ... sc0 sc1`
  (AMDGPUUsage, "Memory Model GFX942": system-scope atomics set SC0 and SC1) and a poll is the
  matching `global_load_dwordx2 ... sc0 sc1`; vLLM 0.33's in-tree mono pushes and polls its
  peer pairs with the same cache policy (mono/common/ops.py CM_SYS = SC0 | SC1, "system scope
  (peers over XGMI)"; common/sync.py Mailbox.put / poll). tests/templates/k2/test_k2_gates.py checks the
  instructions in the ISA. The value and its tag land together because the store is one
  8-byte access, so no flag or fence is needed between them.
- the peer buffers are uncached, fine-grained device memory (runtime/peer.py, as AITER's
  UncachedIpcHeap), so the SC0 SC1 loads see peers' stores without cache maintenance.
- a poll that has not seen its tag `peer_wait_us` microseconds after it began (s_memrealtime's
  100 MHz clock, layout.TICKS_PER_US) traps (s_trap 2): a rank that died mid-step fails the
  launch instead of hanging the GPU, and a rank that is late (host work between K1 and K2) is
  waited for.
"""

import flydsl.expr as fx
from flydsl.expr import const_expr, gpu, range_constexpr

from .._dsl import butterfly, dsl, load_global, realtime
from .._numerics import bf16_pair_f32, bf16_round
from ..addressing import lds_acc_slot
from ..geometry import PAIR_BYTES, PEERS, SEAM_CHUNK, THREADS, TILE_N, WAVE, WAVES
from ..sync_device import trap_if
from .attention_addressing import wob_pair, wob_pair_target
from .attention_layout import TICKS_PER_US
from .moe_kernel import partial_pair

I32_MASK = 0xFFFFFFFF


def _pair(bits, tag):
    """(value word, tag) as the i64 one store writes: the value at the lower address."""
    return (fx.Int64(tag) << 32) | (fx.Int64(bits) & I32_MASK)


@dsl
def stage_peer_addresses(Peers, lds_peers, tid):
    """Copy the `peers` table (an i64 address a rank, what runtime/peer.py exchanges) into LDS
    once a launch. A push reads its peer's address from there into VGPRs: as scalar loads of
    the table, the eight addresses held 16 SGPRs through the all-reduce and the two-hop builds
    spilled SGPRs. (vLLM's mono also reads its peer bases from a table: common/ops.py
    peer_bases.)"""
    if tid < PEERS:
        address = load_global(Peers, tid)
        fx.memref_store((address & I32_MASK).to(fx.Int32), lds_peers, 2 * tid)
        fx.memref_store((address >> 32).to(fx.Int32), lds_peers, 2 * tid + 1)
    gpu.barrier()


def _peer_pointer(lds_peers, own, rank):
    """Rank `rank`'s peer buffer as a pointer of the own buffer's type (from LDS: a VGPR value)."""
    low = fx.Int64(fx.memref_load(lds_peers, 2 * rank)) & I32_MASK
    address = (fx.Int64(fx.memref_load(lds_peers, 2 * rank + 1)) << 32) | low
    return fx.inttoptr(fx.get_iter(own).type, address)


def _put(pointer, index, bits, tag) -> None:
    """One pair into a rank's peer buffer: a single 8-byte atomic store at system scope."""
    fx.generic_store(pointer + index, _pair(bits, tag), memory_order=fx.AtomicOrdering.Monotonic)


def _peek(buffer, index):
    return fx.generic_load(fx.get_iter(buffer) + index, memory_order=fx.AtomicOrdering.Monotonic)


@dsl
def _poll(buffer, indices, tag, wait_us):
    """The value words of pairs `indices` of this rank's buffer once every one carries `tag`:
    all loaded together, all re-loaded while any is stale; a wave whose lanes still see a stale
    pair `wait_us` microseconds (s_memrealtime) after the first load traps."""
    deadline = realtime() + fx.Int64(wait_us) * TICKS_PER_US
    seen = fx.Vector.from_elements([_peek(buffer, i) for i in indices], fx.Int64)
    late = fx.Int32(0)
    stale = fx.Int32(0)
    for n in range_constexpr(len(indices)):
        stale = stale | ((seen[n] >> 32).to(fx.Int32) != tag).select(1, 0)
    while (stale != 0) & (late == 0):
        fx.rocdl.s_sleep(1)
        seen = fx.Vector.from_elements([_peek(buffer, i) for i in indices], fx.Int64)
        stale = fx.Int32(0)
        for n in range_constexpr(len(indices)):
            stale = stale | ((seen[n] >> 32).to(fx.Int32) != tag).select(1, 0)
        late = (realtime() > deadline).select(1, 0)
    trap_if(butterfly(stale, fx.max, range(6)))
    return [seen[n].to(fx.Int32) for n in range_constexpr(len(indices))]


def _sum_in_rank_order(words):
    """The ranks' bf16 pairs summed in f32 in rank order: (low sum, high sum)."""
    lo, hi = bf16_pair_f32(words[0])
    for w in words[1:]:
        a, b = bf16_pair_f32(w)
        lo, hi = lo + a, hi + b
    return lo, hi


def _bf16_pair_bits(lo, hi):
    """Two f32 as one i32 of two bf16 (RNE): lo in the low half."""
    return fx.Vector.from_elements([lo, hi], fx.Float32).to(fx.BFloat16).bitcast(fx.Int32)[0]


@dsl
def wob_push(lay, task, accs, lds_acc, peers, mailbox, half_at, rank, tag, m, tid, wave, lane):
    """S6 after its GEMV: the 8 waves' K parts added (fixed order), bf16, and each (token,
    column pair) pushed: to every rank's PART (one hop) or the columns' owner's RS (two hops).
    Pad tokens (m <= token < rows) push zeros; tokens past the bucket push nothing."""
    row_tiles = len(accs)
    for t in range_constexpr(row_tiles):
        for e in range_constexpr(4):
            fx.memref_store(accs[t][e], lds_acc, lds_acc_slot(wave, t, lane, e, row_tiles))
    gpu.barrier()
    pairs = row_tiles * WAVE * 2
    for rep in range_constexpr((pairs + THREADS - 1) // THREADS):
        index = tid + rep * THREADS
        t, src_lane, e0, real = wob_pair(index, row_tiles)
        t = fx.min(t, row_tiles - 1)  # spare slots read a real accumulator and push nothing
        totals = []
        for e in range_constexpr(2):
            total = fx.Float32(0.0)
            for w in range_constexpr(WAVES):
                total = total + fx.memref_load(lds_acc, lds_acc_slot(w, t, src_lane, e0 + e, row_tiles))
            totals.append(total)
        token, col = wob_pair_target(task, src_lane, e0, t)
        live = token < m
        bits = _bf16_pair_bits(live.select(totals[0], 0.0), live.select(totals[1], 0.0))
        if const_expr(lay.two_hop):
            to = lay.wob_owner(task)
            at = half_at + lay.rs_pair(rank, token, col) // PAIR_BYTES
        else:
            to = -1  # every rank
            at = half_at + lay.part_pair(rank, token, col) // PAIR_BYTES
        _put_some(peers, mailbox, lay.tp, to, at, bits, tag, real & (token < lay.rows))
    gpu.barrier()  # lds_acc is free again


@dsl
def _put_some(peers, mailbox, tp, to, at, bits, tag, valid):
    """Pair `at` := (bits, tag) in peer `to`'s buffer, or in every peer's when `to` is -1."""
    if valid:
        for p in range_constexpr(tp):
            if (to == p) | (to == -1):
                _put(_peer_pointer(peers, mailbox, p), at, bits, tag)


def reduce_row(lay, chunk, row, live, mailbox, peers, half_at, rank, tag, wait_us, y, tid):
    """S7, threads 0..63: columns 2 tid, 2 tid + 1 of the chunk for `row`, all-reduced, into
    LDS y (0 for a pad row). Two hops: the chunk's owner sums RS and pushes the bf16 sums to
    every rank's AG (pad rows too); the others read AG."""
    col = chunk * SEAM_CHUNK + 2 * tid
    if lay.two_hop:
        sources = [half_at + lay.rs_pair(src, row, col) // PAIR_BYTES for src in range(lay.tp)]
        gathered = half_at + lay.ag_pair(row, col) // PAIR_BYTES
        _reduce_two_hops(lay.seam_owner(chunk) == rank, live, sources, gathered, mailbox, peers, lay.tp, tag,
                         wait_us, y, tid)
    else:
        sources = [half_at + lay.part_pair(src, row, col) // PAIR_BYTES for src in range(lay.tp)]
        _reduce_one_hop(live, sources, mailbox, tag, wait_us, y, tid)
    gpu.barrier()


@dsl
def _reduce_one_hop(live, sources, mailbox, tag, wait_us, y, tid):
    if tid < SEAM_CHUNK // 2:
        lo, hi = fx.Float32(0.0), fx.Float32(0.0)
        if live:
            lo, hi = _sum_in_rank_order(_poll(mailbox, sources, tag, wait_us))
        fx.memref_store(bf16_round(lo), y, 2 * tid)
        fx.memref_store(bf16_round(hi), y, 2 * tid + 1)


@dsl
def _reduce_two_hops(owner, live, sources, gathered, mailbox, peers, tp, tag, wait_us, y, tid):
    if tid < SEAM_CHUNK // 2:
        lo, hi = fx.Float32(0.0), fx.Float32(0.0)
        if live:  # one poll either way: the owner's RS pairs, or the AG pair (read tp times)
            words = _poll(mailbox, [owner.select(source, gathered) for source in sources], tag, wait_us)
            summed, taken = _sum_in_rank_order(words), bf16_pair_f32(words[0])
            lo, hi = owner.select(summed[0], taken[0]), owner.select(summed[1], taken[1])
        if owner:  # to every rank's AG, its own too (it never reads its own columns there)
            bits = _bf16_pair_bits(lo, hi)
            for p in range_constexpr(tp):
                _put(_peer_pointer(peers, mailbox, p), gathered, bits, tag)
        fx.memref_store(bf16_round(lo), y, 2 * tid)
        fx.memref_store(bf16_round(hi), y, 2 * tid + 1)


def moe_push(lay, task, f32, i32, peers, mailbox, half_at, rank, tag, m, tid):
    """S18: thread (row, column pair) of tile `task` computes its MoE partial pair and pushes it
    as S6 pushes the attention's (one hop: every rank; two hops: the columns' owner)."""
    pairs = TILE_N // 2
    row, col = tid // pairs, task * TILE_N + tid % pairs * 2
    at_row = fx.min(row, lay.rows - 1)
    lo, hi = partial_pair(f32, i32, lay.ids, lay.routed_y, lay.shared_raw, at_row, col, row < m)
    bits = _bf16_pair_bits(lo, hi)
    if lay.two_hop:
        to, at = lay.wob_owner(task), half_at + lay.rs_pair(rank, at_row, col) // PAIR_BYTES
    else:
        to, at = -1, half_at + lay.part_pair(rank, at_row, col) // PAIR_BYTES
    _put_some(peers, mailbox, lay.tp, to, at, bits, tag, row < lay.rows)
