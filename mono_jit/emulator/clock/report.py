"""A launch's modelled time: the timing pass (`timing.py`) run over its trace at one engine clock,
and what it tells per launch and per workgroup.

The model is an estimate with an expected absolute error of tens of percent (see
`docs/emulator.md`); nothing here has run on an MI355X.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from . import params
from .timing import CATEGORIES, TimingError, replay
from .trace import E_BYTES, E_HBM, E_KIND, E_L2, E_MALL, E_WAVE, FAILED_POLL, E_FLAGS, K_LDS, K_SLEEP, K_VSTORE, LINE, XCDS, Trace

CUS_PER_XCD = 32  # MI355X: 8 XCDs x 32 CUs (ROCm GPU spec table)


@dataclass(frozen=True)
class ModelledLaunch:
    """Modelled time of one launch at `clock_ghz`, the wave that ended it and where its time
    went, each workgroup's start and end, and the bytes each level served."""

    clock_ghz: float
    cycles: float
    critical_wave: int
    critical_workgroup: int
    breakdown: dict[str, float]  # the critical wave's cycles by category
    workgroups: list[tuple[float, float]]  # (start, end) cycles
    bytes: dict[str, int]  # hbm, mall, l2 (lines read, 128 B each), written, lds
    hbm_floor_us: float  # the busiest device's HBM bytes at its full 8 TB/s
    failed_polls: int  # poll iterations dropped as emulator-order artefacts
    events: int
    per_level_bytes_per_us: dict[str, float] = field(default_factory=dict)

    @property
    def us(self) -> float:
        return self.cycles / (self.clock_ghz * 1e3)

    @property
    def floor_ratio(self) -> float:
        """Modelled time over the HBM floor (inf when the launch reads nothing from HBM)."""
        return self.us / self.hbm_floor_us if self.hbm_floor_us > 0 else float("inf")

    def summary(self) -> str:
        """A few lines for a person: time, floor, the critical wave's breakdown."""
        parts = ", ".join(f"{name} {value:.0f}" for name, value in self.breakdown.items() if value)
        return (f"modelled {self.cycles:.0f} cycles = {self.us:.3f} us at {self.clock_ghz:g} GHz "
                f"(HBM floor {self.hbm_floor_us:.3f} us); ended by workgroup {self.critical_workgroup} "
                f"wave {self.critical_wave}: {parts}")


def _placement(trace: Trace, dispatch: float) -> tuple[np.ndarray, ...]:
    """Per wave: XCD, CU, SIMD, L2 and start cycle (workgroup c on XCD c mod 8, CU (c div 8) mod
    32 of it; a workgroup's wave k on SIMD k mod 4; each XCD's waves dispatched in order)."""
    cta, dev = trace.cta.astype(np.int64), trace.device.astype(np.int64)
    xcd = cta % XCDS
    cu = dev * XCDS * CUS_PER_XCD + xcd * CUS_PER_XCD + (cta // XCDS) % CUS_PER_XCD
    simd = cu * 4 + trace.wave_in_cta.astype(np.int64) % 4
    l2 = dev * XCDS + xcd
    start = np.zeros(len(cta), np.int64)
    for key in np.unique(l2):
        members = np.flatnonzero(l2 == key)
        start[members] = np.arange(len(members)) * dispatch
    return xcd, cu, simd, l2, start


def model(trace: Trace, clock_ghz: float | None = None, overrides: Mapping[str, float] | None = None) -> ModelledLaunch:
    """Time `trace` at `clock_ghz` (the table's peak clock by default) with the table's
    parameters, `overrides` by name replacing some."""
    if trace.overflowed:
        raise TimingError(f"the launch recorded more than {len(trace.events)} events: raise Clock(events=...)")
    pv = params.vector(overrides)
    ghz = pv[params.INDEX["clock_peak_ghz"]] if clock_ghz is None else float(clock_ghz)
    if not ghz > 0:
        raise ValueError(f"clock_ghz={clock_ghz}: expected a positive clock")
    ev = trace.events
    n_waves = len(trace.cta)
    xcd, cu, simd, l2, start = _placement(trace, pv[params.INDEX["dispatch_per_wave"]])
    order = np.argsort(ev[:, E_WAVE], kind="stable")
    first = np.searchsorted(ev[order, E_WAVE], np.arange(n_waves + 1)).astype(np.int64)
    counts = np.bincount(trace.cta, minlength=int(trace.cta.max()) + 1 if n_waves else 0).astype(np.int64)
    cfirst = np.searchsorted(trace.cta, np.arange(len(counts))).astype(np.int64)
    devices = int(trace.device.max()) + 1 if n_waves else 1
    hbm_rate = pv[params.INDEX["hbm_tb_per_s"]] * 1e12 * pv[params.INDEX["hbm_efficiency"]] / (ghz * 1e9)
    done, wend, cat, unfinished = replay(ev, order.astype(np.int64), first, trace.cta.astype(np.int64),
                                         trace.device.astype(np.int64), xcd, cu, simd, l2, start, cfirst, counts, pv,
                                         devices * XCDS * CUS_PER_XCD, devices * XCDS, devices, hbm_rate)
    if unfinished:
        raise TimingError(f"{unfinished} waves could not be replayed to their end (a hand-off with no writer)")
    critical = int(np.argmax(wend)) if n_waves else 0
    cycles = float(wend.max()) if n_waves else 0.0
    workgroups = [(float(start[cfirst[c]:cfirst[c] + counts[c]].min()), float(wend[cfirst[c]:cfirst[c] + counts[c]].max()))
                  for c in range(len(counts))]
    reads = ev[:, E_KIND] != K_VSTORE
    device_hbm = np.bincount(trace.device[ev[reads, E_WAVE]], weights=ev[reads, E_HBM], minlength=devices) * LINE
    nbytes = {"hbm": int(ev[reads, E_HBM].sum()) * LINE, "mall": int(ev[reads, E_MALL].sum()) * LINE,
              "l2": int(ev[reads, E_L2].sum()) * LINE, "written": int(ev[ev[:, E_KIND] == K_VSTORE, E_BYTES].sum()),
              "lds": int(ev[ev[:, E_KIND] == K_LDS, E_BYTES].sum())}
    us = cycles / (ghz * 1e3)
    return ModelledLaunch(
        clock_ghz=ghz, cycles=cycles, critical_wave=critical, critical_workgroup=int(trace.cta[critical]) if n_waves else 0,
        breakdown={name: float(cat[critical, k]) for k, name in enumerate(CATEGORIES)} if n_waves else {},
        workgroups=workgroups, bytes=nbytes,
        hbm_floor_us=float(device_hbm.max()) / (pv[params.INDEX["hbm_tb_per_s"]] * 1e6) if n_waves else 0.0,
        failed_polls=int((((ev[:, E_FLAGS] & FAILED_POLL) != 0) & (ev[:, E_KIND] != K_SLEEP)).sum()),
        events=len(ev), per_level_bytes_per_us={k: v / us for k, v in nbytes.items()} if us > 0 else {})
