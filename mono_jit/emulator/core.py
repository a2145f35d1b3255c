"""The interpreter: every wave of a launch (of several devices at once) run to completion in
numba-compiled loops, with barriers, parked spinners, checked memory and counters.

Semantics follow AMD's CDNA4 ISA pseudocode (tinygrad's `runtime/autogen/amd/cdna/str_pcode.py`
holds it by operation name; each branch below is named by its operation). Written by hand where
the pseudocode is silent or absent: the scaled MFMA (`mfma_layout.py`), `ds_swizzle` bit-mask
mode, `s_waitcnt` / `s_nop` (no-ops: every access completes at once), `s_barrier`, `s_sleep`
(parks the wave until memory changes), `buffer_wbl2` / `buffer_inv` (no-ops in a sequentially
consistent memory; counted), `s_trap` (fails the launch) and buffer range checks.

State layout (all numpy arrays, shared with `machine.py`):
  S  uint32 [waves, 136]: SGPRs 0..105, VCC 106/107, M0 124, EXEC 126/127, SCC at 128.
  V  uint32 [waves, vgprs, 64].
  WS int64 [waves, WS_FIELDS]: program row, status, workgroup, device, park epoch, ...
  CTA int64 [workgroups, 4]: live waves, waves at the barrier, first wave, LDS bytes.
  ALLOC int64 [allocations, 4]: base, size, flags (1 writable, 2 weight), device; sorted by base.
"""

from __future__ import annotations

import math

import numpy as np

from . import ops as O
from .jit_cache import njit
from .decode import (F_ABS, F_BASE, F_CLASS, F_DST, F_FLAGS, F_FORMAT, F_LIT, F_NEG, F_NEG_HI, F_NEXT, F_OFFSET,
                     F_OFFSET1, F_OP, F_OPSEL, F_OPSEL_HI, F_SCALE0, F_SCALE1, F_SDST, F_SEL0, F_SEL1, F_SEXT,
                     F_SOFF, F_SRC0, F_SRC1, F_SRC2, F_TARGET, FLAG_DPP, FLAG_OFFEN, FLAG_SADDR_OFF,
                     FLAG_SC0, FLAG_SDWA, FLAG_SVE, SEL_DWORD)
from .mfma_layout import E2M1, K_OF_BYTE, K_OF_NIBBLE
from .numerics import (cvt_i32, cvt_u32, e8m0, f32_exponent, f32_to_fp8, f32bits_to_bf16, fma32, fp8_to_f64,
                       maximum, minimum)

M32 = 0xFFFFFFFF
SCC = 128
VCC = 106
EXEC = 126
M0 = 124

# WS fields.
WS_PC, WS_STATUS, WS_CTA, WS_DEVICE, WS_PARK, WS_ROW0, WS_POLL, WS_COUNT, WS_SCRATCH, WS_PRIVATE = range(10)
WS_FIELDS = 10
RUNNING, AT_BARRIER, PARKED, DONE = range(4)

# CTL fields: the wake epoch, stores, state events, and the fault record.
C_EPOCH, C_STORES, C_EVENTS, C_FAULT, C_WAVE, C_ROW, C_LANE, C_ADDRESS, C_SIZE, C_DETAIL, C_IDLE, C_PASSES = range(12)
CTL_FIELDS = 16

# Fault kinds (CTL[C_FAULT]).
(NO_FAULT, FAULT_UNMAPPED, FAULT_READ_ONLY, FAULT_UNALIGNED, FAULT_TRAP, FAULT_LDS, FAULT_OPERAND,
 FAULT_EXEC, FAULT_PRIVATE) = range(9)

# run() results.
FINISHED, FAULTED, DEADLOCKED, IDLE, BUDGET = range(5)

# CNT (per device) fields after the per-class counts.
N_CLASSES = len(O.CLASSES)
CNT_BARRIERS, CNT_POLLS, CNT_LDS_READ, CNT_LDS_WRITTEN, CNT_READ, CNT_WRITTEN, CNT_IDLE = range(N_CLASSES, N_CLASSES + 7)
CNT_FIELDS = N_CLASSES + 8
# ABYTES (per allocation) fields: bytes read / written by buffer, global and scalar accesses.
KIND_BUFFER, KIND_GLOBAL, KIND_SCALAR = range(3)

QUANTUM = 1 << 16  # instructions a wave runs before the others get a turn
IDLE_ROUNDS = 48  # passes with no store and no state change before a deadlock is declared
TICKS_PER_INSTRUCTIONS = 32  # s_memrealtime: one 100 MHz tick per 32 wave-instructions of the device

FP8_VALUE = np.array([fp8_to_f64(code) for code in range(256)])  # e4m3 byte -> value
SCALE_VALUE = np.array([e8m0(code) for code in range(256)])  # E8M0 code -> 2^(code - 127), 255 NaN
_F32_CONST = np.array([0x3F000000, 0xBF000000, 0x3F800000, 0xBF800000, 0x40000000, 0xC0000000, 0x40800000,
                       0xC0800000, 0x3E22F983], np.int64)  # inline 240..248: 0.5 -0.5 1 -1 2 -2 4 -4 1/(2 pi)


@njit(cache=True)
def sval(S, w, code, lit, wide):
    """A non-VGPR operand's value (64 bits when `wide`)."""
    if code < 128:
        if wide:
            return np.int64(S[w, code]) | np.int64(S[w, code + 1]) << 32
        return np.int64(S[w, code])
    if code <= 192:
        return np.int64(code - 128)
    if code <= 208:
        v = np.int64(192 - code)
        return v if wide else v & M32
    if 240 <= code <= 248:
        return _F32_CONST[code - 240]
    if code == 255:
        return np.int64(lit)
    if code == 253:
        return np.int64(S[w, SCC])
    if code == 251:
        return np.int64(1) if S[w, VCC] == 0 and S[w, VCC + 1] == 0 else np.int64(0)
    if code == 252:
        return np.int64(1) if S[w, EXEC] == 0 and S[w, EXEC + 1] == 0 else np.int64(0)
    return np.int64(-1)


@njit(cache=True)
def read(S, V, T, w, code, lit, row, hi):
    """Operand `code` (dword `hi` of it) for all 64 lanes into T[row]."""
    if code >= 256:
        r = code - 256 + hi
        for lane in range(64):
            T[row, lane] = V[w, r, lane]
    else:
        v = sval(S, w, code + hi if code < 128 else code, lit, False)
        if hi and code >= 128:
            v = 0 if code >= 240 or code == 255 or code <= 192 else M32  # a constant's upper dword
        for lane in range(64):
            T[row, lane] = v


@njit(cache=True)
def write(V, T, w, dst, row, ex):
    if ex == -1:
        for lane in range(64):
            V[w, dst, lane] = T[row, lane]
        return
    for lane in range(64):
        if ex >> lane & 1:
            V[w, dst, lane] = T[row, lane]


@njit(cache=True)
def sdwa_select(T, row, sel, sext):
    """Apply an SDWA source select (BYTE_0..3, WORD_0/1) with optional sign extension."""
    if sel == SEL_DWORD:
        return
    for lane in range(64):
        x = np.int64(T[row, lane])
        if sel < 4:
            x = x >> (8 * sel) & 0xFF
            if sext and x & 0x80:
                x -= 0x100
        else:
            x = x >> (16 * (sel - 4)) & 0xFFFF
            if sext and x & 0x8000:
                x -= 0x10000
        T[row, lane] = x & M32


@njit(cache=True)
def float_modifiers(T, row, neg, abs_):
    if abs_:
        for lane in range(64):
            T[row, lane] = T[row, lane] & 0x7FFFFFFF
    if neg:
        for lane in range(64):
            T[row, lane] = T[row, lane] ^ 0x80000000


@njit(cache=True)
def sext32(x):
    x &= M32
    return x - (1 << 32) if x & 0x80000000 else x


@njit(cache=True)
def sext24(x):
    x &= 0xFFFFFF
    return x - (1 << 24) if x & 0x800000 else x


@njit(cache=True)
def sext16(x):
    x &= 0xFFFF
    return x - (1 << 16) if x & 0x8000 else x


@njit(cache=True)
def mul_hi_u32(a, b):
    """The upper 32 bits of an unsigned 32 x 32 product (in uint64: the product can pass 2^63)."""
    return np.int64((np.uint64(a) * np.uint64(b)) >> np.uint64(32))


@njit(cache=True)
def exec_of(S, w):
    return np.int64(S[w, EXEC]) | np.int64(S[w, EXEC + 1]) << 32


@njit(cache=True)
def set64(S, w, r, value):
    S[w, r] = value & M32
    S[w, r + 1] = value >> 32 & M32


@njit(cache=True)
def fault(CTL, kind, w, row, lane, address, size, detail):
    CTL[C_FAULT], CTL[C_WAVE], CTL[C_ROW], CTL[C_LANE] = kind, w, row, lane
    CTL[C_ADDRESS], CTL[C_SIZE], CTL[C_DETAIL] = address, size, detail
    return kind


