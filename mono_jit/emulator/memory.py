"""Memory seen from a wave: the registered allocations (find, load, store, the weights' touched
granules), and the instructions that reach them: MUBUF and global loads, stores and atomics
(`vmem`), architected flat scratch (`scratch`) and scalar loads and clocks (`smem`)."""

from __future__ import annotations

import numpy as np

from . import ops as O
from .decode import (F_BASE, F_CLASS, F_DST, F_FLAGS, F_OFFSET, F_SOFF, F_SRC0, F_SRC1, FLAG_OFFEN, FLAG_SADDR_OFF,
                     FLAG_SC0, FLAG_SC1, FLAG_SVE)
from .access import scalar_address, scalar_dwords, vector_shape
from .jit_cache import njit
from .numerics import sext32
from .operands import fault, set64, sval
from . import weak
from .state import (C_EPOCH, C_STORES, CNT_READ, CNT_WRITTEN, FAULT_OPERAND, FAULT_PRIVATE, FAULT_READ_ONLY,
                    FAULT_STALE, FAULT_UNALIGNED, FAULT_WEAK_FULL, FAULT_UNMAPPED, KIND_BUFFER, KIND_GLOBAL, KIND_SCALAR, M32, N_CLASSES, NO_FAULT,
                    TICKS_PER_INSTRUCTIONS, WS_POLL, WS_PRIVATE, WS_SCRATCH)


@njit(cache=True)
def find(ALLOC, address, size, hint):
    """Index of the allocation holding [address, address + size), or -1."""
    if hint >= 0 and ALLOC[hint, 0] <= address and address + size <= ALLOC[hint, 0] + ALLOC[hint, 1]:
        return hint
    lo, hi = 0, ALLOC.shape[0]
    while lo < hi:  # the last allocation whose base <= address
        mid = (lo + hi) // 2
        if ALLOC[mid, 0] <= address:
            lo = mid + 1
        else:
            hi = mid
    k = lo - 1
    if k >= 0 and address + size <= ALLOC[k, 0] + ALLOC[k, 1]:
        return k
    return -1


@njit(cache=True)
def load(BUFS, ALLOC, k, address, size):
    """`size` (1, 2 or 4) little-endian bytes at `address` in allocation k."""
    b = BUFS[k]
    off = address - ALLOC[k, 0]
    v = np.int64(b[off])
    if size > 1:
        v |= np.int64(b[off + 1]) << 8
    if size > 2:
        v |= np.int64(b[off + 2]) << 16 | np.int64(b[off + 3]) << 24
    return v


@njit(cache=True)
def store(BUFS, ALLOC, k, address, size, value):
    b = BUFS[k]
    off = address - ALLOC[k, 0]
    for i in range(size):
        b[off + i] = value >> (8 * i) & 0xFF


@njit(cache=True)
def touch(TOUCH, ALLOC, k, address, size):
    """Mark the 4-byte granules of a weight allocation that a read reached."""
    if ALLOC[k, 2] & 2:
        t = TOUCH[k]
        first = (address - ALLOC[k, 0]) >> 2
        last = (address - ALLOC[k, 0] + size - 1) >> 2
        for g in range(first, last + 1):
            t[g] = 1


