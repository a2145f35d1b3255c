"""The weak-memory mode: MI355X's cache hierarchy as numba arrays, and a report for every read
that returns a value other than the latest write (a stale read), like a race detector.

State (one tuple `W`, built by `weak_state.py`; arrays of one element when the mode is off).
Lines of the tracked allocations get a compact number when first touched (LINES holds it per
line of every tracked allocation, LB the first such line of each allocation); the per-line and
per-byte arrays are indexed by it, so only the memory a launch reaches costs anything.
  OPT int64 [OPT_FIELDS]: on, fail on the first stale read, flag-first completion, reports,
  lines numbered, free cache slots.
  GEO int64 [waves, 3]: the wave's L2 (device x XCD), vector L1 (CU) and scalar cache (CU pair).
  LB / LT int64 [allocations]: first line, memory type (untracked, RW, UC).
  MEM uint8 [lines x 128]: what memory holds; BUFS keeps the sequentially consistent latest bytes.
  L2 / L1 / K int32 [caches, lines]: the slot holding a line in each L2, vector L1 and scalar
  cache, or ABSENT. Slots (one pool): SD / SM uint8 [slots, 128] data and dirty bytes (only L2
  lines get dirty: the L1 is write-through), SF int64 [slots] the row that filled it
  (PRELAUNCH: before the launch), FREE int64 [slots] the free slots, a stack.
  WR int32 [lines x 128, 3]: the latest writer's wave and row, and its stores not yet complete.
  Q int64 [waves, QCAP, 4]: the wave's incomplete stores (a byte each) and write-backs, a ring;
  QN int64 [waves, 3]: ring head, length, vector memory instructions issued.
  REP int64 [REPORTS, REP_FIELDS]: the first stale reads.
  RING int32 [L1s + scalar caches, L1_LINES]: the lines each L1 (then each scalar cache) holds,
  oldest first from RN int64 [same, 2] (head, count): a full cache gives up its oldest line.

The rules read LLVM AMDGPUUsage "Memory Model GFX942" (gfx950 follows it) operationally; each
names its table row. What is not modelled: docs/emulator.md "Weak memory".
"""

from __future__ import annotations

import numpy as np

from .jit_cache import njit

LINE = 128  # bytes of an L2 / L1 line (AMDGPUUsage "Memory Model GFX942": 128-byte cache lines)
ABSENT, PRELAUNCH = -2, -1
UNTRACKED, RW, UC = range(3)
O_ON, O_FAIL, O_FLAG_FIRST, O_COUNT, O_LINES, O_FREE = range(6)
OPT_FIELDS = 6
Q_STORE, Q_THROUGH, Q_WBL2 = range(3)
QCAP = 16384
REPORTS = 64
# REP fields: reader wave and row, address byte, allocation, value read, latest value, writer wave
# and row, where the fresh value was (WHERE_*), its XCD / cache index, the stale copy's fill row.
(R_WAVE, R_ROW, R_OFFSET, R_ALLOC, R_READ, R_LATEST, R_WRITER, R_WROW, R_WHERE, R_PLACE, R_FILL,
 R_SOURCE) = range(12)
REP_FIELDS = 12
# The state tuple's members.
(W_OPT, W_GEO, W_LB, W_MEM, W_SD, W_SM, W_SF, W_L2, W_L1, W_LT, W_WR, W_Q, W_QN, W_REP, W_K, W_LINES,
 W_FREE, W_RING, W_RN) = range(19)
# Lines a vector L1 (32 KiB) and a scalar cache (16 KiB) hold: CDNA3 white paper's sizes, which
# CDNA4 keeps (an inference: AMD does not restate them). Replacement is oldest first here; the
# hardware's policy is not modelled, and dropping a clean line is always allowed.
L1_LINES, K_LINES = 256, 128
WHERE_QUEUED, WHERE_DIRTY, WHERE_FILLED = range(3)
SRC_MEMORY, SRC_L2, SRC_L1, SRC_SCALAR = range(4)
FULL = -1  # line_of / take_slot: the mode's arrays are full
NONE = -2  # load_lane: no part was stale


