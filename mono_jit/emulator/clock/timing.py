"""The timing pass: a launch's event trace (`trace.py`) replayed in modelled time with the
parameters of `params.py`, waves taken in the order of their modelled clocks (a heap), so that
the order the functional run took them in does not leak into time.

What a wave pays, in order (the categories of its time):
- issue: `issue` cycles per instruction (transcendentals `valu_trans`, `s_nop N` its N+1 wait
  states when more), the event's own instruction included;
- mfma: waiting for its SIMD's matrix pipe, which an MFMA holds for passes x 4 cycles;
- latency, queue, handoff: stalls at `s_waitcnt` (and at the end) for vector memory (completing
  in order), LDS (in order) and scalar memory (out of order), split into the level's latency,
  the wait for a bandwidth server (the CU's L1 and LDS, the XCD's L2, the device's Infinity
  Cache and HBM: each serves bytes at its rate in modelled time, first come first served) and
  the wait for another wave's store;
- barrier: `s_barrier` releases its workgroup at the last arrival + `barrier_cost`;
- sleep: `s_sleep N` outside a poll costs 64 N;
- dispatch: waves start `dispatch_per_wave` apart on each XCD.

Hand-offs: a load that read a word another wave stored completes no earlier than that store's
completion + the visibility latency between them (same XCD, another XCD, another device). A
failed poll (a load the trace flags as followed by `s_sleep`) and everything up to the wave's
next load are dropped, so a successful poll completes at max(the wave's own time at the poll,
the writer's store + visibility), however many times the emulator let the spinner look.
"""

from __future__ import annotations

import math

import numpy as np

from . import params
from .trace import (E_ARG, E_BYTES, E_FLAGS, E_HBM, E_KIND, E_L2, E_MALL, E_MFMA_BF16, E_MFMA_BF16_K16,
                    E_MFMA_F4, E_MFMA_F8, E_MFMA_F32, E_NOP_STATES, E_NOPS, E_PLAIN, E_TRANS, E_WAVE, E_WRITER,
                    FAILED_POLL, K_ATOMIC, K_BARRIER, K_CLOCK, K_END, K_INV, K_LDS, K_SLEEP, K_SLOAD, K_VLOAD,
                    K_VSTORE, K_WAITCNT, K_WBL2, LINE)
from ..errors import EmulatorError
from ..jit_cache import njit

CATEGORIES = ("issue", "mfma", "latency", "queue", "handoff", "barrier", "sleep", "dispatch")
(CAT_ISSUE, CAT_MFMA, CAT_LATENCY, CAT_QUEUE, CAT_HANDOFF, CAT_BARRIER, CAT_SLEEP, CAT_DISPATCH) = range(8)

_I = params.INDEX
P_ISSUE, P_TRANS = _I["issue"], _I["valu_trans"]
P_F8, P_F4, P_F32, P_BF16, P_BF16_K16 = (_I["mfma_scale_f8_passes"], _I["mfma_scale_f4_passes"],
                                         _I["mfma_f32_16x16x4_passes"], _I["mfma_bf16_16x16x32_passes"],
                                         _I["mfma_bf16_16x16x16_passes"])
P_LDS_LAT, P_LDS_BW = _I["lds_latency"], _I["lds_bytes_per_cycle"]
P_L2_LAT, P_MALL_LAT, P_HBM_LAT = _I["l2_latency"], _I["mall_latency"], _I["hbm_latency"]
P_CLOCK_LAT, P_ATOMIC_LAT = _I["smem_clock_latency"], _I["atomic_latency"]
P_L1_BW, P_L2_BW, P_MALL_BW = _I["l1_bytes_per_cycle"], _I["l2_bytes_per_cycle"], _I["mall_bytes_per_cycle"]
P_VIS_XCD, P_VIS_OTHER_XCD, P_VIS_DEVICE = _I["vis_same_xcd"], _I["vis_other_xcd"], _I["vis_other_device"]
P_WBL2, P_INV, P_BARRIER, P_SLEEP = _I["wbl2_cost"], _I["inv_cost"], _I["barrier_cost"], _I["sleep_unit"]

