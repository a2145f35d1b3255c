"""The weak-memory mode: MI355X's cache hierarchy as numba arrays, and a report for every read
that returns a value other than the latest write (a stale read), like a race detector.

State (one tuple `W`, built by `weak_state.py`; arrays of one element when the mode is off):
  OPT int64 [OPT_FIELDS]: on, fail on the first stale read, flag-first completion, reports.
  GEO int64 [waves, 3]: the wave's L2 (device x XCD), vector L1 (CU) and scalar cache (CU pair).
  LB / LT int64 [allocations]: first tracked line, memory type (untracked, RW, UC).
  MEM uint8 [bytes]: what memory holds; BUFS keeps the sequentially consistent latest bytes.
  L2D / L2M uint8 [L2s, bytes]: each L2's line data and dirty bytes; L2F int64 [L2s, lines]:
  the row that filled a line (ABSENT: not held; PRELAUNCH). L1D / L1F and KD / KF the same for
  vector L1s and scalar caches (no dirty state: write-through / read-only).
  WR int64 [bytes, 3]: the latest writer's wave and row, and its stores not yet complete.
  Q int64 [waves, QCAP, 4]: the wave's incomplete stores (a byte each) and write-backs, a ring;
  QN int64 [waves, 3]: ring head, length, vector memory instructions issued.
  REP int64 [REPORTS, REP_FIELDS]: the first stale reads.

The rules read LLVM AMDGPUUsage "Memory Model GFX942" (gfx950 follows it) operationally; each
names its table row. What is not modelled: docs/emulator.md "Weak memory".
"""

from __future__ import annotations

import numpy as np

from .jit_cache import njit

LINE = 128  # bytes of an L2 / L1 line (AMDGPUUsage "Memory Model GFX942": 128-byte cache lines)
ABSENT, PRELAUNCH = -2, -1
UNTRACKED, RW, UC = range(3)
O_ON, O_FAIL, O_FLAG_FIRST, O_COUNT = range(4)
OPT_FIELDS = 4
Q_STORE, Q_THROUGH, Q_WBL2 = range(3)
QCAP = 16384
REPORTS = 64
# REP fields: reader wave and row, address byte, allocation, value read, latest value, writer wave
# and row, where the fresh value was (WHERE_*), its XCD / cache index, the stale copy's fill row.
(R_WAVE, R_ROW, R_OFFSET, R_ALLOC, R_READ, R_LATEST, R_WRITER, R_WROW, R_WHERE, R_PLACE, R_FILL,
 R_SOURCE) = range(12)
REP_FIELDS = 12
W_REP = 13  # the reports' place in the state tuple
WHERE_QUEUED, WHERE_DIRTY, WHERE_FILLED = range(3)
SRC_MEMORY, SRC_L2, SRC_L1, SRC_SCALAR = range(4)


@njit(cache=True)
def fill_l2(W, x, ln, row):
    """Copy a line from memory into L2 x, clean."""
    MEM, L2D, L2M, L2F = W[3], W[4], W[5], W[6]
    a = ln * LINE
    L2D[x, a:a + LINE] = MEM[a:a + LINE]
    L2M[x, a:a + LINE] = 0
    L2F[x, ln] = row


@njit(cache=True)
def write_back(W, x, ln):
    """Write L2 x's dirty bytes of a line to memory."""
    MEM, L2D, L2M = W[3], W[4], W[5]
    a = ln * LINE
    for b in range(a, a + LINE):
        if L2M[x, b]:
            MEM[b] = L2D[x, b]
            L2M[x, b] = 0


@njit(cache=True)
def probe(W, keep, ln):
    """A write reached memory: every other L2 drops the line, writing back its dirty bytes first
    (AMDGPUUsage GFX942: "writes from other L2s' CUs probe local lines"; RW lines "will never be
    stale in L2 due to the memory probes")."""
    L2F = W[6]
    for x in range(L2F.shape[0]):
        if x != keep and L2F[x, ln] != ABSENT:
            write_back(W, x, ln)
            L2F[x, ln] = ABSENT