@njit(cache=True)
def vmem(P, i, w, S, V, T, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, d, ex, op, W):
    """MUBUF and global loads, stores and atomics for every active lane; through the caches of
    `weak.py` when its mode is on."""
    flags = P[i, F_FLAGS]
    weak_on = W[0][weak.O_ON] != 0
    sc1 = flags & FLAG_SC1 != 0
    if weak_on:
        weak.issue(W, w)
    is_buffer = P[i, F_CLASS] == O.BUFFER
    kind = KIND_BUFFER if is_buffer else KIND_GLOBAL
    size, dwords, signed, storing, atomic = vector_shape(op, P[i, F_CLASS])
    dst = P[i, F_DST]
    data = dst if is_buffer else P[i, F_SRC1]
    # Buffer resource (V#): base 48 bits, stride (bits 48..61), num_records (dword 2). Ours are
    # raw (stride 0, no idxen), so a dword is out of range when offset + 4 > num_records
    # (CDNA3/CDNA4 ISA "Buffer addressing: range checking" for raw buffers): loads give 0 and
    # stores are dropped, checked per dword.
    base, records, soffset = np.int64(0), np.int64(0), np.int64(0)
    if is_buffer:
        r = P[i, F_BASE]
        base = (np.int64(S[w, r]) | (np.int64(S[w, r + 1]) & 0xFFFF) << 32)
        if (np.int64(S[w, r + 1]) >> 16) & 0x3FFF:
            return fault(CTL, FAULT_OPERAND, w, i, -1, base, 0, 1)  # strided buffers are not modelled
        records = np.int64(S[w, r + 2])
        soffset = sval(S, w, P[i, F_SOFF], 0, False)
    # The instruction's fields and the scalar base read once; the byte counts and the polled
    # address gathered in locals and written once per allocation and instruction (a fault
    # ends the launch, whose counters are then never reported).
    vaddr, immediate, offen = P[i, F_SRC0], P[i, F_OFFSET], flags & FLAG_OFFEN != 0
    vaddr_only = flags & FLAG_SADDR_OFF != 0
    saddr = np.int64(0)
    if not is_buffer and not vaddr_only:
        b = P[i, F_BASE]
        saddr = np.int64(S[w, b]) | np.int64(S[w, b + 1]) << 32
    column = 2 * kind + (1 if storing else 0)
    pending, moved, poll = np.int64(0), np.int64(0), np.int64(-1)
    hint = -1
    mem, touched, weight = BUFS[0], TOUCH[0], 0
    stored = False
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        if is_buffer:
            offset = (np.int64(V[w, vaddr, lane]) if offen else 0) + soffset + immediate
            offset &= M32
            address = base + offset
        elif vaddr_only:
            address = (np.int64(V[w, vaddr, lane]) | np.int64(V[w, vaddr + 1, lane]) << 32) + immediate
        else:
            address = saddr + np.int64(V[w, vaddr, lane]) + immediate
        if atomic:
            if address & 3:
                return fault(CTL, FAULT_UNALIGNED, w, i, lane, address, 4, 0)
            k = find(ALLOC, address, 4, hint)
            if k < 0:
                return fault(CTL, FAULT_UNMAPPED, w, i, lane, address, 4, 0)
            if not ALLOC[k, 2] & 1:
                return fault(CTL, FAULT_READ_ONLY, w, i, lane, address, 4, 0)
            hint = k
            old = load(BUFS, ALLOC, k, address, 4)
            operand = np.int64(V[w, data, lane])
            if op == O.OP_GLOBAL_ATOMIC_ADD:
                new = (old + operand) & M32
            elif op == O.OP_GLOBAL_ATOMIC_OR:
                new = old | operand
            elif op == O.OP_GLOBAL_ATOMIC_SWAP:
                new = operand
            elif op == O.OP_GLOBAL_ATOMIC_CMPSWAP:  # DATA = {src, cmp}
                new = operand if old == np.int64(V[w, data + 1, lane]) else old
            elif op == O.OP_GLOBAL_ATOMIC_UMAX:
                new = max(old, operand)
            else:  # GLOBAL_ATOMIC_SMAX
                new = old if sext32(old) >= sext32(operand) else operand
            store(BUFS, ALLOC, k, address, 4, new)
            if weak_on and not weak.atomic(W, BUFS[k], ALLOC[k, 1], w, i, k, address - ALLOC[k, 0], 4, new):
                return fault(CTL, FAULT_WEAK_FULL, w, i, lane, address, 4, 0)
            if flags & FLAG_SC0:  # returns the old value
                V[w, dst, lane] = old
            ABYTES[k, 2 * kind] += 4
            ABYTES[k, 2 * kind + 1] += 4
            stored = True
            continue
        nbytes = size * dwords
        # Raw buffers check each dword: offset + 4 part + size > records is out of range. The
        # offsets grow with the part, so the parts in range are a prefix of the access.
        parts = dwords
        if is_buffer:
            parts = 0
            while parts < dwords and offset + 4 * parts + size <= records:
                parts += 1
            if not storing:
                for part in range(parts, dwords):
                    V[w, dst + part, lane] = 0
            if parts == 0:
                continue
        span = 4 * (parts - 1) + size
        k = find(ALLOC, address, span, hint)
        if k < 0:  # report the first part outside every allocation
            at = address
            for part in range(parts):
                at = address + 4 * part
                if find(ALLOC, at, size, -1) < 0:
                    break
            return fault(CTL, FAULT_UNMAPPED, w, i, lane, at, nbytes, 0)
        if k != hint:  # the allocation's bytes, fetched from the list once per allocation
            if hint >= 0:
                ABYTES[hint, column] += pending
            pending = 0
            hint, mem, weight = k, BUFS[k], ALLOC[k, 2] & 2
            if weight:
                touched = TOUCH[k]
        off = address - ALLOC[k, 0]
        if storing:
            if not ALLOC[k, 2] & 1:
                return fault(CTL, FAULT_READ_ONLY, w, i, lane, address, nbytes, 0)
            # the weak mode copies a line it meets for the first time: before the store
            if weak_on and not weak.store_lane(W, mem, ALLOC[k, 1], V, w, i, k, off, data, parts, size, lane, sc1):
                return fault(CTL, FAULT_WEAK_FULL, w, i, lane, address, nbytes, 0)
            for part in range(parts):
                value = np.int64(V[w, data + part, lane])
                for byte in range(size):
                    mem[off + 4 * part + byte] = value >> (8 * byte) & 0xFF
            pending += size * parts
            moved += size * parts
            stored = True
            continue
        for part in range(parts):
            at = off + 4 * part
            v = np.int64(mem[at])
            if size > 1:
                v |= np.int64(mem[at + 1]) << 8
            if size > 2:
                v |= np.int64(mem[at + 2]) << 16 | np.int64(mem[at + 3]) << 24
            if signed:
                v = (v - (1 << (8 * size)) if v >> (8 * size - 1) & 1 else v) & M32
            V[w, dst + part, lane] = v
        if weak_on:  # the values the caches hold replace the latest ones
            part = weak.load_lane(W, mem, ALLOC[k, 1], V, w, i, k, off, dst, parts, size, signed, lane, sc1)
            if part == weak.FULL:
                return fault(CTL, FAULT_WEAK_FULL, w, i, lane, address, nbytes, 0)
            if part >= 0 and W[0][weak.O_FAIL]:
                return fault(CTL, FAULT_STALE, w, i, lane, address + 4 * part, size, 0)
        poll = address + 4 * (parts - 1)
        if weight:  # the 4-byte granules the read reached
            for granule in range(off >> 2, ((off + span - 1) >> 2) + 1):
                touched[granule] = 1
        pending += size * parts
        moved += size * parts
    if hint >= 0 and not atomic:
        ABYTES[hint, column] += pending
    CNT[d, CNT_WRITTEN if storing else CNT_READ] += moved
    if poll >= 0:
        WS[w, WS_POLL] = poll
    if stored:
        CTL[C_EPOCH] += 1
        CTL[C_STORES] += 1
    return NO_FAULT