# ------------------------------------------------------------------------------------ memory --

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
def vmem(P, i, w, S, V, T, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, d, ex, op):
    """MUBUF and global loads, stores and atomics for every active lane."""
    flags = P[i, F_FLAGS]
    is_buffer = P[i, F_CLASS] == O.BUFFER
    kind = KIND_BUFFER if is_buffer else KIND_GLOBAL
    size, dwords, signed, storing, atomic = 4, 1, False, False, False
    if op == O.OP_BUFFER_LOAD_DWORDX2 or op == O.OP_GLOBAL_LOAD_DWORDX2:
        dwords = 2
    elif op == O.OP_BUFFER_LOAD_DWORDX3 or op == O.OP_GLOBAL_LOAD_DWORDX3:
        dwords = 3
    elif op == O.OP_BUFFER_LOAD_DWORDX4 or op == O.OP_GLOBAL_LOAD_DWORDX4:
        dwords = 4
    elif op == O.OP_BUFFER_LOAD_SBYTE or op == O.OP_GLOBAL_LOAD_SBYTE:
        size, signed = 1, True
    elif op == O.OP_BUFFER_LOAD_UBYTE or op == O.OP_GLOBAL_LOAD_UBYTE:
        size = 1
    elif op == O.OP_BUFFER_LOAD_USHORT or op == O.OP_GLOBAL_LOAD_USHORT:
        size = 2
    elif op == O.OP_BUFFER_LOAD_SSHORT or op == O.OP_GLOBAL_LOAD_SSHORT:
        size, signed = 2, True
    elif op == O.OP_BUFFER_STORE_BYTE or op == O.OP_GLOBAL_STORE_BYTE:
        size, storing = 1, True
    elif op == O.OP_BUFFER_STORE_SHORT or op == O.OP_GLOBAL_STORE_SHORT:
        size, storing = 2, True
    elif op == O.OP_BUFFER_STORE_DWORD or op == O.OP_GLOBAL_STORE_DWORD:
        storing = True
    elif op == O.OP_BUFFER_STORE_DWORDX2 or op == O.OP_GLOBAL_STORE_DWORDX2:
        storing, dwords = True, 2
    elif op == O.OP_BUFFER_STORE_DWORDX3 or op == O.OP_GLOBAL_STORE_DWORDX3:
        storing, dwords = True, 3
    elif op == O.OP_BUFFER_STORE_DWORDX4 or op == O.OP_GLOBAL_STORE_DWORDX4:
        storing, dwords = True, 4
    elif P[i, F_CLASS] == O.ATOMIC:
        atomic = True
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
    hint = -1
    mem, touched, weight = BUFS[0], TOUCH[0], 0
    stored = False
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        if is_buffer:
            offset = (np.int64(V[w, P[i, F_SRC0], lane]) if flags & FLAG_OFFEN else 0) + soffset + P[i, F_OFFSET]
            offset &= M32
            address = base + offset
        elif flags & FLAG_SADDR_OFF:
            address = (np.int64(V[w, P[i, F_SRC0], lane]) | np.int64(V[w, P[i, F_SRC0] + 1, lane]) << 32) + P[i, F_OFFSET]
        else:
            b = P[i, F_BASE]
            address = ((np.int64(S[w, b]) | np.int64(S[w, b + 1]) << 32) + np.int64(V[w, P[i, F_SRC0], lane])
                       + P[i, F_OFFSET])
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
            else:  # GLOBAL_ATOMIC_MAX (signed)
                new = old if sext32(old) >= sext32(operand) else operand
            store(BUFS, ALLOC, k, address, 4, new)
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
            hint, mem, weight = k, BUFS[k], ALLOC[k, 2] & 2
            if weight:
                touched = TOUCH[k]
        off = address - ALLOC[k, 0]
        if storing:
            if not ALLOC[k, 2] & 1:
                return fault(CTL, FAULT_READ_ONLY, w, i, lane, address, nbytes, 0)
            for part in range(parts):
                value = np.int64(V[w, data + part, lane])
                for byte in range(size):
                    mem[off + 4 * part + byte] = value >> (8 * byte) & 0xFF
            ABYTES[k, 2 * kind + 1] += size * parts
            CNT[d, CNT_WRITTEN] += size * parts
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
        WS[w, WS_POLL] = address + 4 * (parts - 1)
        if weight:  # the 4-byte granules the read reached
            for granule in range(off >> 2, ((off + span - 1) >> 2) + 1):
                touched[granule] = 1
        ABYTES[k, 2 * kind] += size * parts
        CNT[d, CNT_READ] += size * parts
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
def smem(P, i, w, S, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, d, op):
    dst = P[i, F_DST]
    if op == O.OP_S_MEMREALTIME or op == O.OP_S_MEMTIME:
        ticks = (CNT[d, :N_CLASSES].sum() // TICKS_PER_INSTRUCTIONS) + CLOCK[d]
        set64(S, w, dst, ticks)
        return NO_FAULT
    n = 1
    if op == O.OP_S_LOAD_DWORDX2:
        n = 2
    elif op == O.OP_S_LOAD_DWORDX4:
        n = 4
    elif op == O.OP_S_LOAD_DWORDX8:
        n = 8
    elif op == O.OP_S_LOAD_DWORDX16:
        n = 16
    b = P[i, F_BASE]
    address = (np.int64(S[w, b]) | (np.int64(S[w, b + 1]) & 0xFFFF) << 32) + P[i, F_OFFSET]
    if P[i, F_SOFF] >= 0:
        address += np.int64(S[w, P[i, F_SOFF]])
    address &= ~np.int64(3)  # the two low address bits are ignored (scalar memory reads dwords)
    k = find(ALLOC, address, 4 * n, -1)
    if k < 0:
        return fault(CTL, FAULT_UNMAPPED, w, i, -1, address, 4 * n, 0)
    for part in range(n):
        S[w, dst + part] = load(BUFS, ALLOC, k, address + 4 * part, 4)
    WS[w, WS_POLL] = address
    touch(TOUCH, ALLOC, k, address, 4 * n)
    ABYTES[k, 2 * KIND_SCALAR] += 4 * n
    CNT[d, CNT_READ] += 4 * n
    return NO_FAULT


@njit(cache=True)
def lds_op(P, i, w, V, T, LDS, CTA, CNT, CTL, c, d, ex, op):
    """DS reads, writes, swizzle and bpermute (LDS addresses are 32-bit, checked against the
    workgroup's static + dynamic LDS)."""
    dst, addr, data0, data1 = P[i, F_DST], P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2]
    off0, off1 = P[i, F_OFFSET], P[i, F_OFFSET1]
    limit = CTA[c, 3]
    if op == O.OP_DS_SWIZZLE_B32:
        # Bit-mask mode (offset bit 15 clear): within each 32 lanes, source lane =
        # ((lane & and_mask) | or_mask) ^ xor_mask, masks at offset bits 0-4, 5-9, 10-14.
        # Quad-permute mode (bit 15 set): lane j of each 4 takes lane offset[2 (j % 4) + 1 :
        # 2 (j % 4)] of its quad. (AMD Vega / CDNA ISA, DS_SWIZZLE_B32 "offset" modes; LLVM
        # SIDefines.h Swizzle::QUAD_PERM_ENC = 0x8000, BITMASK_PERM_ENC = 0.) The swizzled VGPR
        # is the instruction's ADDR field. Reads of inactive lanes give 0.
        pattern = off0 | off1 << 8
        and_mask, or_mask, xor_mask = pattern & 0x1F, pattern >> 5 & 0x1F, pattern >> 10 & 0x1F
        for lane in range(64):
            if pattern & 0x8000:
                src = (lane & ~3) | (pattern >> (2 * (lane & 3)) & 3)
            else:
                src = (lane & 0x20) | (((lane & and_mask) | or_mask) ^ xor_mask)
            T[3, lane] = V[w, addr, src] if ex >> src & 1 else 0
        write(V, T, w, dst, 3, ex)
        return NO_FAULT
    if op == O.OP_DS_BPERMUTE_B32:  # CDNA4 pseudocode DS_BPERMUTE_B32
        offset = off0 | off1 << 8
        for lane in range(64):
            src = ((np.int64(V[w, addr, lane]) + offset) & M32) // 4 % 64
            T[3, lane] = V[w, data0, src] if ex >> src & 1 else 0
        write(V, T, w, dst, 3, ex)
        return NO_FAULT
    if op == O.OP_DS_OR_B32:  # MEM[ADDR + offset] |= DATA0 (no return)
        for lane in range(64):
            if not ex >> lane & 1:
                continue
            at = (np.int64(V[w, addr, lane]) + (off0 | off1 << 8)) & M32
            if at & 3:
                return fault(CTL, FAULT_UNALIGNED, w, i, lane, at, 4, 1)
            if at + 4 > limit:
                return fault(CTL, FAULT_LDS, w, i, lane, at, 4, limit)
            v = np.int64(V[w, data0, lane])
            for byte in range(4):
                LDS[c, at + byte] |= v >> (8 * byte) & 0xFF
            CNT[d, CNT_LDS_READ] += 4
            CNT[d, CNT_LDS_WRITTEN] += 4
        return NO_FAULT
    n, stride, two, writing = 1, 0, False, False
    if op == O.OP_DS_READ_B64 or op == O.OP_DS_WRITE_B64:
        n = 2
    elif op == O.OP_DS_READ_B96 or op == O.OP_DS_WRITE_B96:
        n = 3
    elif op == O.OP_DS_READ_B128 or op == O.OP_DS_WRITE_B128:
        n = 4
    elif op == O.OP_DS_READ2_B32 or op == O.OP_DS_WRITE2_B32:
        two, stride = True, 4
    elif op == O.OP_DS_READ2_B64 or op == O.OP_DS_WRITE2_B64:
        n, two, stride = 2, True, 8
    elif op == O.OP_DS_READ2ST64_B32 or op == O.OP_DS_WRITE2ST64_B32:
        two, stride = True, 256
    elif op == O.OP_DS_READ2ST64_B64:
        n, two, stride = 2, True, 512
    if (op == O.OP_DS_WRITE_B32 or op == O.OP_DS_WRITE_B64 or op == O.OP_DS_WRITE_B96 or op == O.OP_DS_WRITE_B128
            or op == O.OP_DS_WRITE2_B32 or op == O.OP_DS_WRITE2_B64 or op == O.OP_DS_WRITE2ST64_B32):
        writing = True
    for lane in range(64):
        if not ex >> lane & 1:
            continue
        a = np.int64(V[w, addr, lane])
        for half in range(2 if two else 1):
            if two:
                at = (a + (off0 if half == 0 else off1) * stride) & M32
            else:
                at = (a + (off0 | off1 << 8)) & M32
            if at & 3:
                return fault(CTL, FAULT_UNALIGNED, w, i, lane, at, 4 * n, 1)
            if at + 4 * n > limit:
                return fault(CTL, FAULT_LDS, w, i, lane, at, 4 * n, limit)
            for part in range(n):
                p = at + 4 * part
                if writing:
                    src = (data0 if half == 0 else data1) + part
                    v = np.int64(V[w, src, lane])
                    LDS[c, p] = v & 0xFF
                    LDS[c, p + 1] = v >> 8 & 0xFF
                    LDS[c, p + 2] = v >> 16 & 0xFF
                    LDS[c, p + 3] = v >> 24 & 0xFF
                else:
                    V[w, dst + half * n + part, lane] = (np.int64(LDS[c, p]) | np.int64(LDS[c, p + 1]) << 8
                                                         | np.int64(LDS[c, p + 2]) << 16 | np.int64(LDS[c, p + 3]) << 24)
        if writing:
            CNT[d, CNT_LDS_WRITTEN] += 4 * n * (2 if two else 1)
        else:
            CNT[d, CNT_LDS_READ] += 4 * n * (2 if two else 1)
    return NO_FAULT


