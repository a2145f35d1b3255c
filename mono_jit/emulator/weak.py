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
  oldest first from RN int64 [same, 3] (head, count, invalidated since the launch began): a
  full cache gives up its oldest line.
  HOLD int64 [lines]: how many L2s hold the line (a probe with no other holder does nothing).
  DL int32 [L2s, lines] / DN int64 [L2s, 2]: each L2's lines made dirty since its last write-back
  (a line may repeat), their count and whether the list overflowed (then every line is scanned);
  LISTED uint8 [slots]: the L2 slot is on its list. A write-back visits the list, not every line.
  PRE uint8 [lines x 128]: the bytes before the launch, for the warm-L1 option: each vector L1
  starts holding every tracked line (WARM) until its first invalidate.
Stores are bookkept per lane and dword (an entry of up to 4 bytes in one line), loads per line
they touch, so the cost is per access, not per byte, wherever the rules allow.

The rules read LLVM AMDGPUUsage "Memory Model GFX942" (gfx950 follows it) operationally; each
names its table row. What is not modelled: docs/emulator.md "Weak memory".
"""

from __future__ import annotations

import numpy as np

from .jit_cache import njit

LINE = 128  # bytes of an L2 / L1 line (AMDGPUUsage "Memory Model GFX942": 128-byte cache lines)
ABSENT, PRELAUNCH, WARM = -2, -1, -3
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
 W_FREE, W_RING, W_RN, W_HOLD, W_DL, W_DN, W_LISTED, W_PRE) = range(24)
# Lines a vector L1 (32 KiB) and a scalar cache (16 KiB) hold: CDNA3 white paper's sizes, which
# CDNA4 keeps (an inference: AMD does not restate them). Replacement is oldest first here; the
# hardware's policy is not modelled, and dropping a clean line is always allowed.
L1_LINES, K_LINES = 256, 128
WHERE_QUEUED, WHERE_DIRTY, WHERE_FILLED = range(3)
SRC_MEMORY, SRC_L2, SRC_L1, SRC_SCALAR = range(4)
FULL = -1  # line_of / take_slot: the mode's arrays are full
NONE = -2  # load_lane: no part was stale


@njit(cache=True)
def line_of(W, mem, extent, k, off):
    """The compact number of the line holding byte `off` of allocation k (its bytes `mem`,
    `extent` of them), numbered on first touch (`number_line`), or FULL."""
    g = W[W_LB][k] + (off >> 7)
    c = W[W_LINES][g]
    if c >= 0:
        return c
    return number_line(W, mem, extent, g, off)


@njit(cache=True)
def number_line(W, mem, extent, g, off):
    """Number line g (of every tracked allocation's) and copy its bytes to MEM and PRE, or FULL.
    Apart from `line_of`, whose every call would otherwise pay for this path's arrays."""
    c = W[W_OPT][O_LINES]
    if (c + 1) * LINE > W[W_MEM].shape[0]:
        return FULL
    W[W_OPT][O_LINES] = c + 1
    W[W_LINES][g] = c
    start = off & ~(LINE - 1)
    end = min(start + LINE, extent)
    W[W_MEM][c * LINE:c * LINE + end - start] = mem[start:end]
    W[W_PRE][c * LINE:c * LINE + end - start] = mem[start:end]
    return c


@njit(cache=True)
def take_slot(W, row):
    """A free cache slot, its fill row set, or FULL."""
    if W[W_OPT][O_FREE] == 0:
        return FULL
    W[W_OPT][O_FREE] -= 1
    s = W[W_FREE][W[W_OPT][O_FREE]]
    W[W_SF][s] = row
    W[W_SM][s, :] = 0
    W[W_LISTED][s] = 0
    return s


@njit(cache=True)
def give_slot(W, s):
    W[W_LISTED][s] = 0
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
    W[W_HOLD][ln] += 1
    return True


@njit(cache=True)
def mark_dirty(W, x, ln, s):
    """L2 x's slot s (line ln) holds dirty bytes: on the L2's list for its next write-back."""
    if W[W_LISTED][s]:
        return
    W[W_LISTED][s] = 1
    if W[W_DN][x, 0] < W[W_DL].shape[1]:
        W[W_DL][x, W[W_DN][x, 0]] = ln
        W[W_DN][x, 0] += 1
    else:
        W[W_DN][x, 1] = 1


@njit(cache=True)
def l1_slot(W, cu, ln):
    """The slot of CU cu's vector L1 copy of a line, ABSENT, or FULL: a WARM line (the warm-L1
    option, before the CU's first invalidate) becomes a copy of the line before the launch."""
    s = W[W_L1][cu, ln]
    if s != WARM:
        return s
    if W[W_RN][cu, 2]:
        return ABSENT
    W[W_L1][cu, ln] = ABSENT
    if not copy_line(W, W_L1, cu, ln, -1, PRELAUNCH):
        return FULL
    return W[W_L1][cu, ln]


@njit(cache=True)
def copy_line(W, cache, holder, ln, source, row):
    """Fill an L1 or scalar-cache line from L2 slot `source` (-1: the bytes before the launch),
    giving up the cache's oldest line when it is full; False when no slot is free."""
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
    if source < 0:
        W[W_SD][s, :] = W[W_PRE][ln * LINE:(ln + 1) * LINE]
    else:
        W[W_SD][s, :] = W[W_SD][source, :]
    MAP[holder, ln] = s
    RING[r, (RN[r, 0] + RN[r, 1]) % cap] = ln
    RN[r, 1] += 1
    return True


@njit(cache=True)
def write_back(W, x, ln):
    """Write L2 x's dirty bytes of a line to memory."""
    s = W[W_L2][x, ln]
    for j in range(LINE):
        if W[W_SM][s, j]:
            W[W_MEM][ln * LINE + j] = W[W_SD][s, j]
            W[W_SM][s, j] = 0
    W[W_LISTED][s] = 0


@njit(cache=True)
def probe(W, keep, ln):
    """A write from L2 `keep` reached memory: every other L2 drops the line, writing back its
    dirty bytes first (AMDGPUUsage GFX942: "writes from other L2s' CUs probe local lines"; RW
    lines "will never be stale in L2 due to the memory probes"). That write-back is itself a
    write from another L2, so the keeper's copy takes those bytes too."""
    kept = W[W_L2][keep, ln] if keep >= 0 else ABSENT
    if W[W_HOLD][ln] == (0 if kept == ABSENT else 1):  # no other W[W_L2] holds it
        return
    for x in range(W[W_L2].shape[0]):
        if x != keep and W[W_L2][x, ln] != ABSENT:
            s = W[W_L2][x, ln]
            for j in range(LINE):
                if W[W_SM][s, j]:
                    W[W_MEM][ln * LINE + j] = W[W_SD][s, j]
                    if kept != ABSENT and not W[W_SM][kept, j]:
                        W[W_SD][kept, j] = W[W_SD][s, j]
            give_slot(W, s)
            W[W_L2][x, ln] = ABSENT
            W[W_HOLD][ln] -= 1


@njit(cache=True)
def complete(W, w, slot):
    """One queued entry of wave w takes effect; False when the caches are full."""
    x, cu = W[W_GEO][w, 0], W[W_GEO][w, 1]
    kind, size, b = W[W_Q][w, slot, 0] & 15, W[W_Q][w, slot, 0] >> 4, W[W_Q][w, slot, 1]
    if kind == Q_WBL2:
        # buffer_wbl2 sc1 / sc0 sc1: "write back dirty W[W_L2] lines" of this XCD (table rows "fence
        # release" / "store atomic release", agent and system scope).
        if W[W_DN][x, 1]:  # the list overflowed: every line
            for ln in range(W[W_OPT][O_LINES]):
                if W[W_L2][x, ln] != ABSENT and W[W_LISTED][W[W_L2][x, ln]]:
                    write_back(W, x, ln)
                    probe(W, x, ln)
        else:
            for n in range(W[W_DN][x, 0]):
                ln = W[W_DL][x, n]
                if W[W_L2][x, ln] != ABSENT and W[W_LISTED][W[W_L2][x, ln]]:
                    write_back(W, x, ln)
                    probe(W, x, ln)
        W[W_DN][x, 0], W[W_DN][x, 1] = 0, 0
        return True
    value, ln, j = W[W_Q][w, slot, 2], b >> 7, b & (LINE - 1)
    for t in range(size):
        W[W_WR][b + t, 2] -= 1
    s1 = l1_slot(W, cu, ln)
    if s1 == FULL:
        return False
    if s1 != ABSENT:  # the vector W[W_L1] is write-through: a present line is updated
        for t in range(size):
            W[W_SD][s1, j + t] = value >> (8 * t) & 0xFF
    if kind == Q_THROUGH:  # sc1 / sc0 sc1 store, or a UC line: written through to memory
        probe(W, x, ln)
        s2 = W[W_L2][x, ln]
        for t in range(size):
            W[W_MEM][b + t] = value >> (8 * t) & 0xFF
            if s2 != ABSENT:
                W[W_SD][s2, j + t] = value >> (8 * t) & 0xFF
                W[W_SM][s2, j + t] = 0
        return True
    # A plain store to an RW line writes back: dirty bytes in this XCD's W[W_L2] ("store monotonic").
    if W[W_L2][x, ln] == ABSENT and not fill_l2(W, x, ln, PRELAUNCH):
        return False
    s2 = W[W_L2][x, ln]
    for t in range(size):
        W[W_SD][s2, j + t] = value >> (8 * t) & 0xFF
        W[W_SM][s2, j + t] = 1
    mark_dirty(W, x, ln, s2)
    return True


@njit(cache=True)
def complete_until(W, w, keep):
    """Complete wave w's oldest entries until those of its last `keep` vector memory
    instructions remain (s_waitcnt vmcnt(keep): the counter decrements in issue order); False
    when the caches are full."""
    while W[W_QN][w, 1] > 0:
        slot = W[W_QN][w, 0]
        if W[W_Q][w, slot, 3] > W[W_QN][w, 2] - keep:
            return True
        if not complete(W, w, slot):
            return False
        W[W_QN][w, 0] = (slot + 1) % QCAP
        W[W_QN][w, 1] -= 1
    return True


@njit(cache=True)
def end_turn(W, w):
    """The wave leaves the scheduler: its queued entries complete, oldest first; or, with the
    flag-first option, only its newest instruction's (later stores may complete before earlier
    ones: "per-CU request queues per L2 channel reorder memory operations"). False when the
    caches are full."""
    if not W[W_OPT][O_FLAG_FIRST]:
        return complete_until(W, w, 0)
    n = W[W_QN][w, 1]
    if n == 0:
        return True
    newest = W[W_Q][w, (W[W_QN][w, 0] + n - 1) % QCAP, 3]
    kept = 0
    for j in range(n):  # complete the newest instruction's entries, keep the rest in order
        slot = (W[W_QN][w, 0] + j) % QCAP
        if W[W_Q][w, slot, 3] == newest:
            if not complete(W, w, slot):
                return False
        else:
            target = (W[W_QN][w, 0] + kept) % QCAP
            W[W_Q][w, target] = W[W_Q][w, slot]
            kept += 1
    W[W_QN][w, 1] = kept
    return True


@njit(cache=True)
def issue(W, w):
    """A vector memory instruction of wave w issues (counted for vmcnt)."""
    W[W_QN][w, 2] += 1


@njit(cache=True)
def enqueue(W, w, kind, b, value):
    """Queue an entry; False when completing the oldest to make room found the caches full."""
    if W[W_QN][w, 1] == QCAP:  # the queue is full: its oldest entry completes (legal at any time)
        if not complete(W, w, W[W_QN][w, 0]):
            return False
        W[W_QN][w, 0] = (W[W_QN][w, 0] + 1) % QCAP
        W[W_QN][w, 1] -= 1
    slot = (W[W_QN][w, 0] + W[W_QN][w, 1]) % QCAP
    W[W_Q][w, slot, 0], W[W_Q][w, slot, 1], W[W_Q][w, slot, 2], W[W_Q][w, slot, 3] = kind, b, value, W[W_QN][w, 2]
    W[W_QN][w, 1] += 1
    return True


@njit(cache=True)
def store_bytes(W, mem, extent, w, row, k, off, value, size, sc1):
    """A store of `size` bytes in one line issues: the latest write of each, queued as one entry
    until it completes. False when the mode's arrays are full."""
    c = line_of(W, mem, extent, k, off)
    if c < 0:
        return False
    b = c * LINE + (off & (LINE - 1))
    for t in range(size):
        W[W_WR][b + t, 0], W[W_WR][b + t, 1] = w, row
        W[W_WR][b + t, 2] += 1
    kind = Q_THROUGH if sc1 or W[W_LT][k] == UC else Q_STORE
    return enqueue(W, w, kind | size << 4, b, value)


@njit(cache=True)
def store_byte(W, BUFS, ALLOC, w, row, k, off, value, sc1):
    """A store of one byte issues (nothing to do in an untracked allocation)."""
    if W[W_LT][k] == UNTRACKED:
        return True
    return store_bytes(W, BUFS[k], ALLOC[k, 1], w, row, k, off, value, 1, sc1)


@njit(cache=True)
def store_lane(W, mem, extent, V, w, row, k, off, data, parts, size, lane, sc1):
    """One lane's store of `parts` dwords (or one byte / short) from VGPR `data` into allocation
    k (its bytes `mem`, `extent` of them) issues: an entry a part, or a byte when the part
    crosses a line."""
    if W[W_LT][k] == UNTRACKED:
        return True
    for part in range(parts):
        value = np.int64(V[w, data + part, lane])
        at = off + 4 * part
        if (at & (LINE - 1)) + size <= LINE:
            if not store_bytes(W, mem, extent, w, row, k, at, value & ((1 << (8 * size)) - 1), size, sc1):
                return False
            continue
        for byte in range(size):
            if not store_bytes(W, mem, extent, w, row, k, at + byte, value >> (8 * byte) & 0xFF, 1, sc1):
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
        RN[cu, 0], RN[cu, 1], RN[cu, 2] = 0, 0, 1


@njit(cache=True)
def wait_vmcnt(W, w, simm16):
    """s_waitcnt: vmcnt is simm16 bits 3:0 and 15:14 on gfx9; False when the caches are full."""
    return complete_until(W, w, (simm16 & 0xF) | (simm16 >> 14 & 3) << 4)


@njit(cache=True)
def atomic(W, mem, extent, w, row, k, off, size, value):
    """An RMW atomic is performed at memory ("atomicrmw": RMW atomics bypass L1): every L2 gives
    up the line (dirty bytes written back) and the result is written through. False when the
    mode's arrays are full."""
    if W[W_LT][k] == UNTRACKED:
        return True
    c = line_of(W, mem, extent, k, off)
    if c < 0:
        return False
    b = c * LINE + (off & (LINE - 1))
    probe(W, -1, c)
    for j in range(size):
        W[W_MEM][b + j] = value >> (8 * j) & 0xFF
        W[W_WR][b + j, 0], W[W_WR][b + j, 1] = w, row
    return True


@njit(cache=True)
def report(W, w, row, k, off, got, latest, b, where, place, fill, source):
    n = W[W_OPT][O_COUNT]
    if n < W[W_REP].shape[0]:
        W[W_REP][n, R_WAVE], W[W_REP][n, R_ROW], W[W_REP][n, R_OFFSET], W[W_REP][n, R_ALLOC] = w, row, off, k
        W[W_REP][n, R_READ], W[W_REP][n, R_LATEST], W[W_REP][n, R_WRITER], W[W_REP][n, R_WROW] = got, latest, W[W_WR][b, 0], W[W_WR][b, 1]
        W[W_REP][n, R_WHERE], W[W_REP][n, R_PLACE], W[W_REP][n, R_FILL], W[W_REP][n, R_SOURCE] = where, place, fill, source
    W[W_OPT][O_COUNT] = n + 1


@njit(cache=True)
def copy_for(W, k, ln, w, row, sc1, scalar):
    """The slot whose copy of line ln a load of wave w reads, filling the caches on its way
    (-1: memory itself), or FULL."""
    x, cu, kc = W[W_GEO][w, 0], W[W_GEO][w, 1], W[W_GEO][w, 2]
    if W[W_LT][k] == UC:
        return -1
    if scalar:
        if W[W_K][kc, ln] == ABSENT:
            if W[W_L2][x, ln] == ABSENT and not fill_l2(W, x, ln, row):
                return FULL
            if not copy_line(W, W_K, kc, ln, W[W_L2][x, ln], row):
                return FULL
        return W[W_K][kc, ln]
    if not sc1:
        s = l1_slot(W, cu, ln)
        if s != ABSENT:
            return s
    if W[W_L2][x, ln] == ABSENT and not fill_l2(W, x, ln, row):
        return FULL
    if not sc1 and not copy_line(W, W_L1, cu, ln, W[W_L2][x, ln], row):
        return FULL
    return W[W_L2][x, ln]


@njit(cache=True)
def load(W, BUFS, ALLOC, w, row, k, off, size, latest, sc1, scalar):
    """`load_bytes` of allocation k of the registered ones (BUFS, ALLOC)."""
    return load_bytes(W, BUFS[k], ALLOC[k, 1], w, row, k, off, size, latest, sc1, scalar)


@njit(cache=True)
def load_bytes(W, mem, extent, w, row, k, off, size, latest, sc1, scalar):
    """The value a load of `size` bytes returns (or FULL when the mode's arrays are), filling the
    caches on its way; a stale read is reported. Plain / sc0 loads: L1, else the XCD's L2, else
    memory, filling both ("load monotonic" workgroup / agent rows); sc1 loads skip L1 and may hit
    an RW line in L2 (probes keep it fresh); scalar loads: the CU pair's scalar cache, which no
    memory-model sequence invalidates (the CP does between launches); UC lines are read at
    memory. The caches are looked up once a line the access touches (an unaligned one may
    cross two)."""
    if W[W_LT][k] == UNTRACKED:
        return latest
    x, cu = W[W_GEO][w, 0], W[W_GEO][w, 1]
    got = np.int64(0)
    stale, b_stale, ln_stale = -1, 0, 0
    source, fill = SRC_MEMORY, PRELAUNCH
    line, ln, copy = -1, 0, ABSENT  # the line in hand (allocation line), its number, its copy
    for j in range(size):
        if (off + j) >> 7 != line:
            line = (off + j) >> 7
            ln = line_of(W, mem, extent, k, off + j)
            if ln < 0:
                return FULL
            copy = ABSENT  # looked up when a byte of it is not the CU's own write
        b = ln * LINE + ((off + j) & (LINE - 1))
        want = latest >> (8 * j) & 0xFF
        writer = W[W_WR][b, 0]
        if writer >= 0 and W[W_GEO][writer, 1] == cu:
            v = want  # the CU's own pipeline is in order: workgroup scope needs no cache action
        else:
            if copy == ABSENT:
                copy = copy_for(W, k, ln, w, row, sc1, scalar)
                if copy == FULL:
                    return FULL
            if copy < 0:
                v, source = np.int64(W[W_MEM][b]), SRC_MEMORY
            else:
                v, fill = np.int64(W[W_SD][copy, b & (LINE - 1)]), W[W_SF][copy]
                source = SRC_SCALAR if scalar else SRC_L2 if copy == W[W_L2][x, ln] else SRC_L1
        got |= v << (8 * j)
        # A coherent read (sc1, UC) of a byte whose latest store is still queued is early, not
        # stale: that is what a poll is for. Any other difference is stale.
        if v != want and stale < 0 and not (W[W_WR][b, 2] > 0 and (sc1 or W[W_LT][k] == UC)):
            stale, b_stale, ln_stale = j, b, ln
    if stale >= 0:
        b, ln = b_stale, ln_stale
        if W[W_WR][b, 2] > 0:
            report(W, w, row, k, off, got, latest, b, WHERE_QUEUED, W[W_WR][b, 0], fill, source)
        else:
            dirty = -1
            for y in range(W[W_L2].shape[0]):
                if W[W_L2][y, ln] != ABSENT and W[W_SM][W[W_L2][y, ln], b & (LINE - 1)]:
                    dirty = y
            if dirty >= 0:
                report(W, w, row, k, off, got, latest, b, WHERE_DIRTY, dirty, fill, source)
            else:
                report(W, w, row, k, off, got, latest, b, WHERE_FILLED, x, fill, source)
    return got


@njit(cache=True)
def load_lane(W, mem, extent, V, w, row, k, off, dst, parts, size, signed, lane, sc1):
    """One lane's load of `parts` dwords (or one byte / short) of allocation k (its bytes `mem`,
    `extent` of them) into VGPR `dst`, as the caches give it: the first part read stale, -2
    (NONE) if none, or FULL."""
    first = NONE
    for part in range(parts):
        at = off + 4 * part
        latest = np.int64(0)
        for j in range(size):
            latest |= np.int64(mem[at + j]) << (8 * j)
        before = W[W_OPT][O_COUNT]
        v = load_bytes(W, mem, extent, w, row, k, at, size, latest, sc1, False)
        if v == FULL:
            return FULL
        if W[W_OPT][O_COUNT] != before and first == NONE:
            first = part
        if signed:
            v = (v - (1 << (8 * size)) if v >> (8 * size - 1) & 1 else v) & 0xFFFFFFFF
        V[w, dst + part, lane] = v
    return first