@njit(cache=True)
def line_of(W, BUFS, ALLOC, k, off):
    """The compact number of the line holding byte `off` of allocation k, numbered (and its
    bytes copied to MEM) on first touch, or FULL."""
    OPT, LB, MEM, LINES = W[W_OPT], W[W_LB], W[W_MEM], W[W_LINES]
    g = LB[k] + (off >> 7)
    c = LINES[g]
    if c >= 0:
        return c
    c = OPT[O_LINES]
    if (c + 1) * LINE > MEM.shape[0]:
        return FULL
    OPT[O_LINES] = c + 1
    LINES[g] = c
    start = off & ~(LINE - 1)
    end = min(start + LINE, ALLOC[k, 1])
    MEM[c * LINE:c * LINE + end - start] = BUFS[k][start:end]
    return c


@njit(cache=True)
def take_slot(W, row):
    """A free cache slot, its fill row set, or FULL."""
    OPT, FREE, SF = W[W_OPT], W[W_FREE], W[W_SF]
    if OPT[O_FREE] == 0:
        return FULL
    OPT[O_FREE] -= 1
    s = FREE[OPT[O_FREE]]
    SF[s] = row
    W[W_SM][s, :] = 0
    return s


@njit(cache=True)
def give_slot(W, s):
    W[W_FREE][W[W_OPT][O_FREE]] = s
    W[W_OPT][O_FREE] += 1


@njit(cache=True)
def fill_l2(W, x, ln, row):
    """Copy a line from memory into L2 x, clean; False when no slot is free."""
    s = take_slot(W, row)
    if s < 0:
        return False
    W[W_SD][s, :] = W[W_MEM][ln * LINE:(ln + 1) * LINE]
    W[W_L2][x, ln] = s
    return True


@njit(cache=True)
def copy_line(W, cache, holder, ln, source, row):
    """Fill an L1 or scalar-cache line from L2 slot `source`, giving up the cache's oldest line
    when it is full; False when no slot is free."""
    RING, RN, MAP = W[W_RING], W[W_RN], W[cache]
    r, cap = holder, L1_LINES
    if cache == W_K:
        r, cap = W[W_L1].shape[0] + holder, K_LINES
    if RN[r, 1] == cap:
        old = RING[r, RN[r, 0]]
        give_slot(W, MAP[holder, old])
        MAP[holder, old] = ABSENT
        RN[r, 0] = (RN[r, 0] + 1) % cap
        RN[r, 1] -= 1
    s = take_slot(W, row)
    if s < 0:
        return False
    W[W_SD][s, :] = W[W_SD][source, :]
    MAP[holder, ln] = s
    RING[r, (RN[r, 0] + RN[r, 1]) % cap] = ln
    RN[r, 1] += 1
    return True


@njit(cache=True)
def write_back(W, x, ln):
    """Write L2 x's dirty bytes of a line to memory."""
    MEM, SD, SM = W[W_MEM], W[W_SD], W[W_SM]
    s = W[W_L2][x, ln]
    for j in range(LINE):
        if SM[s, j]:
            MEM[ln * LINE + j] = SD[s, j]
            SM[s, j] = 0


@njit(cache=True)
def probe(W, keep, ln):
    """A write from L2 `keep` reached memory: every other L2 drops the line, writing back its
    dirty bytes first (AMDGPUUsage GFX942: "writes from other L2s' CUs probe local lines"; RW
    lines "will never be stale in L2 due to the memory probes"). That write-back is itself a
    write from another L2, so the keeper's copy takes those bytes too."""
    L2, MEM, SD, SM = W[W_L2], W[W_MEM], W[W_SD], W[W_SM]
    kept = L2[keep, ln] if keep >= 0 else ABSENT
    for x in range(L2.shape[0]):
        if x != keep and L2[x, ln] != ABSENT:
            s = L2[x, ln]
            for j in range(LINE):
                if SM[s, j]:
                    MEM[ln * LINE + j] = SD[s, j]
                    if kept != ABSENT and not SM[kept, j]:
                        SD[kept, j] = SD[s, j]
            give_slot(W, s)
            L2[x, ln] = ABSENT