# -------------------------------------------------------------------------------------- SALU --

@njit(cache=True)
def salu(P, i, w, S, op):
    """SOP1 / SOP2 / SOPC / SOPK (CDNA4 pseudocode of each S_* operation)."""
    lit = P[i, F_LIT]
    dst = P[i, F_DST]
    wide = (op == O.OP_S_AND_B64 or op == O.OP_S_OR_B64 or op == O.OP_S_XOR_B64 or op == O.OP_S_ANDN2_B64
            or op == O.OP_S_CSELECT_B64 or op == O.OP_S_MOV_B64 or op == O.OP_S_BCNT1_I32_B64
            or op == O.OP_S_AND_SAVEEXEC_B64 or op == O.OP_S_OR_SAVEEXEC_B64 or op == O.OP_S_ANDN2_SAVEEXEC_B64
            or op == O.OP_S_CMP_LG_U64 or op == O.OP_S_CMP_EQ_U64 or op == O.OP_S_LSHL_B64
            or op == O.OP_S_FF1_I32_B64)
    a = sval(S, w, P[i, F_SRC0], lit, wide)
    b = sval(S, w, P[i, F_SRC1], lit, wide and op != O.OP_S_LSHL_B64)
    scc = np.int64(S[w, SCC])
    k = P[i, F_OFFSET]  # SOPK simm16
    ks = k - 0x10000 if k & 0x8000 else k
    r = np.int64(0)
    if op == O.OP_S_MOV_B32:
        S[w, dst] = a
        return
    if op == O.OP_S_MOV_B64:
        set64(S, w, dst, a)
        return
    if op == O.OP_S_ADD_U32:
        r = a + b
        S[w, SCC] = r >> 32
    elif op == O.OP_S_ADDC_U32:
        r = a + b + scc
        S[w, SCC] = r >> 32
    elif op == O.OP_S_SUB_U32:
        r = a - b
        S[w, SCC] = 1 if b > a else 0
    elif op == O.OP_S_SUBB_U32:
        r = a - b - scc
        S[w, SCC] = 1 if b + scc > a else 0
    elif op == O.OP_S_ADD_I32 or op == O.OP_S_SUB_I32:
        x, y = sext32(a), sext32(b)
        r = x + y if op == O.OP_S_ADD_I32 else x - y
        S[w, SCC] = 1 if r != sext32(r) else 0
    elif op == O.OP_S_AND_B32:
        r = a & b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_OR_B32:
        r = a | b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_XOR_B32:
        r = a ^ b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_ANDN2_B32:
        r = a & ~b
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_AND_B64 or op == O.OP_S_OR_B64 or op == O.OP_S_XOR_B64 or op == O.OP_S_ANDN2_B64:
        if op == O.OP_S_AND_B64:
            r = a & b
        elif op == O.OP_S_OR_B64:
            r = a | b
        elif op == O.OP_S_XOR_B64:
            r = a ^ b
        else:
            r = a & ~b
        set64(S, w, dst, r)
        S[w, SCC] = 1 if r != 0 else 0
        return
    elif op == O.OP_S_LSHL_B32:
        r = (a << (b & 31)) & M32
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_LSHR_B32:
        r = a >> (b & 31)
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_ASHR_I32:
        r = sext32(a) >> (b & 31)
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_LSHL_B64:
        r = a << (b & 63)
        set64(S, w, dst, r)
        S[w, SCC] = 1 if r != 0 else 0
        return
    elif op == O.OP_S_LSHL1_ADD_U32 or op == O.OP_S_LSHL2_ADD_U32 or op == O.OP_S_LSHL3_ADD_U32 or op == O.OP_S_LSHL4_ADD_U32:
        shift = 1 if op == O.OP_S_LSHL1_ADD_U32 else 2 if op == O.OP_S_LSHL2_ADD_U32 else 3 if op == O.OP_S_LSHL3_ADD_U32 else 4
        r = (a << shift) + b
        S[w, SCC] = 1 if r >> 32 else 0
    elif op == O.OP_S_MUL_I32:
        r = sext32(a) * sext32(b)
    elif op == O.OP_S_MUL_HI_U32:
        r = mul_hi_u32(a, b)
    elif op == O.OP_S_MUL_HI_I32:
        r = (sext32(a) * sext32(b)) >> 32
    elif op == O.OP_S_MIN_I32:
        c = sext32(a) < sext32(b)
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_MAX_I32:
        c = sext32(a) > sext32(b)
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_CSELECT_B32:
        r = a if scc else b
    elif op == O.OP_S_CSELECT_B64:
        set64(S, w, dst, a if scc else b)
        return
    elif op == O.OP_S_BFE_U32 or op == O.OP_S_BFE_I32:
        shift, width = b & 31, b >> 16 & 0x7F
        r = (a >> shift) & ((1 << width) - 1) if width < 32 else a >> shift
        if op == O.OP_S_BFE_I32 and 0 < width < 32 and r >> (width - 1) & 1:
            r -= 1 << width
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_MIN_U32:
        c = a < b
        S[w, SCC] = 1 if c else 0
        r = a if c else b
    elif op == O.OP_S_BREV_B32:  # D0.u32[31 : 0] = S0.u32[0 : 31]
        r = 0
        for bit in range(32):
            r |= (a >> bit & 1) << (31 - bit)
    elif op == O.OP_S_ABS_I32:
        r = abs(sext32(a))
        S[w, SCC] = 1 if r & M32 else 0
    elif op == O.OP_S_SEXT_I32_I16:
        r = sext16(a)
    elif op == O.OP_S_BCNT1_I32_B64:
        r = 0
        x = a
        for _ in range(64):
            r += x & 1
            x = x >> 1 & 0x7FFFFFFFFFFFFFFF
        S[w, SCC] = 1 if r else 0
    elif op == O.OP_S_BITSET1_B32:
        r = np.int64(S[w, dst]) | (1 << (a & 31))
    elif op == O.OP_S_FF1_I32_B64:  # the lowest set bit of S0, -1 if none
        r = -1
        for bit in range(64):
            if a >> bit & 1:
                r = bit
                break
    elif op == O.OP_S_BITCMP1_B32:  # SCC = S0[S1[4:0]] == 1; no destination
        S[w, SCC] = a >> (b & 31) & 1
        return
    elif op == O.OP_S_AND_SAVEEXEC_B64 or op == O.OP_S_OR_SAVEEXEC_B64 or op == O.OP_S_ANDN2_SAVEEXEC_B64:
        ex = exec_of(S, w)
        set64(S, w, dst, ex)
        if op == O.OP_S_AND_SAVEEXEC_B64:
            ex = a & ex
        elif op == O.OP_S_OR_SAVEEXEC_B64:
            ex = a | ex
        else:
            ex = a & ~ex
        set64(S, w, EXEC, ex)
        S[w, SCC] = 1 if ex != 0 else 0
        return
    elif op == O.OP_S_MOVK_I32:
        r = ks
    elif op == O.OP_S_ADDK_I32:
        x = sext32(np.int64(S[w, dst]))
        r = x + ks
        S[w, SCC] = 1 if r != sext32(r) else 0
    elif op == O.OP_S_MULK_I32:
        r = sext32(np.int64(S[w, dst])) * ks
    elif op >= O.OP_S_CMP_EQ_U32 and op <= O.OP_S_CMP_EQ_U64:
        x, y = sext32(a), sext32(b)
        if op == O.OP_S_CMP_EQ_U32 or op == O.OP_S_CMP_EQ_I32:
            c = a == b
        elif op == O.OP_S_CMP_LG_U32 or op == O.OP_S_CMP_LG_I32 or op == O.OP_S_CMP_LG_U64:
            c = a != b
        elif op == O.OP_S_CMP_EQ_U64:
            c = a == b
        elif op == O.OP_S_CMP_GT_U32:
            c = a > b
        elif op == O.OP_S_CMP_GE_U32:
            c = a >= b
        elif op == O.OP_S_CMP_LT_U32:
            c = a < b
        elif op == O.OP_S_CMP_LE_U32:
            c = a <= b
        elif op == O.OP_S_CMP_GE_I32:
            c = x >= y
        elif op == O.OP_S_CMP_GT_I32:
            c = x > y
        elif op == O.OP_S_CMP_LE_I32:
            c = x <= y
        else:  # S_CMP_LT_I32
            c = x < y
        S[w, SCC] = 1 if c else 0
        return
    else:  # S_CMPK_*: SDST against the sign- (I32) or zero-extended (U32) immediate
        x = np.int64(S[w, dst])
        if op == O.OP_S_CMPK_LG_U32:
            c = x != k
        elif op == O.OP_S_CMPK_GT_I32:
            c = sext32(x) > ks
        elif op == O.OP_S_CMPK_LG_I32:
            c = sext32(x) != ks
        elif op == O.OP_S_CMPK_LT_I32:
            c = sext32(x) < ks
        elif op == O.OP_S_CMPK_EQ_I32:
            c = sext32(x) == ks
        elif op == O.OP_S_CMPK_GE_I32:
            c = sext32(x) >= ks
        else:  # S_CMPK_LE_I32
            c = sext32(x) <= ks
        S[w, SCC] = 1 if c else 0
        return
    S[w, dst] = r & M32