@njit(cache=True)
def complete(W, w, slot):
    """One queued entry of wave w takes effect."""
    GEO, MEM, L2D, L2M, L2F, L1D, L1F, WR, Q = W[1], W[3], W[4], W[5], W[6], W[7], W[8], W[10], W[11]
    x, cu = GEO[w, 0], GEO[w, 1]
    kind, b = Q[w, slot, 0], Q[w, slot, 1]
    if kind == Q_WBL2:
        # buffer_wbl2 sc1 / sc0 sc1: "write back dirty L2 lines" of this XCD (table rows "fence
        # release" / "store atomic release", agent and system scope).
        for ln in range(L2F.shape[1]):
            if L2F[x, ln] != ABSENT and L2M[x, ln * LINE:(ln + 1) * LINE].any():
                write_back(W, x, ln)
                probe(W, x, ln)
        return
    value, ln = np.uint8(Q[w, slot, 2]), b >> 7
    WR[b, 2] -= 1
    if L1F[cu, ln] != ABSENT:  # the vector L1 is write-through: a present line is updated
        L1D[cu, b] = value
    if kind == Q_THROUGH:  # sc1 / sc0 sc1 store, or a UC line: written through to memory
        probe(W, x, ln)
        MEM[b] = value
        if L2F[x, ln] != ABSENT:
            L2D[x, b] = value
            L2M[x, b] = 0
        return
    # A plain store to an RW line writes back: dirty bytes in this XCD's L2 ("store monotonic").
    if L2F[x, ln] == ABSENT:
        fill_l2(W, x, ln, PRELAUNCH)
    L2D[x, b] = value
    L2M[x, b] = 1


@njit(cache=True)
def complete_until(W, w, keep):
    """Complete wave w's oldest entries until those of its last `keep` vector memory
    instructions remain (s_waitcnt vmcnt(keep): the counter decrements in issue order)."""
    Q, QN = W[11], W[12]
    while QN[w, 1] > 0:
        slot = QN[w, 0]
        if Q[w, slot, 3] > QN[w, 2] - keep:
            return
        complete(W, w, slot)
        QN[w, 0] = (slot + 1) % QCAP
        QN[w, 1] -= 1


@njit(cache=True)
def end_turn(W, w):
    """The wave leaves the scheduler: its queued entries complete, oldest first; or, with the
    flag-first option, only its newest instruction's (later stores may complete before earlier
    ones: "per-CU request queues per L2 channel reorder memory operations")."""
    Q, QN = W[11], W[12]
    if not W[0][O_FLAG_FIRST]:
        complete_until(W, w, 0)
        return
    n = QN[w, 1]
    if n == 0:
        return
    newest = Q[w, (QN[w, 0] + n - 1) % QCAP, 3]
    kept = 0
    for j in range(n):  # complete the newest instruction's entries, keep the rest in order
        slot = (QN[w, 0] + j) % QCAP
        if Q[w, slot, 3] == newest:
            complete(W, w, slot)
        else:
            target = (QN[w, 0] + kept) % QCAP
            Q[w, target] = Q[w, slot]
            kept += 1
    QN[w, 1] = kept


@njit(cache=True)
def issue(W, w):
    """A vector memory instruction of wave w issues (counted for vmcnt)."""
    W[12][w, 2] += 1


@njit(cache=True)
def enqueue(W, w, kind, b, value):
    Q, QN = W[11], W[12]
    if QN[w, 1] == QCAP:  # the queue is full: its oldest entry completes (legal at any time)
        complete(W, w, QN[w, 0])
        QN[w, 0] = (QN[w, 0] + 1) % QCAP
        QN[w, 1] -= 1
    slot = (QN[w, 0] + QN[w, 1]) % QCAP
    Q[w, slot, 0], Q[w, slot, 1], Q[w, slot, 2], Q[w, slot, 3] = kind, b, value, QN[w, 2]
    QN[w, 1] += 1


@njit(cache=True)
def store_byte(W, w, row, k, off, value, sc1):
    """A store of one byte issues: it is the latest write, queued until it completes."""
    LB, LT, WR = W[2], W[9], W[10]
    if LT[k] == UNTRACKED:
        return
    b = LB[k] * LINE + off
    WR[b, 0], WR[b, 1] = w, row
    WR[b, 2] += 1
    enqueue(W, w, Q_THROUGH if sc1 or LT[k] == UC else Q_STORE, b, value)


@njit(cache=True)
def wbl2(W, w, sc1):
    """buffer_wbl2: queued; only the agent / system scope bits (sc1) write back the L2
    (SIGfx940CacheControl::insertRelease emits `sc1` for agent, `sc0 sc1` for system)."""
    if sc1:
        enqueue(W, w, Q_WBL2, 0, 0)


@njit(cache=True)
def inv(W, w, scoped):
    """buffer_inv sc0 / sc1 / sc0 sc1 drops this CU's vector L1 (table row "fence acquire"); NC
    lines, which sc1 also drops, are not modelled (every tracked line is RW or UC)."""
    if scoped:
        W[8][W[1][w, 1], :] = ABSENT


@njit(cache=True)
def wait_vmcnt(W, w, simm16):
    """s_waitcnt: vmcnt is simm16 bits 3:0 and 15:14 on gfx9."""
    complete_until(W, w, (simm16 & 0xF) | (simm16 >> 14 & 3) << 4)


