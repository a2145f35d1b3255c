"""The interpreter's state layout: register numbers, the fields of the per-wave, control and
counter arrays, fault kinds and run results, shared by the instruction families, the
interpreter loop and `machine.py` (which allocates the arrays and reads them back).

The arrays (all numpy, made by `machine.py`):
  S  uint32 [waves, 136]: SGPRs 0..105, VCC 106/107, M0 124, EXEC 126/127, SCC at 128.
  V  uint32 [waves, vgprs, 64].
  WS int64 [waves, WS_FIELDS]: program row, status, workgroup, device, park epoch, ...
  CTA int64 [workgroups, 4]: live waves, waves at the barrier, first wave, LDS bytes.
  ALLOC int64 [allocations, 4]: base, size, flags (1 writable, 2 weight), device; sorted by base.
  CTL int64 [CTL_FIELDS], CNT int64 [devices, CNT_FIELDS], ABYTES int64 [allocations, 6].
"""

from __future__ import annotations

from . import ops as O

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
 FAULT_EXEC, FAULT_PRIVATE, FAULT_STALE, FAULT_WEAK_FULL) = range(11)

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