# -------------------------------------------------------------------------------------- VALU --

@njit(cache=True, error_model="numpy")
def compare(op, a, b, fa, fb):
    """V_CMP_* on one lane: integer operands `a`, `b` (u32 / u64 bits), float views `fa`, `fb`."""
    if op == O.OP_V_CMP_EQ_F32:
        return fa == fb
    if op == O.OP_V_CMP_GE_F32:
        return fa >= fb
    if op == O.OP_V_CMP_GT_F32:
        return fa > fb
    if op == O.OP_V_CMP_LE_F32:
        return fa <= fb
    if op == O.OP_V_CMP_LT_F32:
        return fa < fb
    if op == O.OP_V_CMP_NEQ_F32:  # unordered or not equal
        return not (fa == fb)
    if op == O.OP_V_CMP_O_F32:
        return fa == fa and fb == fb
    if op == O.OP_V_CMP_NGT_F32:
        return not (fa > fb)
    if op == O.OP_V_CMP_NLT_F32:
        return not (fa < fb)
    if op == O.OP_V_CMP_CLASS_F32:
        e, m = a >> 23 & 0xFF, a & 0x7FFFFF
        negative = a >> 31 & 1
        if e == 255 and m:
            bit = 1 if m & 0x400000 else 0  # quiet NaN : signalling NaN
        elif e == 255:
            bit = 2 if negative else 9
        elif e:
            bit = 3 if negative else 8
        elif m:
            bit = 4 if negative else 7
        else:
            bit = 5 if negative else 6
        return (b >> bit) & 1 == 1
    if op == O.OP_V_CMP_EQ_U32 or op == O.OP_V_CMP_EQ_I32 or op == O.OP_V_CMP_EQ_U64:
        return a == b
    if op == O.OP_V_CMP_NE_U32 or op == O.OP_V_CMP_NE_I32 or op == O.OP_V_CMP_NE_U64:
        return a != b
    if op == O.OP_V_CMP_GT_I64:  # the operands' 64 bits as two's complement: a and b as they are
        return a > b
    if op == O.OP_V_CMP_GT_U32:
        return a > b
    if op == O.OP_V_CMP_GE_U32:
        return a >= b
    if op == O.OP_V_CMP_LT_U32:
        return a < b
    if op == O.OP_V_CMP_LE_U32:
        return a <= b
    if op == O.OP_V_CMP_GT_I16:
        return sext16(a) > sext16(b)
    x, y = sext32(a), sext32(b)
    if op == O.OP_V_CMP_GE_I32:
        return x >= y
    if op == O.OP_V_CMP_GT_I32:
        return x > y
    if op == O.OP_V_CMP_LE_I32:
        return x <= y
    return x < y  # V_CMP_LT_I32


@njit(cache=True, error_model="numpy")
def div_scale(s0, s1, s2, b1, b2):
    """V_DIV_SCALE_F32 on one lane (CDNA4 pseudocode): (result, VCC bit)."""
    if s2 == 0.0 or s1 == 0.0:
        return np.float32(np.nan), 0
    e1, e2 = f32_exponent(b1), f32_exponent(b2)
    quotient = np.float32(s2 / s1)
    q_denormal = quotient != 0.0 and abs(quotient) < 1.1754943508222875e-38
    if e2 - e1 >= 96:
        return (np.float32(s0 * 2.0 ** 64) if s0 == s1 else s0), 1
    if e1 == 0:  # S1 denormal
        return np.float32(s0 * 2.0 ** 64), 0
    if q_denormal:
        return (np.float32(s0 * 2.0 ** 64) if s0 == s2 else s0), 1
    if e2 <= 23:  # numerator tiny
        return np.float32(s0 * 2.0 ** 64), 0
    return s0, 0


@njit(cache=True, error_model="numpy")
def div_fixup(s0, s1, s2, b1, b2):
    """V_DIV_FIXUP_F32 on one lane (CDNA4 pseudocode; S1 the denominator, S2 the numerator)."""
    negative = ((b1 ^ b2) >> 31) & 1
    if s2 != s2:
        return s2
    if s1 != s1:
        return s1
    if s1 == 0.0 and s2 == 0.0:
        return np.float32(np.nan)
    if math.isinf(s1) and math.isinf(s2):
        return np.float32(np.nan)
    if s1 == 0.0 or math.isinf(s2):
        return np.float32(-np.inf if negative else np.inf)
    if math.isinf(s1) or s2 == 0.0:
        return np.float32(-0.0 if negative else 0.0)
    if f32_exponent(b2) - f32_exponent(b1) < -150:
        return np.float32(-0.0 if negative else 0.0)
    return np.float32(-abs(s0) if negative else abs(s0))


@njit(cache=True)
def dpp_source(ctrl, lane):
    """The lane a DPP control reads for `lane`, or -1 where it has no source (gfx9 DPP_CTRL:
    quad_perm 0x00-0xFF, row_shl 0x101-0x10F, row_shr 0x111-0x11F, row_ror 0x121-0x12F,
    wave_shl / rol / shr / ror 0x130 / 0x134 / 0x138 / 0x13C, row_mirror 0x140,
    row_half_mirror 0x141, row_bcast15 0x142, row_bcast31 0x143; AMD Vega ISA "DPP", LLVM
    SIDefines.h DppCtrl). Rows are 16 lanes."""
    row, within = lane & ~15, lane & 15
    if ctrl <= 0xFF:
        return (lane & ~3) | (ctrl >> (2 * (lane & 3)) & 3)
    if 0x101 <= ctrl <= 0x10F:
        n = within + (ctrl - 0x100)
        return row + n if n < 16 else -1
    if 0x111 <= ctrl <= 0x11F:
        n = within - (ctrl - 0x110)
        return row + n if n >= 0 else -1
    if 0x121 <= ctrl <= 0x12F:
        return row + (within - (ctrl - 0x120)) % 16
    if ctrl == 0x130:
        return lane + 1 if lane < 63 else -1
    if ctrl == 0x134:
        return (lane + 1) % 64
    if ctrl == 0x138:
        return lane - 1 if lane > 0 else -1
    if ctrl == 0x13C:
        return (lane - 1) % 64
    if ctrl == 0x140:
        return row + 15 - within
    if ctrl == 0x141:
        return (lane & ~7) + 7 - (lane & 7)
    if ctrl == 0x142:
        return row - 1 if row >= 16 else -1
    if ctrl == 0x143:
        return 31 if lane >= 32 else -1
    return -2  # not a DPP control