@njit(cache=True)
def scratch(P, i, w, S, V, WS, ALLOC, BUFS, ABYTES, CNT, CTL, d, ex, op):
    """SCRATCH_LOAD / STORE_DWORD(X2-4), architected flat scratch (gfx940+): each lane reads and
    writes its own private segment of `WS_PRIVATE` bytes, at the private address SADDR (unless
    off) + VADDR (when SVE) + the signed offset (CDNA4 pseudocode CalcScratchAddr; LLVM
    AMDGPUUsage "Memory Spaces": private memory is per work-item, reached by the scratch
    instructions through the wave's hardware scratch base). The hardware interleaves the lanes'
    dwords in the wave's backing memory; no scratch instruction can observe that, so here lane
    `l` of the wave owns bytes [l P, (l + 1) P) of its block at WS_SCRATCH. An access past the
    segment (or any, when the launch has none) faults (FAULT_PRIVATE)."""
    private, block = WS[w, WS_PRIVATE], WS[w, WS_SCRATCH]
    flags = P[i, F_FLAGS]
    storing = op >= O.OP_SCRATCH_STORE_DWORD
    dwords = op - (O.OP_SCRATCH_STORE_DWORD if storing else O.OP_SCRATCH_LOAD_DWORD) + 1
    saddr = 0 if flags & FLAG_SADDR_OFF else np.int64(S[w, P[i, F_BASE]])
    k = find(ALLOC, block, 64 * private, -1)
    if k < 0 or private == 0:
        return fault(CTL, FAULT_PRIVATE, w, i, -1, 0, 4 * dwords, private)
    mem = BUFS[k]
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        at = (saddr + (np.int64(V[w, P[i, F_SRC0], lane]) if flags & FLAG_SVE else 0) + P[i, F_OFFSET]) & M32
        if at + 4 * dwords > private:
            return fault(CTL, FAULT_PRIVATE, w, i, lane, at, 4 * dwords, private)
        off = block - ALLOC[k, 0] + lane * private + at
        for part in range(dwords):
            p = off + 4 * part
            if storing:
                v = np.int64(V[w, P[i, F_SRC1] + part, lane])
                for byte in range(4):
                    mem[p + byte] = v >> (8 * byte) & 0xFF
            else:
                V[w, P[i, F_DST] + part, lane] = (np.int64(mem[p]) | np.int64(mem[p + 1]) << 8
                                                  | np.int64(mem[p + 2]) << 16 | np.int64(mem[p + 3]) << 24)
        ABYTES[k, 2 * KIND_GLOBAL + (1 if storing else 0)] += 4 * dwords
        CNT[d, CNT_WRITTEN if storing else CNT_READ] += 4 * dwords
    return NO_FAULT