@njit(cache=True)
def complete(W, w, slot):
    """One queued entry of wave w takes effect; False when the caches are full."""
    GEO, MEM, SD, SM, L2, L1, WR, Q = W[W_GEO], W[W_MEM], W[W_SD], W[W_SM], W[W_L2], W[W_L1], W[W_WR], W[W_Q]
    x, cu = GEO[w, 0], GEO[w, 1]
    kind, b = Q[w, slot, 0], Q[w, slot, 1]
    lines = W[W_OPT][O_LINES]
    if kind == Q_WBL2:
        # buffer_wbl2 sc1 / sc0 sc1: "write back dirty L2 lines" of this XCD (table rows "fence
        # release" / "store atomic release", agent and system scope).
        for ln in range(lines):
            if L2[x, ln] != ABSENT and SM[L2[x, ln]].any():
                write_back(W, x, ln)
                probe(W, x, ln)
        return True
    value, ln, j = np.uint8(Q[w, slot, 2]), b >> 7, b & (LINE - 1)
    WR[b, 2] -= 1
    if L1[cu, ln] != ABSENT:  # the vector L1 is write-through: a present line is updated
        SD[L1[cu, ln], j] = value
    if kind == Q_THROUGH:  # sc1 / sc0 sc1 store, or a UC line: written through to memory
        probe(W, x, ln)
        MEM[b] = value
        if L2[x, ln] != ABSENT:
            SD[L2[x, ln], j] = value
            SM[L2[x, ln], j] = 0
        return True
    # A plain store to an RW line writes back: dirty bytes in this XCD's L2 ("store monotonic").
    if L2[x, ln] == ABSENT and not fill_l2(W, x, ln, PRELAUNCH):
        return False
    SD[L2[x, ln], j] = value
    SM[L2[x, ln], j] = 1
    return True


@njit(cache=True)
def complete_until(W, w, keep):
    """Complete wave w's oldest entries until those of its last `keep` vector memory
    instructions remain (s_waitcnt vmcnt(keep): the counter decrements in issue order); False
    when the caches are full."""
    Q, QN = W[W_Q], W[W_QN]
    while QN[w, 1] > 0:
        slot = QN[w, 0]
        if Q[w, slot, 3] > QN[w, 2] - keep:
            return True
        if not complete(W, w, slot):
            return False
        QN[w, 0] = (slot + 1) % QCAP
        QN[w, 1] -= 1
    return True


@njit(cache=True)
def end_turn(W, w):
    """The wave leaves the scheduler: its queued entries complete, oldest first; or, with the
    flag-first option, only its newest instruction's (later stores may complete before earlier
    ones: "per-CU request queues per L2 channel reorder memory operations"). False when the
    caches are full."""
    Q, QN = W[W_Q], W[W_QN]
    if not W[W_OPT][O_FLAG_FIRST]:
        return complete_until(W, w, 0)
    n = QN[w, 1]
    if n == 0:
        return True
    newest = Q[w, (QN[w, 0] + n - 1) % QCAP, 3]
    kept = 0
    for j in range(n):  # complete the newest instruction's entries, keep the rest in order
        slot = (QN[w, 0] + j) % QCAP
        if Q[w, slot, 3] == newest:
            if not complete(W, w, slot):
                return False
        else:
            target = (QN[w, 0] + kept) % QCAP
            Q[w, target] = Q[w, slot]
            kept += 1
    QN[w, 1] = kept
    return True


@njit(cache=True)
def issue(W, w):
    """A vector memory instruction of wave w issues (counted for vmcnt)."""
    W[W_QN][w, 2] += 1


@njit(cache=True)
def enqueue(W, w, kind, b, value):
    """Queue an entry; False when completing the oldest to make room found the caches full."""
    Q, QN = W[W_Q], W[W_QN]
    if QN[w, 1] == QCAP:  # the queue is full: its oldest entry completes (legal at any time)
        if not complete(W, w, QN[w, 0]):
            return False
        QN[w, 0] = (QN[w, 0] + 1) % QCAP
        QN[w, 1] -= 1
    slot = (QN[w, 0] + QN[w, 1]) % QCAP
    Q[w, slot, 0], Q[w, slot, 1], Q[w, slot, 2], Q[w, slot, 3] = kind, b, value, QN[w, 2]
    QN[w, 1] += 1
    return True