@njit(cache=True)
def atomic(W, w, row, k, off, size, value):
    """An RMW atomic is performed at memory ("atomicrmw": RMW atomics bypass L1): every L2 gives
    up the line (dirty bytes written back) and the result is written through."""
    LB, MEM, LT, WR = W[2], W[3], W[9], W[10]
    if LT[k] == UNTRACKED:
        return
    b = LB[k] * LINE + off
    probe(W, -1, b >> 7)
    for j in range(size):
        MEM[b + j] = value >> (8 * j) & 0xFF
        WR[b + j, 0], WR[b + j, 1] = w, row


@njit(cache=True)
def report(W, w, row, k, off, got, latest, b, where, place, fill, source):
    OPT, REP, WR = W[0], W[13], W[10]
    n = OPT[O_COUNT]
    if n < REP.shape[0]:
        REP[n, R_WAVE], REP[n, R_ROW], REP[n, R_OFFSET], REP[n, R_ALLOC] = w, row, off, k
        REP[n, R_READ], REP[n, R_LATEST], REP[n, R_WRITER], REP[n, R_WROW] = got, latest, WR[b, 0], WR[b, 1]
        REP[n, R_WHERE], REP[n, R_PLACE], REP[n, R_FILL], REP[n, R_SOURCE] = where, place, fill, source
    OPT[O_COUNT] = n + 1


@njit(cache=True)
def load(W, w, row, k, off, size, latest, sc1, scalar):
    """The value a load of `size` bytes returns, filling the caches on its way; a stale read is
    reported. Plain / sc0 loads: L1, else the XCD's L2, else memory, filling both ("load
    monotonic" workgroup / agent rows); sc1 loads skip L1 and may hit an RW line in L2 (probes
    keep it fresh); scalar loads: the CU pair's scalar cache, which no memory-model sequence
    invalidates (the CP does between launches); UC lines are read at memory."""
    GEO, LB, MEM, L2D, L2M, L2F, L1D, L1F, KD, KF, LT, WR = (W[1], W[2], W[3], W[4], W[5], W[6], W[7], W[8], W[14],
                                                             W[15], W[9], W[10])
    if LT[k] == UNTRACKED:
        return latest
    x, cu, kc = GEO[w, 0], GEO[w, 1], GEO[w, 2]
    b0 = LB[k] * LINE + off
    got = np.int64(0)
    stale = -1
    source, fill = SRC_MEMORY, PRELAUNCH
    for j in range(size):
        b = b0 + j
        ln = b >> 7
        want = latest >> (8 * j) & 0xFF
        writer = WR[b, 0]
        if writer >= 0 and GEO[writer, 1] == cu:
            v = want  # the CU's own pipeline is in order: workgroup scope needs no cache action
        elif LT[k] == UC:
            v = np.int64(MEM[b])
            source = SRC_MEMORY
        elif scalar:
            if KF[kc, ln] == ABSENT:
                if L2F[x, ln] == ABSENT:
                    fill_l2(W, x, ln, row)
                KD[kc, ln * LINE:(ln + 1) * LINE] = L2D[x, ln * LINE:(ln + 1) * LINE]
                KF[kc, ln] = row
            v, source, fill = np.int64(KD[kc, b]), SRC_SCALAR, KF[kc, ln]
        elif not sc1 and L1F[cu, ln] != ABSENT:
            v, source, fill = np.int64(L1D[cu, b]), SRC_L1, L1F[cu, ln]
        else:
            if L2F[x, ln] == ABSENT:
                fill_l2(W, x, ln, row)
            v, source, fill = np.int64(L2D[x, b]), SRC_L2, L2F[x, ln]
            if not sc1:
                L1D[cu, ln * LINE:(ln + 1) * LINE] = L2D[x, ln * LINE:(ln + 1) * LINE]
                L1F[cu, ln] = row
        got |= v << (8 * j)
        # A coherent read (sc1, UC) of a byte whose latest store is still queued is early, not
        # stale: that is what a poll is for. Any other difference is stale.
        if v != want and stale < 0 and not (WR[b, 2] > 0 and (sc1 or LT[k] == UC)):
            stale = j
    if stale >= 0:
        b = b0 + stale
        if WR[b, 2] > 0:
            report(W, w, row, k, off, got, latest, b, WHERE_QUEUED, WR[b, 0], fill, source)
        else:
            dirty = -1
            for y in range(L2F.shape[0]):
                if L2F[y, b >> 7] != ABSENT and L2M[y, b]:
                    dirty = y
            if dirty >= 0:
                report(W, w, row, k, off, got, latest, b, WHERE_DIRTY, dirty, fill, source)
            else:
                report(W, w, row, k, off, got, latest, b, WHERE_FILLED, x, fill, source)
    return got
