"""The clock's event trace: what the functional run records, one instruction at a time, for the
timing pass (`timing.py`) to replay in modelled time.

Compute instructions fold into per-wave counts (plain issue slots, transcendentals, `s_nop`
wait states, MFMAs by variant) that the next event carries; an event is a memory access (vector,
scalar, LDS), an `s_waitcnt`, `s_barrier`, `s_sleep`, `buffer_wbl2` / `buffer_inv`, a clock read
or `s_endpgm`. A memory event keeps its 128-byte lines by the level that serves them (the
first touch of a line comes from HBM, a line its XCD read or wrote before from that XCD's L2, a
line only other XCDs hold from the Infinity Cache), its bytes, its allocation, and for a load
the last writer from another wave of any word it read (that writer's event index). An LDS event
keeps its bank-conflict passes (64 banks of 4 bytes), computed from the lanes' real addresses.

A load followed by `s_sleep` with no store or barrier between is a failed poll: both are
flagged, so that the timing pass drops the iterations in which a spinner saw stale data (their
number is an artefact of the order the emulator ran the waves in).

Nothing here depends on a parameter of `params.py`: a calibration sweep reruns only the timing
pass. The recorder is off (one branch per instruction) unless `Machine.clock` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ops as O
from ..access import ds_address, ds_shape, scalar_address, scalar_dwords, vector_shape
from ..decode import (F_BASE, F_CLASS, F_FLAGS, F_FORMAT, F_OFFSET, F_OFFSET1, F_SOFF, F_SRC0, FLAG_OFFEN,
                      FLAG_SADDR_OFF)
from ..jit_cache import njit
from ..memory import find
from ..state import M32, WS_CTA, WS_DEVICE

# Event fields (int64 rows).
(E_WAVE, E_KIND, E_PC, E_PLAIN, E_TRANS, E_NOPS, E_NOP_STATES, E_MFMA_F8, E_MFMA_F4, E_MFMA_F32, E_MFMA_BF16,
 E_MFMA_BF16_K16, E_HBM, E_MALL, E_L2, E_BYTES, E_WRITER, E_ARG, E_FLAGS, E_ALLOC) = range(20)
FIELDS = 20
FOLDED = (E_PLAIN, E_TRANS, E_NOPS, E_NOP_STATES, E_MFMA_F8, E_MFMA_F4, E_MFMA_F32, E_MFMA_BF16, E_MFMA_BF16_K16)

# Event kinds.
(K_VLOAD, K_VSTORE, K_ATOMIC, K_SLOAD, K_CLOCK, K_LDS, K_WAITCNT, K_BARRIER, K_SLEEP, K_WBL2, K_INV,
 K_END) = range(12)
KIND_NAMES = ("vector load", "vector store", "atomic", "scalar load", "clock read", "lds", "s_waitcnt",
              "s_barrier", "s_sleep", "buffer_wbl2", "buffer_inv", "s_endpgm")

# E_FLAGS bits.
FAILED_POLL = 1

# The recorder's control fields (TR[0]).
R_ON, R_COUNT, R_OVERFLOW = range(3)
# Per-wave accumulators (TR[2]): the folded counts, then the wave's last load since a store.
A_LAST_LOAD = len(FOLDED)
A_FIELDS = A_LAST_LOAD + 1

LINE = 128
XCDS = 8
BANKS = 64  # gfx950 LDS: 64 banks of 4 bytes (Modular's make_mma_swizzle doc; Chips and Cheese CDNA4)
TRANS_OPS = tuple(O.op_id(name) for name in ("V_EXP_F32", "V_LOG_F32", "V_RCP_F32", "V_RCP_IFLAG_F32", "V_SQRT_F32",
                                             "V_RSQ_F32"))
FP8_FORMATS = 1  # cbsz / blgp 0 (FP8) and 1 (BF8): the scaled MFMA runs its 8-pass variant


@dataclass(frozen=True)
class Clock:
    """Options of the clock's recorder. `events`: the most events a launch may record (a row is
    160 bytes); past it the launch still runs and its trace is marked overflowed."""

    events: int = 1 << 20

    def __post_init__(self) -> None:
        if self.events < 1:
            raise ValueError(f"events={self.events}: expected a positive count")


@dataclass
class Trace:
    """One launch's recorded events and the placement the timing pass needs."""

    events: np.ndarray  # int64 [n, FIELDS]
    cta: np.ndarray  # per wave: workgroup
    device: np.ndarray  # per wave
    wave_in_cta: np.ndarray  # per wave
    overflowed: bool