@njit(cache=True)
def dpp_mov(P, i, w, V, T, ex):
    """v_mov_b32 with DPP: lanes of disabled rows / banks keep their value; a lane whose source
    lane is invalid or inactive gets 0 with bound_ctrl, else keeps its value."""
    dst, src, ctrl, masks = P[i, F_DST], P[i, F_SRC0] - 256, P[i, F_OFFSET], P[i, F_OFFSET1]
    row_mask, bank_mask, bound_zero = masks & 0xF, masks >> 4 & 0xF, masks >> 8 & 1
    for lane in range(64):
        T[3, lane] = V[w, dst, lane]
        if not (row_mask >> (lane // 16) & 1 and bank_mask >> (lane % 16 // 4) & 1):
            continue
        source = dpp_source(ctrl, lane)
        if source >= 0 and ex >> source & 1:
            T[3, lane] = V[w, src, source]
        elif bound_zero:
            T[3, lane] = 0
    write(V, T, w, dst, 3, ex)


@njit(cache=True, error_model="numpy")
def common_valu(op, T, TF, select):
    """The most frequent plain operations of our kernels, one loop over the lanes each (which
    LLVM vectorises), result in T[3]; False for every other operation. Semantics as in `valu`'s
    per-lane table below (CDNA4 ISA pseudocode of each op)."""
    if op == O.OP_V_MOV_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane]
    elif op == O.OP_V_ADD_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] + TF[1, lane]
    elif op == O.OP_V_SUB_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] - TF[1, lane]
    elif op == O.OP_V_MUL_F32:
        for lane in range(64):
            TF[3, lane] = TF[0, lane] * TF[1, lane]
    elif op == O.OP_V_FMA_F32 or op == O.OP_V_FMAC_F32:
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[1, lane], TF[2, lane])
    elif op == O.OP_V_FMAMK_F32:  # fma(S0, K, S1); K (the literal) was read as S2
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[2, lane], TF[1, lane])
    elif op == O.OP_V_FMAAK_F32:  # fma(S0, S1, K)
        for lane in range(64):
            TF[3, lane] = fma32(TF[0, lane], TF[1, lane], TF[2, lane])
    elif op == O.OP_V_ADD_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] + T[1, lane]
    elif op == O.OP_V_SUB_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] - T[1, lane]
    elif op == O.OP_V_AND_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] & T[1, lane]
    elif op == O.OP_V_OR_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] | T[1, lane]
    elif op == O.OP_V_XOR_B32:
        for lane in range(64):
            T[3, lane] = T[0, lane] ^ T[1, lane]
    elif op == O.OP_V_LSHLREV_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] << (T[0, lane] & np.uint32(31))
    elif op == O.OP_V_LSHRREV_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] >> (T[0, lane] & np.uint32(31))
    elif op == O.OP_V_ASHRREV_I32:
        TI = T.view(np.int32)
        for lane in range(64):
            TI[3, lane] = TI[1, lane] >> (TI[0, lane] & 31)
    elif op == O.OP_V_CNDMASK_B32:
        for lane in range(64):
            T[3, lane] = T[1, lane] if select >> lane & 1 else T[0, lane]
    elif op == O.OP_V_LSHL_ADD_U32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] << (T[1, lane] & np.uint32(31))) + T[2, lane]
    elif op == O.OP_V_ADD_LSHL_U32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] + T[1, lane]) << (T[2, lane] & np.uint32(31))
    elif op == O.OP_V_LSHL_OR_B32:
        for lane in range(64):
            T[3, lane] = (T[0, lane] << (T[1, lane] & np.uint32(31))) | T[2, lane]
    elif op == O.OP_V_ADD3_U32:
        for lane in range(64):
            T[3, lane] = T[0, lane] + T[1, lane] + T[2, lane]
    elif op == O.OP_V_MUL_U32_U24:
        for lane in range(64):
            T[3, lane] = (T[0, lane] & np.uint32(0xFFFFFF)) * (T[1, lane] & np.uint32(0xFFFFFF))
    else:
        return False
    return True


@njit(cache=True, error_model="numpy")
def packed_f32(P, i, w, S, V, T, TF, ex, op):
    """V_PK_ADD_F32 / V_PK_MUL_F32 / V_PK_FMA_F32: two f32 lanes a register pair. Each source's
    low and high result take its low or high dword by OP_SEL / OP_SEL_HI, negated by NEG /
    NEG_HI (CDNA4 ISA, VOP3P); a constant's high dword is 0. Rows: 0-2 the low dwords (read),
    5-7 the high ones; the picked operands go to X (lo 0-2, hi 3-5)."""
    sources = (P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2])
    opsel, opsel_hi, neg_lo, neg_hi = P[i, F_OPSEL], P[i, F_OPSEL_HI], P[i, F_NEG], P[i, F_NEG_HI]
    X = np.empty((6, 64), np.uint32)
    for k in range(3):
        code = sources[k]
        for lane in range(64):
            T[5 + k, lane] = V[w, code - 256 + 1, lane] if code >= 256 else (S[w, code + 1] if code < 128 else 0)
        row_lo, row_hi = (5 + k if opsel >> k & 1 else k), (5 + k if opsel_hi >> k & 1 else k)
        mask_lo = np.uint32(0x80000000) if neg_lo >> k & 1 else np.uint32(0)
        mask_hi = np.uint32(0x80000000) if neg_hi >> k & 1 else np.uint32(0)
        for lane in range(64):
            X[k, lane] = T[row_lo, lane] ^ mask_lo
            X[3 + k, lane] = T[row_hi, lane] ^ mask_hi
    XF = X.view(np.float32)
    for half in range(2):
        a, b, c = 3 * half, 3 * half + 1, 3 * half + 2
        if op == O.OP_V_PK_ADD_F32:
            for lane in range(64):
                TF[3 + half, lane] = XF[a, lane] + XF[b, lane]
        elif op == O.OP_V_PK_MUL_F32:
            for lane in range(64):
                TF[3 + half, lane] = XF[a, lane] * XF[b, lane]
        else:
            for lane in range(64):
                TF[3 + half, lane] = np.float32(np.float64(XF[a, lane]) * np.float64(XF[b, lane])
                                                + np.float64(XF[c, lane]))
    dst = P[i, F_DST]
    write(V, T, w, dst, 3, ex)
    write(V, T, w, dst + 1, 4, ex)