@njit(cache=True)
def store_byte(W, BUFS, ALLOC, w, row, k, off, value, sc1):
    """A store of one byte issues: it is the latest write, queued until it completes. False when
    the mode's arrays are full."""
    LT, WR = W[W_LT], W[W_WR]
    if LT[k] == UNTRACKED:
        return True
    c = line_of(W, BUFS, ALLOC, k, off)
    if c < 0:
        return False
    b = c * LINE + (off & (LINE - 1))
    WR[b, 0], WR[b, 1] = w, row
    WR[b, 2] += 1
    return enqueue(W, w, Q_THROUGH if sc1 or LT[k] == UC else Q_STORE, b, value)


@njit(cache=True)
def store_lane(W, BUFS, ALLOC, V, w, row, k, off, data, parts, size, lane, sc1):
    """One lane's store of `parts` dwords (or one byte / short) from VGPR `data` issues."""
    for part in range(parts):
        value = np.int64(V[w, data + part, lane])
        for byte in range(size):
            if not store_byte(W, BUFS, ALLOC, w, row, k, off + 4 * part + byte, value >> (8 * byte) & 0xFF, sc1):
                return False
    return True


@njit(cache=True)
def wbl2(W, w, sc1):
    """buffer_wbl2: queued; only the agent / system scope bits (sc1) write back the L2
    (SIGfx940CacheControl::insertRelease emits `sc1` for agent, `sc0 sc1` for system)."""
    if sc1:
        return enqueue(W, w, Q_WBL2, 0, 0)
    return True


@njit(cache=True)
def inv(W, w, scoped):
    """buffer_inv sc0 / sc1 / sc0 sc1 drops this CU's vector L1 (table row "fence acquire"); NC
    lines, which sc1 also drops, are not modelled (every tracked line is RW or UC)."""
    if scoped:
        L1, RING, RN, cu = W[W_L1], W[W_RING], W[W_RN], W[W_GEO][w, 1]
        for j in range(RN[cu, 1]):
            ln = RING[cu, (RN[cu, 0] + j) % L1_LINES]
            give_slot(W, L1[cu, ln])
            L1[cu, ln] = ABSENT
        RN[cu, 0], RN[cu, 1] = 0, 0


@njit(cache=True)
def wait_vmcnt(W, w, simm16):
    """s_waitcnt: vmcnt is simm16 bits 3:0 and 15:14 on gfx9; False when the caches are full."""
    return complete_until(W, w, (simm16 & 0xF) | (simm16 >> 14 & 3) << 4)


@njit(cache=True)
def atomic(W, BUFS, ALLOC, w, row, k, off, size, value):
    """An RMW atomic is performed at memory ("atomicrmw": RMW atomics bypass L1): every L2 gives
    up the line (dirty bytes written back) and the result is written through. False when the
    mode's arrays are full."""
    MEM, WR = W[W_MEM], W[W_WR]
    if W[W_LT][k] == UNTRACKED:
        return True
    c = line_of(W, BUFS, ALLOC, k, off)
    if c < 0:
        return False
    b = c * LINE + (off & (LINE - 1))
    probe(W, -1, c)
    for j in range(size):
        MEM[b + j] = value >> (8 * j) & 0xFF
        WR[b + j, 0], WR[b + j, 1] = w, row
    return True


@njit(cache=True)
def report(W, w, row, k, off, got, latest, b, where, place, fill, source):
    OPT, REP, WR = W[W_OPT], W[W_REP], W[W_WR]
    n = OPT[O_COUNT]
    if n < REP.shape[0]:
        REP[n, R_WAVE], REP[n, R_ROW], REP[n, R_OFFSET], REP[n, R_ALLOC] = w, row, off, k
        REP[n, R_READ], REP[n, R_LATEST], REP[n, R_WRITER], REP[n, R_WROW] = got, latest, WR[b, 0], WR[b, 1]
        REP[n, R_WHERE], REP[n, R_PLACE], REP[n, R_FILL], REP[n, R_SOURCE] = where, place, fill, source
    OPT[O_COUNT] = n + 1


