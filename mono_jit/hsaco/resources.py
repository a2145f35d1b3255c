"""The resource gate: does a kernel fit an MI355X CU, and is it within its scratch budget?

A persistent launch puts one CTA on each of the 256 CUs and every CTA must be resident at once
(the stages wait on each other). Limits per CU (the CDNA4 ISA guide): 4 SIMDs, 512 VGPR + AGPR per
lane per SIMD (allocated in granules of 8), at most 8 waves per SIMD, 160 KiB of LDS.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from mono_jit.record import Record

from ..errors import ResourceError

if TYPE_CHECKING:  # a cache hit imports this module (Budget) but never the code object records
    from .kernel_info import KernelInfo

MI355X_CUS = 256
SIMDS_PER_CU = 4
REGS_PER_LANE_PER_SIMD = 512
REG_GRANULE = 8
MAX_WAVES_PER_SIMD = 8
LDS_PER_CU = 160 * 1024


class Budget(Record):
    """What a template allows beyond the hardware: scratch bytes and spilled registers."""

    scratch_bytes: int = 0
    spills: int = 0


class Residency(Record):
    """How a CTA of `block` threads occupies one CU."""

    waves_per_cta: int
    waves_per_simd: int
    regs_per_wave: int
    max_waves_per_simd_by_regs: int
    lds_bytes: int
    ctas_per_cu: int

    def as_dict(self) -> dict:
        return self._asdict()


def residency(kernel: KernelInfo, block: int, dynamic_lds: int) -> Residency:
    waves = math.ceil(block / kernel.wavefront_size)
    per_simd = math.ceil(waves / SIMDS_PER_CU)
    regs = _round_up(kernel.vgpr, REG_GRANULE) + _round_up(kernel.agpr, REG_GRANULE)
    by_regs = min(MAX_WAVES_PER_SIMD, REGS_PER_LANE_PER_SIMD // max(regs, 1))
    lds = kernel.lds + dynamic_lds
    ctas = min(by_regs // per_simd if per_simd else 0, LDS_PER_CU // lds if lds else 1 << 30)
    return Residency(waves, per_simd, regs, by_regs, lds, ctas)


def _round_up(value: int, granule: int) -> int:
    return math.ceil(value / granule) * granule


def check(kernel: KernelInfo, *, block: int, grid: int, dynamic_lds: int, persistent: bool,
          budget: Budget, what: str) -> Residency:
    """Raise ResourceError (with the figures) unless the kernel fits; return its residency."""
    res = residency(kernel, block, dynamic_lds)
    problems = []
    if kernel.scratch > budget.scratch_bytes:
        problems.append(f"scratch {kernel.scratch} B > budget {budget.scratch_bytes} B")
    spills = kernel.vgpr_spills + kernel.sgpr_spills
    if spills > budget.spills:
        problems.append(f"spills {kernel.vgpr_spills} VGPR + {kernel.sgpr_spills} SGPR > budget {budget.spills}")
    if kernel.reqd_workgroup_size and math.prod(kernel.reqd_workgroup_size) != block:
        problems.append(f"launch block {block} != the kernel's required workgroup size {kernel.reqd_workgroup_size}")
    if res.lds_bytes > LDS_PER_CU:
        problems.append(f"LDS {res.lds_bytes} B > {LDS_PER_CU} B per CU")
    if res.waves_per_simd > res.max_waves_per_simd_by_regs:
        problems.append(
            f"{res.waves_per_simd} waves per SIMD x {res.regs_per_wave} registers "
            f"({kernel.vgpr} VGPR + {kernel.agpr} AGPR) > {REGS_PER_LANE_PER_SIMD} per lane per SIMD"
        )
    if persistent and grid != MI355X_CUS:
        problems.append(f"persistent grid {grid} != {MI355X_CUS} CTAs (one per CU)")
    if res.ctas_per_cu < 1:
        problems.append("not even one CTA fits on a CU")
    if problems:
        raise ResourceError(f"{what}: kernel {kernel.name} does not fit: " + "; ".join(problems))
    return res