QCAP = 64  # vmcnt counts to 63: a 64th vector access waits for the oldest
LCAP = 32
READY, AT_BARRIER, BLOCKED, ENDED = range(4)
NOT_YET = math.inf  # an event's completion before the pass reached it


class TimingError(EmulatorError):
    """The trace cannot be replayed (it overflowed, or no wave can advance)."""


@njit(cache=True)
def _push(HK, HW, n, key, w):
    k = n
    HK[k], HW[k] = key, w
    while k > 0:
        p = (k - 1) // 2
        if HK[p] < HK[k] or (HK[p] == HK[k] and HW[p] < HW[k]):
            break
        HK[p], HK[k] = HK[k], HK[p]
        HW[p], HW[k] = HW[k], HW[p]
        k = p
    return n + 1


@njit(cache=True)
def _pop(HK, HW, n):
    w = HW[0]
    n -= 1
    HK[0], HW[0] = HK[n], HW[n]
    k = 0
    while True:
        a, b, m = 2 * k + 1, 2 * k + 2, k
        if a < n and (HK[a] < HK[m] or (HK[a] == HK[m] and HW[a] < HW[m])):
            m = a
        if b < n and (HK[b] < HK[m] or (HK[b] == HK[m] and HW[b] < HW[m])):
            m = b
        if m == k:
            break
        HK[m], HK[k] = HK[k], HK[m]
        HW[m], HW[k] = HW[k], HW[m]
        k = m
    return w, n


@njit(cache=True)
def _stall(CAT, w, s, h, q):
    """Charge a wait of s cycles: first to the hand-off, then to queueing, the rest to latency."""
    a = min(s, h)
    b = min(s - a, q)
    CAT[w, CAT_HANDOFF] += a
    CAT[w, CAT_QUEUE] += b
    CAT[w, CAT_LATENCY] += s - a - b


@njit(cache=True)
def _serve(free, k, t, nbytes, rate):
    """Queue nbytes at server k from time t; the delay before they are through."""
    if nbytes <= 0:
        return 0.0
    start = max(t, free[k])
    free[k] = start + nbytes / rate
    return free[k] - t


@njit(cache=True)
def _wait_vm(T, CAT, VMQ, VMH, VMN, w, count):
    """Wait until at most `count` vector accesses of wave w are outstanding (in order)."""
    while VMN[w] > 0 and VMQ[w, VMH[w], 0] <= T[w]:
        VMH[w] = (VMH[w] + 1) % QCAP
        VMN[w] -= 1
    while VMN[w] > count:
        h = VMH[w]
        s = VMQ[w, h, 0] - T[w]
        if s > 0:
            _stall(CAT, w, s, VMQ[w, h, 1], VMQ[w, h, 2])
            T[w] = VMQ[w, h, 0]
        VMH[w] = (h + 1) % QCAP
        VMN[w] -= 1


@njit(cache=True)
def _wait_lgkm(T, CAT, LGQ, LGN, w, count):
    """Wait until at most `count` LDS / scalar accesses of wave w are outstanding (any order)."""
    k = 0
    while k < LGN[w]:
        if LGQ[w, k, 0] <= T[w]:
            LGN[w] -= 1
            LGQ[w, k] = LGQ[w, LGN[w]]
        else:
            k += 1
    while LGN[w] > count:
        m = 0
        for k in range(1, LGN[w]):
            if LGQ[w, k, 0] < LGQ[w, m, 0]:
                m = k
        s = LGQ[w, m, 0] - T[w]
        if s > 0:
            _stall(CAT, w, s, LGQ[w, m, 1], LGQ[w, m, 2])
            T[w] = LGQ[w, m, 0]
        LGN[w] -= 1
        LGQ[w, m] = LGQ[w, LGN[w]]


