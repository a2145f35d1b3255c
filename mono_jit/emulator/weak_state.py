"""The weak-memory mode's options, its arrays for one launch (`weak.py` holds the rules) and its
stale-read reports in words."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import weak

XCDS = 8  # MI355X: 8 XCDs, each with its own L2
CUS_PER_XCD = 32  # and 32 CUs each
PLACEMENTS = ("round-robin", "one-xcd", "permuted")


@dataclass(frozen=True)
class WeakMemory:
    """Options of the weak-memory mode. `placement`: workgroup i on XCD i mod 8 (as the
    dispatcher typically places them), all on XCD 0, or a permutation drawn from `seed`.
    `fail`: a stale read fails the launch; else stale reads are counted and listed.
    `flag_first`: a wave's later stores complete before its earlier ones. `warm_l1`: every CU's
    vector L1 starts holding a copy of every tracked line as it was before the launch (as if the
    CU had read it earlier and kept it), until the CU's first invalidate: a load a missing
    `buffer_inv` leaves on such a copy reads it stale. `lines`: the most
    128-byte lines of writable memory a launch may touch; `slots`: the most lines all its caches
    may hold together (the arrays are sized by them: about 3 KiB a line, 0.25 KiB a slot)."""

    placement: str = "round-robin"
    seed: int = 0
    fail: bool = True
    flag_first: bool = False
    warm_l1: bool = False
    lines: int = 1 << 16
    slots: int = 1 << 18

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r}: expected one of {', '.join(PLACEMENTS)}")
        if self.lines < 1 or self.slots < 1:
            raise ValueError(f"lines={self.lines}, slots={self.slots}: expected positive counts")


def _xcds(workgroups: int, options: WeakMemory) -> np.ndarray:
    if options.placement == "one-xcd":
        return np.zeros(workgroups, np.int64)
    order = np.arange(workgroups)
    if options.placement == "permuted":
        order = np.random.default_rng(options.seed).permutation(workgroups)
    return order % XCDS


def off_state(waves: int) -> tuple:
    """The tuple the interpreter takes when the mode is off (O_ON is 0; nothing else is read)."""
    return _arrays(np.zeros(weak.OPT_FIELDS, np.int64), np.zeros((max(waves, 1), 3), np.int64), [-1], [weak.UNTRACKED],
                   1, 1, 1, 1, 1, 1, 1, False)


def _arrays(opt: np.ndarray, geo: np.ndarray, first: list[int], types: list[int], all_lines: int, lines: int,
            slots: int, l2s: int, l1s: int, scalar_caches: int, waves: int, warm_l1: bool) -> tuple:
    writer = np.zeros((lines * weak.LINE, 3), np.int32)
    writer[:, :2] = -1
    return (opt, geo, np.array(first, np.int64), np.zeros(lines * weak.LINE, np.uint8),
            np.zeros((slots, weak.LINE), np.uint8), np.zeros((slots, weak.LINE), np.uint8), np.zeros(slots, np.int64),
            np.full((l2s, lines), weak.ABSENT, np.int32),
            np.full((l1s, lines), weak.WARM if warm_l1 else weak.ABSENT, np.int32),
            np.array(types, np.int64), writer, np.zeros((waves, weak.QCAP if opt[weak.O_ON] else 1, 4), np.int64),
            np.zeros((waves, 3), np.int64), np.zeros((weak.REPORTS, weak.REP_FIELDS), np.int64),
            np.full((scalar_caches, lines), weak.ABSENT, np.int32), np.full(all_lines, -1, np.int64),
            np.arange(slots, dtype=np.int64), np.zeros((l1s + scalar_caches, weak.L1_LINES), np.int32),
            np.zeros((l1s + scalar_caches, 3), np.int64), np.zeros(lines, np.int64),
            np.zeros((l2s, lines), np.int32), np.zeros((l2s, 2), np.int64), np.zeros(slots, np.uint8),
            np.zeros(lines * weak.LINE, np.uint8))


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
    ctas = int(wave_cta.max()) + 1 if len(wave_cta) else 1
    xcd_of = _xcds(ctas, options)
    cu_of = np.zeros(ctas, np.int64)
    for x in range(XCDS):  # the workgroups of an XCD take its CUs in turn
        on = np.flatnonzero(xcd_of == x)
        cu_of[on] = x * CUS_PER_XCD + np.arange(len(on)) % CUS_PER_XCD
    waves = max(len(wave_cta), 1)
    geo = np.zeros((waves, 3), np.int64)
    if len(wave_cta):
        geo[:, 0] = wave_device * XCDS + xcd_of[wave_cta]
        geo[:, 1] = wave_device * XCDS * CUS_PER_XCD + cu_of[wave_cta]
        geo[:, 2] = geo[:, 1] // 2
    opt = np.zeros(weak.OPT_FIELDS, np.int64)
    opt[[weak.O_ON, weak.O_FAIL, weak.O_FLAG_FIRST, weak.O_FREE]] = (1, options.fail, options.flag_first, options.slots)
    l1s = devices * XCDS * CUS_PER_XCD
    return _arrays(opt, geo, first or [-1], types or [weak.UNTRACKED], max(lines, 1), min(options.lines, max(lines, 1)),
                   options.slots, devices * XCDS, l1s, l1s // 2, waves, options.warm_l1)


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