def off_state() -> tuple:
    """The tuple the interpreter takes when the clock is off (R_ON is 0; nothing else is read)."""
    return _arrays(np.zeros(4, np.int64), 1, 1, [0], [False], np.zeros(1, np.int64))


def build(options: Clock, sizes: list[int], writable: list[bool], waves: int, xcd_bits: np.ndarray) -> tuple:
    """The recorder's arrays for a launch: for each allocation's 128-byte lines a state word
    (bit 8 d + x: the line is in device d's XCD x's L2) and, for each 4 bytes of a writable
    one, the event that last stored there (-1: none); flat, allocation k's from LOFF[k] /
    WOFF[k] (numba reads flat arrays much faster than a list of them)."""
    ctl = np.zeros(4, np.int64)
    ctl[R_ON] = 1
    return _arrays(ctl, options.events, waves, sizes, writable, xcd_bits)


def _arrays(ctl: np.ndarray, events: int, waves: int, sizes: list[int], writable: list[bool],
            xcd_bits: np.ndarray) -> tuple:
    line_counts = [-(-size // LINE) for size in sizes] or [0]
    word_counts = [-(-size // 4) if w else 0 for size, w in zip(sizes, writable)] or [0]
    loff = np.concatenate(([0], np.cumsum(line_counts))).astype(np.int64)
    woff = np.concatenate(([0], np.cumsum(word_counts))).astype(np.int64)
    acc = np.zeros((max(waves, 1), A_FIELDS), np.int64)
    acc[:, A_LAST_LOAD] = -1
    return (ctl, np.zeros((events, FIELDS), np.int64), acc, np.zeros(max(int(loff[-1]), 1), np.uint64),
            np.full(max(int(woff[-1]), 1), -1, np.int64), xcd_bits, loff, woff)


def collect(TR: tuple, WS: np.ndarray, ctas_first_wave: np.ndarray) -> Trace:
    """The recorded events of a finished launch, with each wave's placement."""
    ctl, ev = TR[0], TR[1]
    cta = WS[:, WS_CTA].copy()
    return Trace(events=ev[:ctl[R_COUNT]].copy(), cta=cta, device=WS[:, WS_DEVICE].copy(),
                 wave_in_cta=np.arange(len(cta)) - ctas_first_wave[cta], overflowed=bool(ctl[R_OVERFLOW]))


@njit(cache=True)
def _new_event(TR, w, kind, i):
    """Append an event for wave w carrying its folded counts; -1 when the trace is full."""
    ctl, ev, acc = TR[0], TR[1], TR[2]
    n = ctl[R_COUNT]
    if n >= ev.shape[0]:
        ctl[R_OVERFLOW] = 1
        return -1
    for f in range(ev.shape[1]):
        ev[n, f] = 0
    ev[n, E_WAVE] = w
    ev[n, E_KIND] = kind
    ev[n, E_PC] = i
    for k in range(len(FOLDED)):
        ev[n, FOLDED[k]] = acc[w, k]
        acc[w, k] = 0
    ev[n, E_WRITER] = -1
    ev[n, E_ALLOC] = -1
    ctl[R_COUNT] = n + 1
    return n


@njit(cache=True)
def _touch_line(ev, e, state, line, bit, storing):
    """Count line state `line` at the level that serves it (the reader's L2, else its device's
    Infinity Cache when another XCD of the device holds it, else HBM) and mark it in the
    reader's L2; a store leaves it in the writer's L2 only."""
    held = state[line]
    mine = np.uint64(1) << np.uint64(bit)
    device = np.uint64(0xFF) << np.uint64(bit - bit % XCDS)  # the reader's device's XCDs: its own MALL
    if held & mine:
        ev[e, E_L2] += 1
    elif held & device:
        ev[e, E_MALL] += 1
    else:
        ev[e, E_HBM] += 1
    state[line] = mine if storing else held | mine


@njit(cache=True)
def _lane_address(P, i, w, S, V, lane, base, soffset):
    """The byte address lane `lane` of a MUBUF / global instruction reaches (as `memory.vmem`)."""
    flags = P[i, F_FLAGS]
    if P[i, F_CLASS] == O.BUFFER:
        offset = (np.int64(V[w, P[i, F_SRC0], lane]) if flags & FLAG_OFFEN else 0) + soffset + P[i, F_OFFSET]
        return base + (offset & M32)
    if flags & FLAG_SADDR_OFF:
        return (np.int64(V[w, P[i, F_SRC0], lane]) | np.int64(V[w, P[i, F_SRC0] + 1, lane]) << 32) + P[i, F_OFFSET]
    b = P[i, F_BASE]
    return (np.int64(S[w, b]) | np.int64(S[w, b + 1]) << 32) + np.int64(V[w, P[i, F_SRC0], lane]) + P[i, F_OFFSET]


@njit(cache=True)
def _words(ev, e, writers, woff, ALLOC, k, address, size, w, storing, loading):
    """Stamp the 4-byte words a store reaches with event e; for a load keep the latest writer
    from another wave (allocation k's last-writer words start at woff[k])."""
    if not ALLOC[k, 2] & 1:  # read-only: no writer
        return
    first = woff[k] + ((address - ALLOC[k, 0]) >> 2)
    last = woff[k] + ((address - ALLOC[k, 0] + size - 1) >> 2)
    for g in range(first, min(last + 1, woff[k + 1])):
        if loading:
            s = writers[g]
            if s >= 0 and ev[s, E_WAVE] != w and s > ev[e, E_WRITER]:
                ev[e, E_WRITER] = s
        if storing:
            writers[g] = e


@njit(cache=True)
def _vector(TR, P, i, w, S, V, ALLOC, ex, op, bit):
    size, dwords, _, storing, atomic = vector_shape(op, P[i, F_CLASS])
    size *= dwords
    kind = K_ATOMIC if atomic else K_VSTORE if storing else K_VLOAD
    e = _new_event(TR, w, kind, i)
    if e < 0:
        return e
    ev = TR[1]
    base, soffset = np.int64(0), np.int64(0)
    if P[i, F_CLASS] == O.BUFFER:
        r = P[i, F_BASE]
        base = np.int64(S[w, r]) | (np.int64(S[w, r + 1]) & 0xFFFF) << 32
        soffset = np.int64(S[w, P[i, F_SOFF]]) if 0 <= P[i, F_SOFF] < 106 else np.int64(0)
    seen = np.empty(128, np.int64)
    n_seen = 0
    k = -1
    state, writers, loff, woff = TR[3], TR[4], TR[6], TR[7]
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        address = _lane_address(P, i, w, S, V, lane, base, soffset)
        if k < 0 or not (ALLOC[k, 0] <= address < ALLOC[k, 0] + ALLOC[k, 1]):
            k = find(ALLOC, address, 1, -1)
            if k < 0:
                continue
        if ev[e, E_ALLOC] < 0:
            ev[e, E_ALLOC] = k
        ev[e, E_BYTES] += size
        _words(ev, e, writers, woff, ALLOC, k, address, size, w, storing, not storing or atomic)
        for line in ((address - ALLOC[k, 0]) // LINE, (address - ALLOC[k, 0] + size - 1) // LINE):
            key = k << 40 | line
            new = n_seen == 0 or seen[n_seen - 1] != key
            if new:
                for s in range(n_seen - 1):
                    if seen[s] == key:
                        new = False
                        break
            if new and n_seen < 128:
                seen[n_seen] = key
                n_seen += 1
                _touch_line(ev, e, state, loff[k] + line, bit, storing and not atomic)
    return e


@njit(cache=True)
def _scalar(TR, P, i, w, S, ALLOC, op, bit):
    if op == O.OP_S_MEMREALTIME or op == O.OP_S_MEMTIME:
        return _new_event(TR, w, K_CLOCK, i)
    n = scalar_dwords(op)
    e = _new_event(TR, w, K_SLOAD, i)
    if e < 0:
        return e
    address = scalar_address(P, i, w, S)
    k = find(ALLOC, address, 1, -1)
    if k >= 0:
        ev = TR[1]
        ev[e, E_ALLOC] = k
        ev[e, E_BYTES] = 4 * n
        _words(ev, e, TR[4], TR[7], ALLOC, k, address, 4 * n, w, False, True)
        first = (address - ALLOC[k, 0]) // LINE
        for line in range(first, (address - ALLOC[k, 0] + 4 * n - 1) // LINE + 1):
            _touch_line(ev, e, TR[3], TR[6][k] + line, bit, False)
    return e


@njit(cache=True)
def _lds(TR, P, i, w, V, ex, op):
    """An LDS event with its bytes and its bank-conflict passes: the most distinct dwords any
    one bank serves (one dword broadcast to several lanes is one access)."""
    e = _new_event(TR, w, K_LDS, i)
    if e < 0:
        return e
    n, two, stride = ds_shape(op)
    off0, off1 = P[i, F_OFFSET], P[i, F_OFFSET1]
    dwords = np.empty(64 * 8, np.int64)
    m = 0
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        a = np.int64(V[w, P[i, F_SRC0], lane])
        for half in range(2 if two else 1):
            if op == O.OP_DS_SWIZZLE_B32 or op == O.OP_DS_BPERMUTE_B32:
                at = np.int64(4 * lane)  # lane traffic through the LDS crossbar, conflict-free
            else:
                at = ds_address(a, off0, off1, half, two, stride)
            for part in range(n):
                dwords[m] = (at >> 2) + part
                m += 1
    count = np.zeros(BANKS, np.int64)
    if m:
        for dword in np.unique(dwords[:m]):
            count[dword % BANKS] += 1
    ev = TR[1]
    ev[e, E_BYTES] = 4 * m
    ev[e, E_ARG] = max(count.max(), 1)
    return e


@njit(cache=True)
def record(TR, P, i, w, S, V, ALLOC, ex, op, klass):
    """Record instruction row i of wave w before it runs (its operands are still the ones it
    reads): fold a compute instruction, append an event for anything else."""
    acc = TR[2]
    if klass == O.MFMA:
        if op == O.OP_V_MFMA_SCALE_F32_16X16X128_F8F6F4:
            fmt = P[i, F_FORMAT]
            f8 = (fmt & 0xF) <= FP8_FORMATS or (fmt >> 4) <= FP8_FORMATS
            acc[w, 4 if f8 else 5] += 1
        elif op == O.OP_V_MFMA_F32_16X16X4_F32:
            acc[w, 6] += 1
        elif op == O.OP_V_MFMA_F32_16X16X32_BF16:
            acc[w, 7] += 1
        else:
            acc[w, 8] += 1
        return
    if klass == O.SYNC:
        e = -1
        if op == O.OP_S_NOP:
            acc[w, 2] += 1
            acc[w, 3] += (P[i, F_OFFSET] & 0xF) + 1
        elif op == O.OP_S_WAITCNT:
            e = _new_event(TR, w, K_WAITCNT, i)
            if e >= 0:
                imm = P[i, F_OFFSET]
                TR[1][e, E_ARG] = (imm & 0xF | (imm >> 14 & 3) << 4) | (imm >> 8 & 0xF) << 8
        elif op == O.OP_S_BARRIER:
            e = _new_event(TR, w, K_BARRIER, i)
            acc[w, A_LAST_LOAD] = -1
        elif op == O.OP_S_SLEEP:
            e = _new_event(TR, w, K_SLEEP, i)
            if e >= 0:
                TR[1][e, E_ARG] = P[i, F_OFFSET] & 0x7F
                poll = acc[w, A_LAST_LOAD]
                if poll >= 0:
                    TR[1][poll, E_FLAGS] |= FAILED_POLL
                    TR[1][e, E_FLAGS] |= FAILED_POLL
            acc[w, A_LAST_LOAD] = -1
        else:  # s_trap
            acc[w, 0] += 1
        return
    if klass == O.BRANCH and op == O.OP_S_ENDPGM:
        _new_event(TR, w, K_END, i)
        return
    device_xcd = TR[5][w]
    if klass == O.SMEM:
        e = _scalar(TR, P, i, w, S, ALLOC, op, device_xcd)
        if e >= 0 and TR[1][e, E_KIND] == K_SLOAD:
            acc[w, A_LAST_LOAD] = e
        return
    if klass == O.BUFFER or klass == O.GLOBAL or klass == O.ATOMIC:
        e = _vector(TR, P, i, w, S, V, ALLOC, ex, op, device_xcd)
        if e >= 0:
            acc[w, A_LAST_LOAD] = e if TR[1][e, E_KIND] == K_VLOAD else -1
        return
    if klass == O.LDS or op == O.OP_DS_SWIZZLE_B32 or op == O.OP_DS_BPERMUTE_B32:
        _lds(TR, P, i, w, V, ex, op)
        return
    if klass == O.CACHE:
        _new_event(TR, w, K_WBL2 if op == O.OP_BUFFER_WBL2 else K_INV, i)
        return
    if klass == O.VALU:
        for t in TRANS_OPS:
            if op == t:
                acc[w, 1] += 1
                return
    acc[w, 0] += 1  # SALU, branch, VALU, packed, convert, crosslane, scratch: one issue slot
