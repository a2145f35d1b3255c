"""The weak-memory mode's options, its arrays for one launch (`weak.py` holds the rules) and its
stale-read reports in words."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import weak
from .errors import EmulatorError

XCDS = 8  # MI355X: 8 XCDs, each with its own L2
CUS_PER_XCD = 32  # and 32 CUs each
PLACEMENTS = ("round-robin", "one-xcd", "permuted")
WEAK_LIMIT_BYTES = 2 << 30  # the most the mode's arrays may take for one launch


@dataclass(frozen=True)
class WeakMemory:
    """Options of the weak-memory mode. `placement`: workgroup i on XCD i mod 8 (as the
    dispatcher typically places them), all on XCD 0, or a permutation drawn from `seed`.
    `fail`: a stale read fails the launch; else stale reads are counted and listed.
    `flag_first`: a wave's later stores complete before its earlier ones."""

    placement: str = "round-robin"
    seed: int = 0
    fail: bool = True
    flag_first: bool = False

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}: expected one of {', '.join(PLACEMENTS)}")


def _xcds(workgroups: int, options: WeakMemory) -> np.ndarray:
    if options.placement == "one-xcd":
        return np.zeros(workgroups, np.int64)
    order = np.arange(workgroups)
    if options.placement == "permuted":
        order = np.random.default_rng(options.seed).permutation(workgroups)
    return order % XCDS


def off_state(waves: int) -> tuple:
    """The tuple the interpreter takes when the mode is off (O_ON is 0; nothing else is read)."""
    tiny8, tiny64 = np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.int64)
    return (np.zeros(weak.OPT_FIELDS, np.int64), np.zeros((max(waves, 1), 3), np.int64), np.zeros(1, np.int64),
            np.zeros(1, np.uint8), tiny8, tiny8, tiny64, tiny8, tiny64, np.zeros(1, np.int64),
            np.zeros((1, 3), np.int64), np.zeros((1, 1, 4), np.int64), np.zeros((1, 3), np.int64),
            np.zeros((1, weak.REP_FIELDS), np.int64), tiny8, tiny64)


def build(options: WeakMemory, allocations: list, uncached: set[int], wave_cta: np.ndarray, wave_device: np.ndarray,
          devices: int) -> tuple:
    """The arrays for one launch: every writable, non-weight allocation tracked (UC when its base
    is in `uncached`), caches empty (the command processor's acquire at launch start)."""
    first, types, lines = [], [], 0
    for a in allocations:
        tracked = a.writable and not a.weight
        first.append(lines if tracked else -1)
        types.append((weak.UC if a.base in uncached else weak.RW) if tracked else weak.UNTRACKED)
        lines += -(-a.size // weak.LINE) if tracked else 0
    nbytes = max(lines, 1) * weak.LINE
    l2s, l1s = devices * XCDS, devices * XCDS * CUS_PER_XCD
    need = nbytes * (2 * l2s + l1s + l1s // 2 + 1 + 24)
    if need > WEAK_LIMIT_BYTES:
        raise EmulatorError(f"weak-memory mode: {nbytes} bytes of writable memory registered would need {need >> 20} MiB "
                            f"of cache arrays; expected at most {WEAK_LIMIT_BYTES >> 20} MiB (register fewer or smaller "
                            f"writable buffers, or run with sequentially consistent memory)")
    memory = np.zeros(nbytes, np.uint8)
    for a, line in zip(allocations, first):
        if line >= 0:
            memory[line * weak.LINE:line * weak.LINE + a.size] = a.view
    ctas = int(wave_cta.max()) + 1 if len(wave_cta) else 1
    xcd_of = _xcds(ctas, options)
    cu_of = np.zeros(ctas, np.int64)
    for x in range(XCDS):  # the workgroups of an XCD take its CUs in turn
        on = np.flatnonzero(xcd_of == x)
        cu_of[on] = x * CUS_PER_XCD + np.arange(len(on)) % CUS_PER_XCD
    geo = np.zeros((max(len(wave_cta), 1), 3), np.int64)
    if len(wave_cta):
        geo[:, 0] = wave_device * XCDS + xcd_of[wave_cta]
        geo[:, 1] = wave_device * XCDS * CUS_PER_XCD + cu_of[wave_cta]
        geo[:, 2] = geo[:, 1] // 2
    n = max(lines, 1)
    opt = np.array([1, int(options.fail), int(options.flag_first), 0], np.int64)
    writer = np.zeros((nbytes, 3), np.int64)
    writer[:, :2] = -1
    return (opt, geo, np.array(first or [-1], np.int64), memory,
            np.zeros((l2s, nbytes), np.uint8), np.zeros((l2s, nbytes), np.uint8), np.full((l2s, n), weak.ABSENT, np.int64),
            np.zeros((l1s, nbytes), np.uint8), np.full((l1s, n), weak.ABSENT, np.int64),
            np.array(types or [weak.UNTRACKED], np.int64), writer,
            np.zeros((geo.shape[0], weak.QCAP, 4), np.int64), np.zeros((geo.shape[0], 3), np.int64),
            np.zeros((weak.REPORTS, weak.REP_FIELDS), np.int64),
            np.zeros((l1s // 2, nbytes), np.uint8), np.full((l1s // 2, n), weak.ABSENT, np.int64))


def describe(rep: np.ndarray, who, pc_of, allocation_name) -> str:
    """One stale read in a paragraph. `who(w)` names a wave, `pc_of(w, row)` an instruction,
    `allocation_name(k)` an allocation."""
    w, row, writer, wrow = int(rep[weak.R_WAVE]), int(rep[weak.R_ROW]), int(rep[weak.R_WRITER]), int(rep[weak.R_WROW])
    where, place, fill = int(rep[weak.R_WHERE]), int(rep[weak.R_PLACE]), int(rep[weak.R_FILL])
    source = ("memory", "its XCD's L2", "its CU's vector L1", "its CU pair's scalar cache")[int(rep[weak.R_SOURCE])]
    if where == weak.WHERE_QUEUED:
        fresh = f"still queued in {who(place)} (its store had not completed)"
    elif where == weak.WHERE_DIRTY:
        fresh = f"dirty in XCD {place % XCDS}'s L2" + (f" on device {place // XCDS}" if place >= XCDS else "")
    else:
        filled = "before the launch" if fill < 0 else f"at {pc_of(w, fill)}"
        fresh = f"in memory, but the copy read from {source} was a line filled {filled} before the write"
    return (f"stale read: {who(w)} at {pc_of(w, row)} read {int(rep[weak.R_READ]):#x} at offset "
            f"{int(rep[weak.R_OFFSET])} of {allocation_name(int(rep[weak.R_ALLOC]))!r}, whose latest value "
            f"{int(rep[weak.R_LATEST]):#x} was written by {who(writer)} at {pc_of(writer, wrow)}; the fresh value "
            f"was {fresh}")
