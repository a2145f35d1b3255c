"""The interpreter loop: every wave of a launch (of several devices at once) run to completion in
numba-compiled loops, round-robin in quanta, with barriers, parked spinners and counters.

`run_wave` dispatches each instruction on its counter class to its family's module (`salu`,
`valu`, `crosslane`, `lds`, `memory`, `mfma`), and runs the branches and the wave-state changes
(`s_endpgm`, `s_barrier`, `s_sleep`, `s_trap`) itself. Semantics follow AMD's CDNA4 ISA
pseudocode (tinygrad's `runtime/autogen/amd/cdna/str_pcode.py` holds it by operation name; each
branch of the families is named by its operation). Written by hand where the pseudocode is
silent or absent: the scaled MFMA (`mfma_layout.py`), `ds_swizzle` bit-mask mode, `s_waitcnt` /
`s_nop` (no-ops: every access completes at once), `s_barrier`, `s_sleep` (parks the wave until
memory changes), `buffer_wbl2` / `buffer_inv` (no-ops in a sequentially consistent memory;
counted), `s_trap` (fails the launch) and buffer range checks. In the weak-memory mode
(`weak.py`) `s_waitcnt vmcnt`, `buffer_wbl2` and `buffer_inv` act on its caches and queues. The
arrays: `state.py`.
"""

from __future__ import annotations

import numpy as np

from . import ops as O
from .crosslane import crosslane
from . import weak
from .clock.trace import R_ON, record
from .decode import F_CLASS, F_FLAGS, F_NEXT, F_OFFSET, F_OP, F_TARGET, FLAG_SC0, FLAG_SC1
from .jit_cache import njit
from .lds import lds_op
from .memory import scratch, smem, vmem
from .mfma import mfma
from .operands import exec_of, fault
from .profile import CYCLES, TURNS, lap, now
from .salu import salu
from .state import (AT_BARRIER, BUDGET, C_EPOCH, C_EVENTS, C_FAULT, C_IDLE, C_PASSES, C_STORES, CNT_BARRIERS, CNT_IDLE,
                    CNT_POLLS, DEADLOCKED, DONE, FAULT_TRAP, FAULT_WEAK_FULL, FAULTED, FINISHED, IDLE, IDLE_ROUNDS, NO_FAULT, PARKED,
                    QUANTUM, RUNNING, SCC, VCC, WS_COUNT, WS_CTA, WS_DEVICE, WS_PARK, WS_PC, WS_STATUS)
from .valu import valu


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
def run_wave(P, w, S, V, VF, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, TF, W, TR, PROF):
    """Run wave w until it blocks (barrier, sleep, end), faults, or has run QUANTUM instructions;
    with the clock on (`TR`, `clock/trace.py`) each instruction is recorded before it runs. With a
    `PROF` table (`profile.py`) each instruction's cycles are charged to its operation."""
    c, d = WS[w, WS_CTA], WS[w, WS_DEVICE]
    tracing = TR[0][R_ON] != 0
    i = WS[w, WS_PC]
    profiling = PROF.shape[1] != 0
    last, since = -1, np.int64(0)
    for _ in range(QUANTUM):
        op = P[i, F_OP]
        if profiling:
            last, since = lap(PROF, last, since, op)
        klass = P[i, F_CLASS]
        CNT[d, klass] += 1
        WS[w, WS_COUNT] += 1
        ex = exec_of(S, w)
        nxt = P[i, F_NEXT]
        if tracing:
            record(TR, P, i, w, S, V, ALLOC, ex, op, klass)
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
            if op == O.OP_S_WAITCNT and W[0][weak.O_ON] and not weak.wait_vmcnt(W, w, P[i, F_OFFSET]):
                fault(CTL, FAULT_WEAK_FULL, w, i, -1, 0, 0, 0)
                WS[w, WS_PC] = i
                return
            # else S_WAITCNT, S_NOP: every access has completed when its instruction ends
        elif klass == O.SMEM:
            if smem(P, i, w, S, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, d, op, W):
                WS[w, WS_PC] = i
                return
        elif klass == O.BUFFER or klass == O.GLOBAL or klass == O.ATOMIC:
            if vmem(P, i, w, S, V, T, WS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, d, ex, op, W):
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
        elif klass == O.CACHE and W[0][weak.O_ON]:
            if op == O.OP_BUFFER_WBL2:
                if not weak.wbl2(W, w, P[i, F_FLAGS] & FLAG_SC1 != 0):
                    fault(CTL, FAULT_WEAK_FULL, w, i, -1, 0, 0, 0)
                    WS[w, WS_PC] = i
                    return
            else:
                weak.inv(W, w, P[i, F_FLAGS] & (FLAG_SC0 | FLAG_SC1) != 0)
        # else CACHE: memory is sequentially consistent, nothing to write back or invalidate
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
def run(P, S, V, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, budget, external, W, TR, PROF):
    """Round-robin over every wave until all end, one faults, none can progress, or `budget`
    wave-instructions ran. A pass in which no wave stored, ended or reached a barrier is idle:
    the emulated clock jumps ahead (so time-bounded waits expire) and parked waves poll again;
    IDLE_ROUNDS idle passes in a row are a deadlock. With `external` writers (another process
    stores into registered memory) an idle pass in which every live wave is parked or at a
    barrier returns IDLE at once and the clock does not jump: the caller waits in wall time and
    advances the clock by it. `W`: the weak-memory mode's state (`weak.py`); a wave's queued
    stores complete as it leaves its turn. `TR`: the clock's recorder (`clock/trace.py`). `PROF`:
    the profile's table (`profile.py`), or one with no columns."""
    VF = V.view(np.float32)
    TF = T.view(np.float32)
    waves = WS.shape[0]
    ran = np.int64(0)
    weak_on = W[0][weak.O_ON] != 0
    profiling = PROF.shape[1] != 0
    turn = np.int64(0)
    while True:
        stores, events = CTL[C_STORES], CTL[C_EVENTS]
        CTL[C_PASSES] += 1
        live = 0
        for w in range(waves):
            status = WS[w, WS_STATUS]
            if status == DONE:
                if weak_on and not weak.end_turn(W, w):  # the end of the program leaves stores in flight
                    fault(CTL, FAULT_WEAK_FULL, w, WS[w, WS_PC], -1, 0, 0, 0)
                    return FAULTED
                continue
            live += 1
            if status == AT_BARRIER or (status == PARKED and WS[w, WS_PARK] == CTL[C_EPOCH]):
                continue
            WS[w, WS_STATUS] = RUNNING
            before = WS[w, WS_COUNT]
            if profiling:
                turn = now()
            run_wave(P, w, S, V, VF, WS, CTA, LDS, ALLOC, BUFS, TOUCH, ABYTES, CNT, CTL, CLOCK, T, TF, W, TR, PROF)
            if profiling:
                PROF[CYCLES, TURNS] += now() - turn
            if weak_on and not weak.end_turn(W, w) and CTL[C_FAULT] == NO_FAULT:
                fault(CTL, FAULT_WEAK_FULL, w, WS[w, WS_PC], -1, 0, 0, 0)
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