@njit(cache=True, error_model="numpy")
def valu(P, i, w, S, V, T, TF, ex, op):
    """Every VOP1 / VOP2 / VOP3 / VOP3SD / VOPC / VOP3P operation except the cross-lane ones."""
    lit, dst = P[i, F_LIT], P[i, F_DST]
    flags = P[i, F_FLAGS]
    s0, s1, s2 = P[i, F_SRC0], P[i, F_SRC1], P[i, F_SRC2]
    if flags & FLAG_DPP:
        dpp_mov(P, i, w, V, T, ex)
        return
    read(S, V, T, w, s0, lit, 0, 0)
    read(S, V, T, w, s1, lit, 1, 0)
    read(S, V, T, w, s2, lit, 2, 0)
    if flags & FLAG_SDWA:
        sdwa_select(T, 0, P[i, F_SEL0], P[i, F_SEXT] & 1)
        sdwa_select(T, 1, P[i, F_SEL1], P[i, F_SEXT] >> 1 & 1)
    neg, ab = P[i, F_NEG], P[i, F_ABS]
    if (neg | ab) and P[i, F_CLASS] != O.PACKED:
        for r in range(3):
            float_modifiers(T, r, neg >> r & 1, ab >> r & 1)
    if op == O.OP_V_PK_MOV_B32:  # D.lo = S0's OPSEL[0] half, D.hi = S1's OPSEL[1] half (CDNA4 pseudocode)
        opsel = P[i, F_OPSEL]
        read(S, V, T, w, s0, lit, 3, opsel & 1)
        read(S, V, T, w, s1, lit, 4, opsel >> 1 & 1)
        write(V, T, w, dst, 3, ex)
        write(V, T, w, dst + 1, 4, ex)
        return
    if op == O.OP_V_PK_ADD_F32 or op == O.OP_V_PK_MUL_F32 or op == O.OP_V_PK_FMA_F32:
        packed_f32(P, i, w, S, V, T, TF, ex, op)
        return
    if P[i, F_SDST] == 0 and common_valu(op, T, TF, sval(S, w, s2, 0, True) if s2 < 256 else 0):
        write(V, T, w, dst, 3, ex)
        return
    # Compares: the lane bits of active lanes (inactive lanes read 0) into an SGPR pair.
    if op >= O.OP_V_CMP_EQ_F32 and op <= O.OP_V_CMP_GT_I64:
        wide = op == O.OP_V_CMP_EQ_U64 or op == O.OP_V_CMP_NE_U64 or op == O.OP_V_CMP_GT_I64
        if wide:
            read(S, V, T, w, s0, lit, 4, 1)
            read(S, V, T, w, s1, lit, 5, 1)
        mask = np.int64(0)
        for lane in range(64):
            if ex >> lane & 1:
                a, b = np.int64(T[0, lane]), np.int64(T[1, lane])
                if wide:
                    a |= np.int64(T[4, lane]) << 32
                    b |= np.int64(T[5, lane]) << 32
                if compare(op, a, b, TF[0, lane], TF[1, lane]):
                    mask |= np.int64(1) << lane
        set64(S, w, dst, mask)
        return
    carry_in = sval(S, w, s2, 0, True) if s2 < 256 else 0  # VCC / an SGPR pair for carries and selects
    carry_out = np.int64(0)
    two = False  # a 64-bit result in T[3] (low) and T[4] (high)
    for lane in range(64):
        a, b, c = np.int64(T[0, lane]), np.int64(T[1, lane]), np.int64(T[2, lane])
        fa, fb, fc = TF[0, lane], TF[1, lane], TF[2, lane]
        cin = carry_in >> lane & 1
        r = np.int64(0)
        f = np.float32(0.0)
        is_float = False
        if op == O.OP_V_MOV_B32:
            r = a
        elif op == O.OP_V_MOV_B64:
            two = True
            r = a
            T[4, lane] = np.int64(V[w, s0 - 256 + 1, lane]) if s0 >= 256 else (
                sval(S, w, s0, lit, True) >> 32 & M32 if s0 < 128 or (193 <= s0 <= 208) else 0)
        elif op == O.OP_V_NOT_B32:
            r = ~a
        elif op == O.OP_V_CVT_F32_U32:
            f, is_float = np.float32(a), True
        elif op == O.OP_V_CVT_F32_I32:
            f, is_float = np.float32(sext32(a)), True
        elif op >= O.OP_V_CVT_F32_UBYTE0 and op <= O.OP_V_CVT_F32_UBYTE3:  # byte n of S0, unsigned
            f, is_float = np.float32(a >> (8 * (op - O.OP_V_CVT_F32_UBYTE0)) & 0xFF), True
        elif op == O.OP_V_CVT_U32_F32:
            r = cvt_u32(fa)
        elif op == O.OP_V_CVT_I32_F32:
            r = cvt_i32(fa)
        # Transcendentals: correctly rounded here (computed in f64, rounded once); the hardware's
        # are approximations of about 1 ulp.
        elif op == O.OP_V_EXP_F32:
            f, is_float = np.float32(2.0 ** np.float64(fa)), True
        elif op == O.OP_V_LOG_F32:
            f, is_float = np.float32(np.log2(np.float64(fa))), True
        elif op == O.OP_V_RCP_F32 or op == O.OP_V_RCP_IFLAG_F32:
            f, is_float = np.float32(1.0 / np.float64(fa)), True
        elif op == O.OP_V_SQRT_F32:
            f, is_float = np.float32(np.sqrt(np.float64(fa))), True
        elif op == O.OP_V_RSQ_F32:
            f, is_float = np.float32(1.0 / np.sqrt(np.float64(fa))), True
        elif op == O.OP_V_TRUNC_F32:
            f, is_float = np.float32(np.trunc(fa)), True
        elif op == O.OP_V_RNDNE_F32:
            f, is_float = np.float32(np.rint(fa)), True
        elif op == O.OP_V_ADD_F32:
            f, is_float = np.float32(fa + fb), True
        elif op == O.OP_V_SUB_F32:
            f, is_float = np.float32(fa - fb), True
        elif op == O.OP_V_SUBREV_F32:
            f, is_float = np.float32(fb - fa), True
        elif op == O.OP_V_MUL_F32:
            f, is_float = np.float32(fa * fb), True
        elif op == O.OP_V_FMAC_F32 or op == O.OP_V_FMA_F32:
            f, is_float = fma32(fa, fb, fc), True
        elif op == O.OP_V_MAX_F32:
            f, is_float = (fb if fa != fa else fa if fb != fb else max(fa, fb)), True
        elif op == O.OP_V_MIN_F32:
            f, is_float = (fb if fa != fa else fa if fb != fb else min(fa, fb)), True
        elif op == O.OP_V_MAXIMUM3_F32:
            f, is_float = np.float32(maximum(maximum(fa, fb), fc)), True
        elif op == O.OP_V_MINIMUM3_F32:
            f, is_float = np.float32(minimum(minimum(fa, fb), fc)), True
        elif op == O.OP_V_LDEXP_F32:
            f, is_float = np.float32(np.float64(fa) * 2.0 ** max(min(sext32(b), 400), -400)), True
        elif op == O.OP_V_DIV_FMAS_F32:  # VCC from the register, not an operand
            scale = 2.0 ** 32 if (np.int64(S[w, VCC + lane // 32]) >> (lane % 32)) & 1 else 1.0
            f, is_float = np.float32(fma32(fa, fb, fc) * scale), True
        elif op == O.OP_V_DIV_FIXUP_F32:
            f, is_float = div_fixup(fa, fb, fc, b, c), True
        elif op == O.OP_V_DIV_SCALE_F32:
            f, bit = div_scale(fa, fb, fc, b, c)
            is_float = True
            if ex >> lane & 1:
                carry_out |= np.int64(bit) << lane
        elif op == O.OP_V_ADD_U32:
            r = a + b
        elif op == O.OP_V_SUB_U32:
            r = a - b
        elif op == O.OP_V_SUBREV_U32:
            r = b - a
        elif op == O.OP_V_ADD_CO_U32 or op == O.OP_V_ADDC_CO_U32:
            r = a + b + (cin if op == O.OP_V_ADDC_CO_U32 else 0)
            if ex >> lane & 1 and r >> 32:
                carry_out |= np.int64(1) << lane
        elif op == O.OP_V_SUB_CO_U32 or op == O.OP_V_SUBB_CO_U32:
            k = cin if op == O.OP_V_SUBB_CO_U32 else 0
            r = a - b - k
            if ex >> lane & 1 and b + k > a:
                carry_out |= np.int64(1) << lane
        elif op == O.OP_V_SUBREV_CO_U32 or op == O.OP_V_SUBBREV_CO_U32:
            k = cin if op == O.OP_V_SUBBREV_CO_U32 else 0
            r = b - a - k
            if ex >> lane & 1 and a + k > b:
                carry_out |= np.int64(1) << lane
        # 16-bit results zero the upper half on gfx9-family targets (LLVM
        # GCNSubtarget::zeroesHigh16BitsOfDest).
        elif op == O.OP_V_ADD_U16:
            r = (a + b) & 0xFFFF
        elif op == O.OP_V_SUB_U16:
            r = (a - b) & 0xFFFF
        elif op == O.OP_V_MUL_LO_U16:
            r = ((a & 0xFFFF) * (b & 0xFFFF)) & 0xFFFF
        elif op == O.OP_V_LSHRREV_B16:
            r = (b & 0xFFFF) >> (a & 15)
        elif op == O.OP_V_LSHLREV_B16:
            r = ((b & 0xFFFF) << (a & 15)) & 0xFFFF
        elif op == O.OP_V_ASHRREV_I16:
            r = (sext16(b) >> (a & 15)) & 0xFFFF
        elif op == O.OP_V_ASHRREV_I32:
            r = sext32(b) >> (a & 31)
        elif op == O.OP_V_LSHLREV_B32:
            r = b << (a & 31)
        elif op == O.OP_V_LSHRREV_B32:
            r = b >> (a & 31)
        elif op == O.OP_V_AND_B32:
            r = a & b
        elif op == O.OP_V_OR_B32:
            r = a | b
        elif op == O.OP_V_XOR_B32:
            r = a ^ b
        elif op == O.OP_V_MAX_I32:
            r = a if sext32(a) > sext32(b) else b
        elif op == O.OP_V_MIN_I32:
            r = a if sext32(a) < sext32(b) else b
        elif op == O.OP_V_MAX_U32:
            r = max(a, b)
        elif op == O.OP_V_MIN_U32:
            r = min(a, b)
        elif op == O.OP_V_MUL_U32_U24:
            r = (a & 0xFFFFFF) * (b & 0xFFFFFF)
        elif op == O.OP_V_MUL_I32_I24:
            r = sext24(a) * sext24(b)
        elif op == O.OP_V_MAD_U32_U24:
            r = (a & 0xFFFFFF) * (b & 0xFFFFFF) + c
        elif op == O.OP_V_MAD_I32_I24:
            r = sext24(a) * sext24(b) + c
        elif op == O.OP_V_MUL_LO_U32:
            r = a * b
        elif op == O.OP_V_MUL_HI_U32:
            r = mul_hi_u32(a, b)
        elif op == O.OP_V_MUL_HI_I32:
            r = (sext32(a) * sext32(b)) >> 32
        elif op == O.OP_V_CNDMASK_B32:
            r = b if cin else a
        elif op == O.OP_V_BCNT_U32_B32:
            r = b
            x = a
            for _ in range(32):
                r += x & 1
                x >>= 1
        elif op == O.OP_V_ADD3_U32:
            r = a + b + c
        elif op == O.OP_V_XAD_U32:
            r = (a ^ b) + c
        elif op == O.OP_V_ADD_LSHL_U32:
            r = (a + b) << (c & 31)
        elif op == O.OP_V_LSHL_ADD_U32:
            r = (a << (b & 31)) + c
        elif op == O.OP_V_LSHL_OR_B32:
            r = (a << (b & 31)) | c
        elif op == O.OP_V_AND_OR_B32:
            r = (a & b) | c
        elif op == O.OP_V_OR3_B32:
            r = a | b | c
        elif op == O.OP_V_BFI_B32:
            r = (a & b) | (~a & c)
        elif op == O.OP_V_ALIGNBIT_B32:
            r = ((a << 32 | b) >> (c & 31)) if (c & 31) else b
        elif op == O.OP_V_BFE_U32 or op == O.OP_V_BFE_I32:
            width = c & 31
            r = (a >> (b & 31)) & ((np.int64(1) << width) - 1)
            if op == O.OP_V_BFE_I32 and width and r >> (width - 1) & 1:
                r -= np.int64(1) << width
        elif op == O.OP_V_BITOP3_B32:  # bit n of TTBL: the minterm S0 S1 S2 = n (CDNA4 pseudocode)
            table = P[i, F_FORMAT]
            r = 0
            for n in range(8):
                if table >> n & 1:
                    r |= (a if n & 4 else ~a) & (b if n & 2 else ~b) & (c if n & 1 else ~c)
        elif op == O.OP_V_BITOP3_B16:  # as V_BITOP3_B32 on the low halves; the high half zeroed
            table = P[i, F_FORMAT]
            r = 0
            for n in range(8):
                if table >> n & 1:
                    r |= (a if n & 4 else ~a) & (b if n & 2 else ~b) & (c if n & 1 else ~c)
            r &= 0xFFFF
        elif op == O.OP_V_MIN3_I32:
            r = min(sext32(a), sext32(b), sext32(c))
        elif op == O.OP_V_MED3_I32:
            x, y, z = sext32(a), sext32(b), sext32(c)
            r = max(min(x, y), min(max(x, y), z))
        elif op == O.OP_V_MED3_U32:
            r = max(min(a, b), min(max(a, b), c))
        elif op == O.OP_V_PERM_B32:  # bytes 0-3 from S1, 4-7 from S0
            data = b | a << 32
            r = 0
            for byte in range(4):
                sel = c >> (8 * byte) & 0xFF
                if sel >= 13:
                    v = 0xFF
                elif sel == 12:
                    v = 0
                elif sel >= 8:
                    v = 0xFF if data >> (8 * (2 * (sel - 8) + 1) + 7) & 1 else 0
                else:
                    v = data >> (8 * sel) & 0xFF
                r |= v << (8 * byte)
        elif op == O.OP_V_LSHLREV_B64:
            two = True
            x = b | np.int64(V[w, s1 - 256 + 1, lane]) << 32 if s1 >= 256 else sval(S, w, s1, lit, True)
            x = x << (a & 63)
            r = x & M32
            T[4, lane] = x >> 32 & M32
        elif op == O.OP_V_LSHL_ADD_U64:
            two = True
            x = a | np.int64(V[w, s0 - 256 + 1, lane]) << 32 if s0 >= 256 else sval(S, w, s0, lit, True)
            y = c | np.int64(V[w, s2 - 256 + 1, lane]) << 32 if s2 >= 256 else sval(S, w, s2, lit, True)
            x = (x << (b & 7)) + y
            r = x & M32
            T[4, lane] = x >> 32 & M32
        elif op == O.OP_V_MAD_U64_U32:
            two = True
            y = c | np.int64(V[w, s2 - 256 + 1, lane]) << 32 if s2 >= 256 else sval(S, w, s2, lit, True)
            product = np.uint64(a) * np.uint64(b)
            total = product + np.uint64(y)
            if ex >> lane & 1 and total < product:
                carry_out |= np.int64(1) << lane
            r = np.int64(total & np.uint64(M32))
            T[4, lane] = np.int64(total >> np.uint64(32))
        elif op == O.OP_V_CVT_PK_BF16_F32:
            r = f32bits_to_bf16(a) | f32bits_to_bf16(b) << 16
        elif op == O.OP_V_CVT_PK_FP8_F32:  # OPSEL[3] picks the half written; the other is kept
            pair = f32_to_fp8(fa) | f32_to_fp8(fb) << 8
            old = np.int64(V[w, dst, lane])
            r = (old & 0xFFFF) | pair << 16 if P[i, F_OPSEL] & 8 else (old & 0xFFFF0000) | pair
        elif op == O.OP_V_CVT_SCALEF32_PK_F32_FP8 or op == O.OP_V_CVT_SCALEF32_PK_BF16_FP8:
            # The fp8 pair in S0's word OPSEL[0], each times 2^(exponent field of S1 - 127)
            # (CDNA4 pseudocode: scale = exponent(S1.f32); fp8_to_f32_scale / fp8_to_bf16_scale).
            # Exact in f32 (3 mantissa bits, exponents within f32's range); bf16 rounds once.
            half = a >> (16 * (P[i, F_OPSEL] & 1)) & 0xFFFF
            scale = 2.0 ** np.float64((b >> 23 & 0xFF) - 127)
            TF[3, lane] = np.float32(fp8_to_f64(half & 0xFF) * scale)
            TF[4, lane] = np.float32(fp8_to_f64(half >> 8) * scale)
            if op == O.OP_V_CVT_SCALEF32_PK_F32_FP8:
                two = True
                continue
            r = f32bits_to_bf16(np.int64(T[3, lane])) | f32bits_to_bf16(np.int64(T[4, lane])) << 16
        elif op == O.OP_V_CVT_PK_F32_FP8:
            two = True
            half = a & 0xFFFF  # an SDWA WORD_1 select already moved the high half down
            TF[3, lane] = np.float32(fp8_to_f64(half & 0xFF))
            TF[4, lane] = np.float32(fp8_to_f64(half >> 8))
            continue
        if is_float:
            TF[3, lane] = f
        else:
            T[3, lane] = r & M32
    write(V, T, w, dst, 3, ex)
    if two:
        write(V, T, w, dst + 1, 4, ex)
    if P[i, F_SDST] or op == O.OP_V_DIV_SCALE_F32:
        set64(S, w, P[i, F_SDST] if P[i, F_SDST] else VCC, carry_out)


@njit(cache=True)
def crosslane(P, i, w, S, V, T, ex, op):
    """readlane / readfirstlane / writelane / mbcnt / permlane swaps (CDNA4 pseudocode)."""
    lit, dst, s0, s1 = P[i, F_LIT], P[i, F_DST], P[i, F_SRC0], P[i, F_SRC1]
    if op == O.OP_V_READFIRSTLANE_B32:
        lane = 0
        for k in range(64):
            if ex >> k & 1:
                lane = k
                break
        S[w, dst] = V[w, s0 - 256, lane] if s0 >= 256 else sval(S, w, s0, lit, False)
    elif op == O.OP_V_READLANE_B32:
        S[w, dst] = V[w, s0 - 256, sval(S, w, s1, lit, False) & 63]
    elif op == O.OP_V_WRITELANE_B32:
        V[w, dst, sval(S, w, s1, lit, False) & 63] = sval(S, w, s0, lit, False)
    elif op == O.OP_V_MBCNT_LO_U32_B32 or op == O.OP_V_MBCNT_HI_U32_B32:
        read(S, V, T, w, s0, lit, 0, 0)
        read(S, V, T, w, s1, lit, 1, 0)
        for lane in range(64):
            below = (np.int64(1) << lane) - 1 if lane < 63 else np.int64(0x7FFFFFFFFFFFFFFF)
            part = below & M32 if op == O.OP_V_MBCNT_LO_U32_B32 else below >> 32 & M32
            x = np.int64(T[0, lane]) & part
            n = 0
            for _ in range(32):
                n += x & 1
                x >>= 1
            T[3, lane] = (np.int64(T[1, lane]) + n) & M32
        write(V, T, w, dst, 3, ex)
    else:  # V_PERMLANE16_SWAP_B32 / V_PERMLANE32_SWAP_B32: swap VDST's and SRC0's lane halves
        src = s0 - 256
        if op == O.OP_V_PERMLANE16_SWAP_B32:
            for half in range(2):
                for lane in range(16):
                    a, b = half * 32 + lane, half * 32 + lane + 16
                    t = V[w, src, a]
                    V[w, src, a] = V[w, dst, b]
                    V[w, dst, b] = t
        else:
            for lane in range(32):
                t = V[w, src, lane]
                V[w, src, lane] = V[w, dst, lane + 32]
                V[w, dst, lane + 32] = t


@njit(cache=True)
def bf16_value(h):
    """The value of bf16 bits `h` (f32's upper half)."""
    e, m = h >> 7 & 0xFF, h & 0x7F
    if e == 255:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = m * 2.0 ** -133
    else:
        v = (1.0 + m / 128.0) * 2.0 ** (e - 127)
    return -v if h >> 15 & 1 else v


@njit(cache=True, error_model="numpy")
def mfma_f32_16x16_dense(w, V, VF, dst, a0, b0, c0, per_lane):
    """V_MFMA_F32_16X16X4_F32 (`per_lane` 1, f32), V_MFMA_F32_16X16X16_BF16 (4) and
    V_MFMA_F32_16X16X32_BF16 (8): lane 16 q + i holds A[i, k] and B[k, i] for k = per_lane q + e,
    element e of the lane's operand (an f32 VGPR, or the e-th bf16 of its VGPRs, low half first);
    lane 16 g + c, element e of D is D[4 g + e, c]. (AMD's matrix instruction calculator for
    v_mfma_f32_16x16x4f32 / _16x16x16bf16_1k and gfx950's _16x16x32_bf16; Triton
    AccelerateAMDMatmul.cpp kWidth 4 / 8 for the bf16 forms; the result layout is the scaled
    MFMA's, mfma_layout.D_ROW.) The products and C are summed in f64 and rounded once."""
    K = 4 * per_lane
    A = np.empty((16, K))
    B = np.empty((16, K))  # B[col, k]
    for lane in range(64):
        i, q = lane % 16, lane // 16
        for e in range(per_lane):
            k = per_lane * q + e
            if per_lane == 1:
                A[i, k], B[i, k] = VF[w, a0, lane], VF[w, b0, lane]
            else:
                shift = 16 * (e % 2)
                A[i, k] = bf16_value(V[w, a0 + e // 2, lane] >> shift & 0xFFFF)
                B[i, k] = bf16_value(V[w, b0 + e // 2, lane] >> shift & 0xFFFF)
    d = np.empty((4, 64), np.float32)
    for lane in range(64):
        g, col = lane // 16, lane % 16
        for e in range(4):
            row = 4 * g + e
            acc = np.float64(VF[w, c0 - 256 + e, lane]) if c0 >= 256 else np.float64(0.0)
            for k in range(K):
                acc += A[row, k] * B[col, k]
            d[e, lane] = np.float32(acc)
    for e in range(4):
        VF[w, dst + e] = d[e]


@njit(cache=True, error_model="numpy")
def mfma(P, i, w, V, VF, ex, CTL):
    """The dense MFMAs (`mfma_f32_16x16_dense`), and
    V_MFMA_SCALE_F32_16X16X128_F8F6F4: D = C + (A x scaleA)(B x scaleB)^T, summed in f64 and
    rounded to f32 once (the hardware's summation order inside the 128-step is undocumented).
    The operands are decoded through value tables (FP8_VALUE, E2M1) with their E8M0 scales
    applied, then each result element is one 128-term dot product."""
    if ex != -1:
        return fault(CTL, FAULT_EXEC, w, i, -1, ex, 0, 0)
    dst, a0, b0, c0 = P[i, F_DST], P[i, F_SRC0] - 256, P[i, F_SRC1] - 256, P[i, F_SRC2]
    op = P[i, F_OP]
    if op == O.OP_V_MFMA_F32_16X16X4_F32 or op == O.OP_V_MFMA_F32_16X16X16_BF16 or op == O.OP_V_MFMA_F32_16X16X32_BF16:
        per_lane = 1 if op == O.OP_V_MFMA_F32_16X16X4_F32 else 4 if op == O.OP_V_MFMA_F32_16X16X16_BF16 else 8
        mfma_f32_16x16_dense(w, V, VF, dst, a0, b0, c0, per_lane)
        return NO_FAULT
    fa, fb = P[i, F_FORMAT] & 0xF, P[i, F_FORMAT] >> 4
    sa, sb = P[i, F_SCALE0] - 256, P[i, F_SCALE1] - 256
    A = np.empty((16, 128))
    B = np.empty((16, 128))
    R = np.empty((16, 4))  # (row, K block) -> scale of the operand being decoded
    for k in range(2):
        M = A if k == 0 else B
        base = a0 if k == 0 else b0
        fmt = fa if k == 0 else fb
        scales = sa if k == 0 else sb
        for lane in range(64):  # the scale of (row r, K block b) is byte 0 of lane 16 b + r
            R[lane % 16, lane // 16] = SCALE_VALUE[V[w, scales, lane] & 0xFF]
        for lane in range(64):
            row = lane % 16
            if fmt == 0:
                for byte in range(32):
                    code = V[w, base + byte // 4, lane] >> (8 * (byte % 4)) & 0xFF
                    kk = K_OF_BYTE[lane, byte]
                    M[row, kk] = FP8_VALUE[code] * R[row, kk // 32]
            else:
                for byte in range(16):
                    code = V[w, base + byte // 4, lane] >> (8 * (byte % 4)) & 0xFF
                    lo, hi = K_OF_NIBBLE[lane, 2 * byte], K_OF_NIBBLE[lane, 2 * byte + 1]
                    M[row, lo] = E2M1[code & 0xF] * R[row, lo // 32]
                    M[row, hi] = E2M1[code >> 4] * R[row, hi // 32]
    for lane in range(64):
        g, col = lane // 16, lane % 16
        for e in range(4):
            acc = np.float64(VF[w, c0 - 256 + e, lane]) if c0 >= 256 else np.float64(0.0)
            row = 4 * g + e
            for kk in range(128):
                acc += A[row, kk] * B[col, kk]
            VF[w, dst + e, lane] = np.float32(acc)
    return NO_FAULT


# ------------------------------------------------------------------------------ the schedule --

@njit(cache=True)
def release_barrier(WS, CTA, c):
    """Free the workgroup's waves at the barrier once every live wave has arrived."""
    if CTA[c, 1] > 0 and CTA[c, 1] >= CTA[c, 0]:
        CTA[c, 1] = 0
        first = CTA[c, 2]
        k = first
        while k < WS.shape[0] and WS[k, WS_CTA] == c:
            if WS[k, WS_STATUS] == AT_BARRIER:
                WS[k, WS_STATUS] = RUNNING
            k += 1


@njit(cache=True, error_model="numpy")
def run_wave(P, w, S, V, VF, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, TF):
    """Run wave w until it blocks (barrier, sleep, end), faults, or has run QUANTUM instructions."""
    c, d = WS[w, WS_CTA], WS[w, WS_DEVICE]
    i = WS[w, WS_PC]
    for _ in range(QUANTUM):
        op = P[i, F_OP]
        klass = P[i, F_CLASS]
        CNT[d, klass] += 1
        WS[w, WS_COUNT] += 1
        ex = exec_of(S, w)
        nxt = P[i, F_NEXT]
        if klass == O.SALU:
            salu(P, i, w, S, op)
        elif klass == O.VALU or klass == O.PACKED or klass == O.CONVERT:
            valu(P, i, w, S, V, T, TF, ex, op)
        elif klass == O.BRANCH:
            if op == O.OP_S_ENDPGM:
                WS[w, WS_STATUS] = DONE
                WS[w, WS_PC] = i
                CTA[c, 0] -= 1
                CTL[C_EVENTS] += 1
                release_barrier(WS, CTA, c)
                return
            take = True
            if op == O.OP_S_CBRANCH_SCC0:
                take = S[w, SCC] == 0
            elif op == O.OP_S_CBRANCH_SCC1:
                take = S[w, SCC] != 0
            elif op == O.OP_S_CBRANCH_VCCZ:
                take = S[w, VCC] == 0 and S[w, VCC + 1] == 0
            elif op == O.OP_S_CBRANCH_VCCNZ:
                take = S[w, VCC] != 0 or S[w, VCC + 1] != 0
            elif op == O.OP_S_CBRANCH_EXECZ:
                take = ex == 0
            elif op == O.OP_S_CBRANCH_EXECNZ:
                take = ex != 0
            if take:
                nxt = P[i, F_TARGET]
        elif klass == O.SYNC:
            if op == O.OP_S_BARRIER:
                CNT[d, CNT_BARRIERS] += 1
                WS[w, WS_STATUS] = AT_BARRIER
                WS[w, WS_PC] = nxt
                CTA[c, 1] += 1
                CTL[C_EVENTS] += 1
                release_barrier(WS, CTA, c)
                return
            if op == O.OP_S_SLEEP:
                CNT[d, CNT_POLLS] += 1
                WS[w, WS_STATUS] = PARKED
                WS[w, WS_PARK] = CTL[C_EPOCH]
                WS[w, WS_PC] = nxt
                return
            if op == O.OP_S_TRAP:
                fault(CTL, FAULT_TRAP, w, i, -1, 0, 0, P[i, F_OFFSET] & 0xFF)
                WS[w, WS_PC] = i
                return
            # S_WAITCNT, S_NOP: every access has completed when its instruction ends
        elif klass == O.SMEM:
            if smem(P, i, w, S, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, d, op):
                WS[w, WS_PC] = i
                return
        elif klass == O.BUFFER or klass == O.GLOBAL or klass == O.ATOMIC:
            if vmem(P, i, w, S, V, T, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, d, ex, op):
                WS[w, WS_PC] = i
                return
        elif klass == O.SCRATCH:
            if scratch(P, i, w, S, V, WS, ALLOC, BUFS, ABYTES, CNT, CTL, d, ex, op):
                WS[w, WS_PC] = i
                return
        elif klass == O.LDS or op == O.OP_DS_SWIZZLE_B32 or op == O.OP_DS_BPERMUTE_B32:
            if lds_op(P, i, w, V, T, LDS, CTA, CNT, CTL, c, d, ex, op):
                WS[w, WS_PC] = i
                return
        elif klass == O.CROSSLANE:
            crosslane(P, i, w, S, V, T, ex, op)
        elif klass == O.MFMA:
            if mfma(P, i, w, V, VF, ex, CTL):
                WS[w, WS_PC] = i
                return
        # CACHE (buffer_wbl2 / buffer_inv): memory is sequentially consistent, nothing to write back
        i = nxt
    WS[w, WS_PC] = i


@njit(cache=True)
def all_blocked(WS):
    """Every live wave is parked (s_sleep) or at a barrier: none runs until a store arrives."""
    for w in range(WS.shape[0]):
        if WS[w, WS_STATUS] == RUNNING:
            return False
    return True


@njit(cache=True, error_model="numpy")
def run(P, S, V, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, budget, external):
    """Round-robin over every wave until all end, one faults, none can progress, or `budget`
    wave-instructions ran. A pass in which no wave stored, ended or reached a barrier is idle:
    the emulated clock jumps ahead (so time-bounded waits expire) and parked waves poll again;
    IDLE_ROUNDS idle passes in a row are a deadlock. With `external` writers (another process
    stores into registered memory) an idle pass in which every live wave is parked or at a
    barrier returns IDLE at once and the clock does not jump: the caller waits in wall time and
    advances the clock by it."""
    VF = V.view(np.float32)
    TF = T.view(np.float32)
    waves = WS.shape[0]
    ran = np.int64(0)
    while True:
        stores, events = CTL[C_STORES], CTL[C_EVENTS]
        CTL[C_PASSES] += 1
        live = 0
        for w in range(waves):
            status = WS[w, WS_STATUS]
            if status == DONE:
                continue
            live += 1
            if status == AT_BARRIER or (status == PARKED and WS[w, WS_PARK] == CTL[C_EPOCH]):
                continue
            WS[w, WS_STATUS] = RUNNING
            before = WS[w, WS_COUNT]
            run_wave(P, w, S, V, VF, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, TF)
            ran += WS[w, WS_COUNT] - before
            if CTL[C_FAULT] != NO_FAULT:
                return FAULTED
        if live == 0:
            return FINISHED
        if ran > budget:
            return BUDGET
        if CTL[C_STORES] == stores and CTL[C_EVENTS] == events:
            if external:  # only another process's store (or the wall clock) can free a blocked wave
                if all_blocked(WS):
                    return IDLE
                continue
            CTL[C_IDLE] += 1
            if CTL[C_IDLE] > IDLE_ROUNDS:
                return DEADLOCKED
            for d in range(CLOCK.shape[0]):
                CLOCK[d] += np.int64(1000) << min(CTL[C_IDLE], 40)
                CNT[d, CNT_IDLE] += 1
            CTL[C_EPOCH] += 1
        else:
            CTL[C_IDLE] = 0