@njit(cache=True)
def _compute(EV, e, PV, T, CAT, XDL, simd, w):
    """Advance wave w over the instructions folded into event e."""
    issue = PV[P_ISSUE] * (EV[e, E_PLAIN] + EV[e, E_MFMA_F8] + EV[e, E_MFMA_F4] + EV[e, E_MFMA_F32]
                           + EV[e, E_MFMA_BF16] + EV[e, E_MFMA_BF16_K16])
    issue += PV[P_TRANS] * EV[e, E_TRANS] + max(PV[P_ISSUE] * EV[e, E_NOPS], float(EV[e, E_NOP_STATES]))
    busy = 4.0 * (PV[P_F8] * EV[e, E_MFMA_F8] + PV[P_F4] * EV[e, E_MFMA_F4] + PV[P_F32] * EV[e, E_MFMA_F32]
                  + PV[P_BF16] * EV[e, E_MFMA_BF16] + PV[P_BF16_K16] * EV[e, E_MFMA_BF16_K16])
    t0 = T[w]
    t1 = t0 + issue
    t2 = t1
    if busy > 0:
        start = max(t0, XDL[simd])
        XDL[simd] = start + busy
        t2 = max(t1, XDL[simd])
    CAT[w, CAT_ISSUE] += issue
    CAT[w, CAT_MFMA] += t2 - t1
    T[w] = t2


@njit(cache=True)
def _visibility(PV, WDEV, WXCD, writer, reader):
    if WDEV[writer] != WDEV[reader]:
        return PV[P_VIS_DEVICE]
    if WXCD[writer] != WXCD[reader]:
        return PV[P_VIS_OTHER_XCD]
    return PV[P_VIS_XCD]


@njit(cache=True)
def _release(T, CAT, STATUS, ARRIVED, BMAX, CFIRST, CCOUNT, HK, HW, n, c, cost):
    """Free workgroup c's waves at its barrier: at the last arrival + cost."""
    release = BMAX[c] + cost
    for w in range(CFIRST[c], CFIRST[c] + CCOUNT[c]):
        if STATUS[w] == AT_BARRIER:
            CAT[w, CAT_BARRIER] += release - T[w]
            T[w] = release
            STATUS[w] = READY
            n = _push(HK, HW, n, T[w], w)
    ARRIVED[c] = 0
    BMAX[c] = 0.0
    return n


@njit(cache=True)
def _wake(STATUS, WAITON, DONE, T, HK, HW, n):
    """Return to the heap every wave blocked on a store the pass has now timed; (heap size,
    waves still blocked)."""
    still = 0
    for v in range(STATUS.shape[0]):
        if STATUS[v] == BLOCKED:
            if DONE[WAITON[v]] != NOT_YET:
                STATUS[v] = READY
                WAITON[v] = -1
                n = _push(HK, HW, n, T[v], v)
            else:
                still += 1
    return n, still