@njit(cache=True)
def load(W, BUFS, ALLOC, w, row, k, off, size, latest, sc1, scalar):
    """The value a load of `size` bytes returns (or FULL when the mode's arrays are), filling the
    caches on its way; a stale read is reported. Plain / sc0 loads: L1, else the XCD's L2, else
    memory, filling both ("load monotonic" workgroup / agent rows); sc1 loads skip L1 and may hit
    an RW line in L2 (probes keep it fresh); scalar loads: the CU pair's scalar cache, which no
    memory-model sequence invalidates (the CP does between launches); UC lines are read at
    memory."""
    GEO, MEM, SD, SM, SF, L2, L1, K, LT, WR = (W[W_GEO], W[W_MEM], W[W_SD], W[W_SM], W[W_SF], W[W_L2], W[W_L1],
                                               W[W_K], W[W_LT], W[W_WR])
    if LT[k] == UNTRACKED:
        return latest
    x, cu, kc = GEO[w, 0], GEO[w, 1], GEO[w, 2]
    got = np.int64(0)
    stale, b_stale, ln_stale = -1, 0, 0
    source, fill = SRC_MEMORY, PRELAUNCH
    for j in range(size):  # byte by byte: an unaligned access may cross a line
        ln = line_of(W, BUFS, ALLOC, k, off + j)
        if ln < 0:
            return FULL
        b = ln * LINE + ((off + j) & (LINE - 1))
        want = latest >> (8 * j) & 0xFF
        writer = WR[b, 0]
        if writer >= 0 and GEO[writer, 1] == cu:
            v = want  # the CU's own pipeline is in order: workgroup scope needs no cache action
        elif LT[k] == UC:
            v = np.int64(MEM[b])
            source = SRC_MEMORY
        elif scalar:
            if K[kc, ln] == ABSENT:
                if L2[x, ln] == ABSENT and not fill_l2(W, x, ln, row):
                    return FULL
                if not copy_line(W, W_K, kc, ln, L2[x, ln], row):
                    return FULL
            v, source, fill = np.int64(SD[K[kc, ln], b & (LINE - 1)]), SRC_SCALAR, SF[K[kc, ln]]
        elif not sc1 and L1[cu, ln] != ABSENT:
            v, source, fill = np.int64(SD[L1[cu, ln], b & (LINE - 1)]), SRC_L1, SF[L1[cu, ln]]
        else:
            if L2[x, ln] == ABSENT and not fill_l2(W, x, ln, row):
                return FULL
            v, source, fill = np.int64(SD[L2[x, ln], b & (LINE - 1)]), SRC_L2, SF[L2[x, ln]]
            if not sc1 and not copy_line(W, W_L1, cu, ln, L2[x, ln], row):
                return FULL
        got |= v << (8 * j)
        # A coherent read (sc1, UC) of a byte whose latest store is still queued is early, not
        # stale: that is what a poll is for. Any other difference is stale.
        if v != want and stale < 0 and not (WR[b, 2] > 0 and (sc1 or LT[k] == UC)):
            stale, b_stale, ln_stale = j, b, ln
    if stale >= 0:
        b, ln = b_stale, ln_stale
        if WR[b, 2] > 0:
            report(W, w, row, k, off, got, latest, b, WHERE_QUEUED, WR[b, 0], fill, source)
        else:
            dirty = -1
            for y in range(L2.shape[0]):
                if L2[y, ln] != ABSENT and SM[L2[y, ln], b & (LINE - 1)]:
                    dirty = y
            if dirty >= 0:
                report(W, w, row, k, off, got, latest, b, WHERE_DIRTY, dirty, fill, source)
            else:
                report(W, w, row, k, off, got, latest, b, WHERE_FILLED, x, fill, source)
    return got


@njit(cache=True)
def load_lane(W, BUFS, ALLOC, V, w, row, k, off, dst, parts, size, signed, lane, sc1):
    """One lane's load of `parts` dwords (or one byte / short) into VGPR `dst`, as the caches
    give it: the first part read stale, -2 (NONE) if none, or FULL."""
    mem = BUFS[k]
    first = NONE
    for part in range(parts):
        at = off + 4 * part
        latest = np.int64(0)
        for j in range(size):
            latest |= np.int64(mem[at + j]) << (8 * j)
        before = W[W_OPT][O_COUNT]
        v = load(W, BUFS, ALLOC, w, row, k, at, size, latest, sc1, False)
        if v == FULL:
            return FULL
        if W[W_OPT][O_COUNT] != before and first == NONE:
            first = part
        if signed:
            v = (v - (1 << (8 * size)) if v >> (8 * size - 1) & 1 else v) & 0xFFFFFFFF
        V[w, dst + part, lane] = v
    return first
