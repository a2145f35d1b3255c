"""The clock's one parameter table: every latency, bandwidth, pass count and cost the timing
pass (`timing.py`) uses, each with its scope and source, in engine cycles unless the unit says
otherwise.

Scope tags: C4 = stated or measured for MI355X / CDNA4 / gfx950; C3 = MI300X / CDNA3 only (used
for want of a CDNA4 figure); gen = generic GCN/CDNA; estimate = a judgement with no direct
source. Nothing here was measured on an MI355X by this project. `docs/emulator.md` carries a
copy of the table that `tests/emulator/test_clock_params.py` keeps equal to this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class Param:
    """One row of the table."""

    name: str
    value: float
    unit: str
    scope: str
    source: str


_SPEC = "AMD ROCm GPU spec table, MI355X row (rocm.docs.amd.com reference/gpu-specs)"
_SISCHED = "LLVM llvm/lib/Target/AMDGPU/SISchedule.td, SIDPGFX950FullSpeedModel (a pass is 4 cycles)"
_MGPUSIM = "MGPUSim timingconfig/mi300x/builder.go ns targets, rescaled to 2.4 GHz"

TABLE: tuple[Param, ...] = (
    Param("clock_peak_ghz", 2.4, "GHz", "C4", "AMD Hot Chips 2025 CDNA4 talk: peak engine clock"),
    Param("clock_sustained_ghz", 1.52, "GHz", "C4",
          "a public MI355X MXFP8 GEMM note: clock seen under MFMA load (sclk cannot be locked: ROCm/rocm-systems#2639)"),
    Param("issue", 4, "cycles", "gen",
          "wave64 on a SIMD16: one instruction per wave every 4 clocks (rocprofiler-compute CDNA pipeline descriptions)"),
    Param("valu_trans", 16, "cycles", "estimate", "transcendental VALU at a quarter rate (GCN/CDNA descriptions)"),
    Param("mfma_scale_f8_passes", 8, "passes", "C4", _SISCHED + ": V_MFMA_SCALE 16x16x128 with an FP8/BF8 operand"),
    Param("mfma_scale_f4_passes", 4, "passes", "C4", _SISCHED + ": V_MFMA_SCALE 16x16x128, FP6/FP4 operands"),
    Param("mfma_f32_16x16x4_passes", 8, "passes", "C4", _SISCHED + ": ^V_MFMA_.32_16X16X[14][FBI]"),
    Param("mfma_bf16_16x16x32_passes", 4, "passes", "C4", _SISCHED + ": ^V_MFMA_.32_16X16X32"),
    Param("mfma_bf16_16x16x16_passes", 4, "passes", "estimate", "not matched by the gfx950 regexes; taken as 16x16x32's"),
    Param("lds_latency", 48, "cycles", "C3", "an analytical MI300X hardware config (lds_latency: 48); a model input"),
    Param("lds_bytes_per_cycle", 128, "B/cycle", "C4",
          "rocprofiler-compute gfx950 speed-of-light (sclk x CUs x 128 B); Chips and Cheese says 256: unresolved"),
    Param("l2_latency", 200, "cycles", "C3", _MGPUSIM + ": L2 hit about 85 ns"),
    Param("mall_latency", 470, "cycles", "C3", _MGPUSIM + ": Infinity Cache hit about 200 ns"),
    Param("hbm_latency", 770, "cycles", "C3", "MGPUSim MI300X ground-truth pointer chase: HBM about 320 ns"),
    Param("smem_clock_latency", 40, "cycles", "estimate", "s_memrealtime / s_memtime round trip"),
    Param("atomic_latency", 382, "cycles", "C3", "MI300X rocprofiler-compute Atomic Latency, little contention"),
    Param("l1_bytes_per_cycle", 128, "B/cycle", "C4", "rocprofiler-compute gfx950 speed-of-light: vL1D = sclk x 128 B per CU"),
    Param("l2_bytes_per_cycle", 2048, "B/cycle", "C4",
          "per XCD: 16 channels x 128 B/clk (rocprofiler-compute mi_gpu_spec.yaml TCC_channels 16; SOL yaml)"),
    Param("mall_bytes_per_cycle", 7083, "B/cycle", "C3", "MI300X Infinity Cache 17 TB/s peak (ServeTheHome) at 2.4 GHz"),
    Param("hbm_tb_per_s", 8.0, "TB/s", "C4", _SPEC + ": HBM3E 8 TB/s"),
    Param("hbm_efficiency", 0.72, "ratio", "C4",
          "one MI355X cast kernel reached 5.76 TB/s of 8 (a public MXFP8 methodology note)"),
    Param("vis_same_xcd", 200, "cycles", "estimate", "a flag written on the reader's XCD is seen at L2 latency"),
    Param("vis_other_xcd", 470, "cycles", "estimate", "a flag from another XCD is seen through the Infinity Cache"),
    Param("vis_other_device", 3600, "cycles", "estimate", "a flag from a peer GPU over XGMI: 1.5 us"),
    Param("wbl2_cost", 500, "cycles", "estimate", "buffer_wbl2 (no public CDNA3/CDNA4 figure)"),
    Param("inv_cost", 100, "cycles", "estimate", "buffer_inv (no public CDNA3/CDNA4 figure)"),
    Param("barrier_cost", 16, "cycles", "estimate", "s_barrier release after the last arrival"),
    Param("sleep_unit", 64, "cycles", "gen", "s_sleep N waits 64(N-1)+1 .. 64N clocks (CDNA ISA text); the upper end"),
    Param("dispatch_per_wave", 2, "cycles", "C3", "MGPUSim MI300X builder: 2 cycles per wavefront per XCD dispatcher"),
    Param("launch_gap_us", 1.1, "us", "C4", "1.1-1.5 us dependent-launch gap under graph replay (a public vLLM MI355X note); reported, not added"),
)

NAMES: tuple[str, ...] = tuple(p.name for p in TABLE)
INDEX: dict[str, int] = {name: k for k, name in enumerate(NAMES)}


def vector(overrides: Mapping[str, float] | None = None) -> np.ndarray:
    """The table's values as the float64 array the timing pass reads, with `overrides` by name
    (a calibration sweep changes values here, never the table)."""
    values = np.array([p.value for p in TABLE], np.float64)
    for name, value in (overrides or {}).items():
        if name not in INDEX:
            raise ValueError(f"clock parameter {name!r}: expected one of {', '.join(NAMES)}")
        values[INDEX[name]] = float(value)
    return values


def markdown() -> str:
    """The table as the markdown `docs/emulator.md` holds."""
    rows = ["| Parameter | Value | Unit | Scope | Source |", "|---|---|---|---|---|"]
    rows += [f"| `{p.name}` | {p.value:g} | {p.unit} | {p.scope} | {p.source} |" for p in TABLE]
    return "\n".join(rows)