@njit(cache=True)
def replay(EV, ORDER, FIRST, WCTA, WDEV, WXCD, WCU, WSIMD, WL2, WSTART, CFIRST, CCOUNT, PV, n_cu, n_l2, n_dev,
           hbm_bytes_per_cycle):
    """Time every event; returns (per-event completion, per-wave end, per-wave categories,
    status: 0 done, else the number of waves that could not finish)."""
    n_waves = WCTA.shape[0]
    n_ctas = CFIRST.shape[0]
    DONE = np.full(EV.shape[0], NOT_YET)
    T = WSTART.astype(np.float64).copy()
    CAT = np.zeros((n_waves, len(CATEGORIES)))
    CAT[:, CAT_DISPATCH] = T
    WEND = np.zeros(n_waves)
    PTR = FIRST[:-1].copy()
    STATUS = np.zeros(n_waves, np.int64)
    WAITON = np.full(n_waves, -1, np.int64)
    SKIP = np.zeros(n_waves, np.int64)
    VMQ = np.zeros((n_waves, QCAP, 3))
    VMH = np.zeros(n_waves, np.int64)
    VMN = np.zeros(n_waves, np.int64)
    VLAST = np.zeros(n_waves)
    LGQ = np.zeros((n_waves, LCAP, 3))
    LGN = np.zeros(n_waves, np.int64)
    LDSLAST = np.zeros(n_waves)
    LIVE = CCOUNT.copy()
    ARRIVED = np.zeros(n_ctas, np.int64)
    BMAX = np.zeros(n_ctas)
    XDL = np.zeros(n_cu * 4)
    L1 = np.zeros(n_cu)
    LDSF = np.zeros(n_cu)
    L2 = np.zeros(n_l2)
    MALL = np.zeros(n_dev)
    HBM = np.zeros(n_dev)
    HK = np.zeros(n_waves + 1)
    HW = np.zeros(n_waves + 1, np.int64)
    n = 0
    blocked = 0
    for w in range(n_waves):
        n = _push(HK, HW, n, T[w], w)
    issue = PV[P_ISSUE]
    while n > 0:
        w, n = _pop(HK, HW, n)
        if PTR[w] >= FIRST[w + 1]:  # no s_endpgm recorded (a fault or a full trace): the wave stops here
            STATUS[w] = ENDED
            WEND[w] = T[w]
            continue
        e = ORDER[PTR[w]]
        kind = EV[e, E_KIND]
        flags = EV[e, E_FLAGS]
        is_load = kind == K_VLOAD or kind == K_SLOAD or kind == K_ATOMIC
        if kind == K_END or kind == K_BARRIER:
            SKIP[w] = 0
        elif SKIP[w] == 1 or (SKIP[w] == 2 and not is_load):  # inside a failed poll, or its loop head
            if kind == K_SLEEP:
                SKIP[w] = 2
            DONE[e] = T[w]
            PTR[w] += 1
            n = _push(HK, HW, n, T[w], w)
            if blocked > 0 and (kind == K_VSTORE or kind == K_ATOMIC):
                n, blocked = _wake(STATUS, WAITON, DONE, T, HK, HW, n)
            continue
        elif flags & FAILED_POLL:
            if SKIP[w] == 0:
                _compute(EV, e, PV, T, CAT, XDL, WSIMD[w], w)
            SKIP[w] = 1
            DONE[e] = T[w]
            PTR[w] += 1
            n = _push(HK, HW, n, T[w], w)
            continue
        elif SKIP[w] == 2:  # the successful poll
            SKIP[w] = 0
        writer = EV[e, E_WRITER]
        if writer >= 0 and DONE[writer] == NOT_YET:
            STATUS[w] = BLOCKED
            WAITON[w] = writer
            blocked += 1
            continue
        _compute(EV, e, PV, T, CAT, XDL, WSIMD[w], w)
        t = T[w]
        cu = WCU[w]
        if kind == K_VLOAD or kind == K_VSTORE or kind == K_ATOMIC:
            hbm, mall, l2 = EV[e, E_HBM], EV[e, E_MALL], EV[e, E_L2]
            lines = hbm + mall + l2
            if kind == K_VSTORE:
                latency = PV[P_L2_LAT]
                hbm, mall = 0, 0
            else:
                latency = PV[P_HBM_LAT] if hbm else PV[P_MALL_LAT] if mall else PV[P_L2_LAT]
                if kind == K_ATOMIC:
                    latency = max(latency, PV[P_ATOMIC_LAT])
            q = _serve(L1, cu, t, LINE * lines, PV[P_L1_BW])
            q = max(q, _serve(L2, WL2[w], t, LINE * lines, PV[P_L2_BW]))
            q = max(q, _serve(MALL, WDEV[w], t, LINE * mall, PV[P_MALL_BW]))
            q = max(q, _serve(HBM, WDEV[w], t, LINE * hbm, hbm_bytes_per_cycle))
            done = t + latency + q
            h = 0.0
            if writer >= 0:
                seen = DONE[writer] + _visibility(PV, WDEV, WXCD, EV[writer, E_WAVE], w)
                if seen > done:
                    h = seen - done
                    done = seen
            done = max(done, VLAST[w])
            VLAST[w] = done
            DONE[e] = done
            _wait_vm(T, CAT, VMQ, VMH, VMN, w, QCAP - 1)
            slot = (VMH[w] + VMN[w]) % QCAP
            VMQ[w, slot, 0], VMQ[w, slot, 1], VMQ[w, slot, 2] = done, h, q
            VMN[w] += 1
        elif kind == K_SLOAD or kind == K_CLOCK or kind == K_LDS:
            h, q = 0.0, 0.0
            if kind == K_CLOCK:
                done = t + PV[P_CLOCK_LAT]
            elif kind == K_LDS:
                cost = max(float(EV[e, E_ARG]), EV[e, E_BYTES] / PV[P_LDS_BW])
                q = _serve(LDSF, cu, t, cost, 1.0)
                done = max(t + PV[P_LDS_LAT] + q, LDSLAST[w])
                LDSLAST[w] = done
            else:
                hbm, mall, l2 = EV[e, E_HBM], EV[e, E_MALL], EV[e, E_L2]
                latency = PV[P_HBM_LAT] if hbm else PV[P_MALL_LAT] if mall else PV[P_L2_LAT]
                q = _serve(L2, WL2[w], t, LINE * (hbm + mall + l2), PV[P_L2_BW])
                q = max(q, _serve(MALL, WDEV[w], t, LINE * mall, PV[P_MALL_BW]))
                q = max(q, _serve(HBM, WDEV[w], t, LINE * hbm, hbm_bytes_per_cycle))
                done = t + latency + q
                if writer >= 0:
                    seen = DONE[writer] + _visibility(PV, WDEV, WXCD, EV[writer, E_WAVE], w)
                    if seen > done:
                        h = seen - done
                        done = seen
            DONE[e] = done
            _wait_lgkm(T, CAT, LGQ, LGN, w, LCAP - 1)
            LGQ[w, LGN[w], 0], LGQ[w, LGN[w], 1], LGQ[w, LGN[w], 2] = done, h, q
            LGN[w] += 1
        elif kind == K_WBL2 or kind == K_INV:
            done = max(t + PV[P_WBL2 if kind == K_WBL2 else P_INV], VLAST[w])
            VLAST[w] = done
            DONE[e] = done
            _wait_vm(T, CAT, VMQ, VMH, VMN, w, QCAP - 1)
            slot = (VMH[w] + VMN[w]) % QCAP
            VMQ[w, slot, 0], VMQ[w, slot, 1], VMQ[w, slot, 2] = done, 0.0, 0.0
            VMN[w] += 1
        elif kind == K_WAITCNT:
            _wait_vm(T, CAT, VMQ, VMH, VMN, w, EV[e, E_ARG] & 0x3F)
            _wait_lgkm(T, CAT, LGQ, LGN, w, EV[e, E_ARG] >> 8 & 0xF)
            DONE[e] = T[w]
        elif kind == K_SLEEP:
            sleep = max(issue, PV[P_SLEEP] * EV[e, E_ARG]) - issue
            CAT[w, CAT_SLEEP] += sleep
            T[w] += sleep
            DONE[e] = T[w]
        T[w] += issue
        CAT[w, CAT_ISSUE] += issue
        c = WCTA[w]
        if kind == K_BARRIER:
            DONE[e] = T[w]
            STATUS[w] = AT_BARRIER
            ARRIVED[c] += 1
            BMAX[c] = max(BMAX[c], T[w])
            PTR[w] += 1
            if ARRIVED[c] >= LIVE[c]:
                n = _release(T, CAT, STATUS, ARRIVED, BMAX, CFIRST, CCOUNT, HK, HW, n, c, PV[P_BARRIER])
        elif kind == K_END:
            T[w] -= issue  # s_endpgm ends the wave once its accesses are through
            CAT[w, CAT_ISSUE] -= issue
            _wait_vm(T, CAT, VMQ, VMH, VMN, w, 0)
            _wait_lgkm(T, CAT, LGQ, LGN, w, 0)
            DONE[e] = T[w]
            STATUS[w] = ENDED
            WEND[w] = T[w]
            PTR[w] += 1
            LIVE[c] -= 1
            if ARRIVED[c] > 0 and ARRIVED[c] >= LIVE[c]:
                n = _release(T, CAT, STATUS, ARRIVED, BMAX, CFIRST, CCOUNT, HK, HW, n, c, PV[P_BARRIER])
        else:
            PTR[w] += 1
            n = _push(HK, HW, n, T[w], w)
        if blocked > 0 and (kind == K_VSTORE or kind == K_ATOMIC):
            n, blocked = _wake(STATUS, WAITON, DONE, T, HK, HW, n)
    unfinished = 0
    for w in range(n_waves):
        if STATUS[w] != ENDED:
            unfinished += 1
    return DONE, WEND, CAT, unfinished
