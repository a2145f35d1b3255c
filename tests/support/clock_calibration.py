"""The clock's calibration micro-kernels (issue 37 item 3), assembled by LLVM (asm_kernels.py)
and run through the emulator and the timing pass: each measures one quantity of the parameter
table the way a microbenchmark on the hardware would, and sits beside the public hardware figure
where one exists. `rows()` gives the table docs/emulator.md holds (tests/emulator/
test_clock_calibration.py keeps them equal); `python tests/support/clock_calibration.py` prints it.

Differences (two runs that differ only in the measured part) remove the fixed costs of a launch.
No parameter is fitted to these or to any kernel of ours: they check the table's arithmetic
end to end and show where it departs from public figures.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from asm_kernels import assemble  # noqa: E402

from mono_jit.emulator import CodeObject, Machine  # noqa: E402
from mono_jit.emulator.clock import params  # noqa: E402
from mono_jit.emulator.clock.report import ModelledLaunch, model  # noqa: E402
from mono_jit.emulator.clock.trace import Clock  # noqa: E402

TABLE = {p.name: p.value for p in params.TABLE}
PEAK = TABLE["clock_peak_ghz"]


@dataclass(frozen=True)
class Row:
    kernel: str
    quantity: str
    table: float  # what the parameter table alone says
    modelled: float  # what the micro-kernel gives through the emulator and the timing pass
    public: str  # the public hardware figure, scope-tagged, or "none found"
    departs: bool  # model and public figure more than 15 % apart

    def cells(self) -> str:
        flag = "**yes**" if self.departs else "no"
        return f"| {self.kernel} | {self.quantity} | {self.table:g} | {self.modelled:.4g} | {self.public} | {flag} |"


def _run(body: str, grid: int, threads: int, arrays: tuple = (), lds: int = 0) -> ModelledLaunch:
    machine = Machine()
    machine.timing = Clock()
    for array, name in arrays:
        machine.register(array, name)
    kernarg = struct.pack("<" + "Q" * len(arrays), *(a.ctypes.data for a, _ in arrays))
    report = machine.launch(CodeObject(assemble(body, lds=lds, vgprs=32)), (grid, 1, 1), (threads, 1, 1), kernarg)
    return model(report.trace)


def _chase(loads: int, lines: int) -> float:
    """One lane follows a chain through `lines` 128-byte lines, `loads` dependent loads."""
    chain = np.zeros(lines * 32, np.uint32)
    for k in range(lines):
        chain[k * 32] = ((k + 1) % lines) * 128
    step = "  global_load_dword v1, v1, s[4:5]\n  s_waitcnt vmcnt(0)\n"
    body = ("  s_load_dwordx2 s[4:5], s[0:1], 0x0\n  v_mov_b32 v1, 0\n  s_waitcnt lgkmcnt(0)\n"
            + step * loads + "  s_endpgm\n")
    return _run(body, 1, 1, ((chain, "chain"),)).cycles


def _mfma(count: int) -> float:
    """8 waves (2 a SIMD), each `count` FP8 scaled 16x16x128 MFMAs."""
    body = "  v_mfma_scale_f32_16x16x128_f8f6f4 v[0:3], v[4:11], v[12:19], v[0:3], v20, v21\n" * count
    return _run(body + "  s_endpgm\n", 1, 512).cycles


def _lds(stride_dwords: int) -> float:
    body = (f"  v_mul_u32_u24 v1, {4 * stride_dwords}, v0\n  ds_read_b32 v2, v1\n  s_waitcnt lgkmcnt(0)\n"
            "  s_endpgm\n")
    return _run(body, 1, 64, lds=64 * 4 * stride_dwords).cycles


def _stream() -> ModelledLaunch:
    """256 workgroups of 4 waves, each wave reading 16 KiB with 16 dwordx4 loads in flight."""
    source = np.zeros(256 * 4 * 16 * 1024 // 4, np.uint32)
    body = ["  s_load_dwordx2 s[4:5], s[0:1], 0x0", "  v_lshlrev_b32 v1, 4, v0", "  s_lshl_b32 s3, s2, 16",
            "  v_add_u32 v1, s3, v1", "  s_waitcnt lgkmcnt(0)"]
    body += ["  global_load_dwordx4 v[4:7], v1, s[4:5]\n  v_add_u32 v1, 0x1000, v1"] * 16
    body += ["  s_waitcnt vmcnt(0)", "  s_endpgm", ""]
    return _run("\n".join(body), 256, 256, ((source, "source"),))


def _barrier(nops: int) -> float:
    body = ("  v_readfirstlane_b32 s3, v0\n  s_cmp_lt_u32 s3, 64\n  s_cbranch_scc1 .Lgo\n" + "  s_nop 3\n" * nops
            + ".Lgo:\n  s_barrier\n  s_endpgm\n")
    return _run(body, 1, 128).cycles


def rows() -> list[Row]:
    """Every micro-kernel's row."""
    out = []
    hbm = (_chase(32, 32) - _chase(16, 16)) / 16
    ns = hbm / PEAK
    out.append(Row("pointer chase, 1 lane, new lines", "cycles a load (HBM)", TABLE["hbm_latency"], hbm,
                   f"C3: MI300X 314-332 ns = {314 * PEAK:.0f}-{332 * PEAK:.0f} cycles at {PEAK:g} GHz",
                   not 0.85 * 314 <= ns <= 1.15 * 332))
    l2 = (_chase(32, 16) - _chase(16, 16)) / 16
    ns = l2 / PEAK
    out.append(Row("pointer chase, 1 lane, second lap", "cycles a load (L2)", TABLE["l2_latency"], l2,
                   f"C3: MI300X 83-86 ns = {83 * PEAK:.0f}-{86 * PEAK:.0f} cycles", not 0.85 * 83 <= ns <= 1.15 * 86))
    stream = _stream()
    tbs = stream.bytes["hbm"] / (stream.us * 1e6)
    out.append(Row("streaming read, 256 x 4 waves, 16 MiB", "TB/s from HBM", TABLE["hbm_tb_per_s"] * TABLE["hbm_efficiency"],
                   tbs, "C4: one MI355X cast kernel 5.76 TB/s", abs(tbs / 5.76 - 1) > 0.15))
    per = (_mfma(64) - _mfma(32)) / 32 / 2
    ns = 256 / 4 / 2 * 2 * per / 1.52  # 256 MFMAs a K step over 4 SIMDs, 2 waves a SIMD, at 1.52 GHz
    out.append(Row("FP8 scaled 16x16x128 MFMA, 2 waves a SIMD", "cycles an MFMA", 4 * TABLE["mfma_scale_f8_passes"], per,
                   f"C4: MI355X GEMM K step (256 MFMAs, 2 waves a SIMD) 1344 ns at 1.52 GHz; model {ns:.0f} ns",
                   abs(ns / 1344 - 1) > 0.15))
    base = _lds(1)
    for stride in (2, 8, 64):
        out.append(Row(f"LDS read, lane stride {stride} dwords", "cycles over stride 1 (passes - 2)", stride - 2, _lds(stride) - base,
                       "none found (64 banks: C4, unresolved against rocprof's 32)", False))
    out.append(Row("barrier, one late wave", "cycles a barrier adds", TABLE["barrier_cost"],
                   _barrier(8) - (TABLE["dispatch_per_wave"] + 4 * TABLE["issue"] + 8 * TABLE["issue"]),
                   "none found (estimate)", False))
    return out


def markdown() -> str:
    lines = ["| Micro-kernel | Quantity | Table | Modelled | Public hardware figure | >15 % apart |",
             "|---|---|---|---|---|---|"]
    return "\n".join(lines + [r.cells() for r in rows()])


if __name__ == "__main__":
    print(markdown())