@njit(cache=True)
def smem(P, i, w, S, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, d, op, W):
    dst = P[i, F_DST]
    if op == O.OP_S_MEMREALTIME or op == O.OP_S_MEMTIME:
        ticks = (CNT[d, :N_CLASSES].sum() // TICKS_PER_INSTRUCTIONS) + CLOCK[d]
        set64(S, w, dst, ticks)
        return NO_FAULT
    n = scalar_dwords(op)
    address = scalar_address(P, i, w, S)
    k = find(ALLOC, address, 4 * n, -1)
    if k < 0:
        return fault(CTL, FAULT_UNMAPPED, w, i, -1, address, 4 * n, 0)
    for part in range(n):
        v = load(BUFS, ALLOC, k, address + 4 * part, 4)
        if W[0][weak.O_ON]:
            v = weak.load(W, BUFS, ALLOC, w, i, k, address + 4 * part - ALLOC[k, 0], 4, v, False, True)
            if v == weak.FULL:
                return fault(CTL, FAULT_WEAK_FULL, w, i, -1, address + 4 * part, 4, 0)
            if W[0][weak.O_FAIL] and W[0][weak.O_COUNT]:
                return fault(CTL, FAULT_STALE, w, i, -1, address + 4 * part, 4, 0)
        S[w, dst + part] = v
    WS[w, WS_POLL] = address
    touch(TOUCH, ALLOC, k, address, 4 * n)
    ABYTES[k, 2 * KIND_SCALAR] += 4 * n
    CNT[d, CNT_READ] += 4 * n
    return NO_FAULT

