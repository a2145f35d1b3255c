"""What the clock's recorder costs the functional run: wall seconds (best of 5) of one launch
with the clock off and on, and of the timing pass alone, on an assembled kernel of 64 workgroups
x 4 waves looping 400 times over a global load, four VALU instructions and a global store
(1.03 M wave-instructions, a quarter of them vector memory), or with `--valu` the same loop with
VALU instructions in place of the load and store.

    .venv/bin/python bench/clock_cost.py [--valu]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from asm_kernels import assemble  # noqa: E402

from mono_jit.emulator import CodeObject, LaunchReport, Machine  # noqa: E402
from mono_jit.emulator.clock.report import model  # noqa: E402
from mono_jit.emulator.clock.trace import Clock  # noqa: E402

BODY = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  v_lshlrev_b32 v1, 2, v0
  s_lshl_b32 s3, s2, 10
  v_add_u32 v1, s3, v1
  s_waitcnt lgkmcnt(0)
  s_mov_b32 s8, 400
.Lloop:
  LOAD
  s_waitcnt vmcnt(0)
  v_add_u32 v2, 3, v2
  v_mul_lo_u32 v3, v2, v2
  v_xor_b32 v3, v3, v2
  v_add_u32 v2, v3, v2
  STORE
  s_sub_u32 s8, s8, 1
  s_cmp_lg_u32 s8, 0
  s_cbranch_scc1 .Lloop
  s_endpgm
"""


def launch(code: CodeObject, timing: bool) -> tuple[float, LaunchReport]:
    source, out = np.arange(64 * 256, dtype=np.uint32), np.zeros(64 * 256, np.uint32)
    machine = Machine()
    machine.timing = Clock(events=1 << 21) if timing else None
    machine.register(source, "source")
    machine.register(out, "out")
    start = time.perf_counter()
    report = machine.launch(code, (64, 1, 1), (256, 1, 1), struct.pack("<QQ", source.ctypes.data, out.ctypes.data))
    return time.perf_counter() - start, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--valu", action="store_true", help="VALU instructions in place of the load and store")
    args = parser.parse_args()
    load, store = ("v_add_u32 v2, 1, v2",) * 2 if args.valu else ("global_load_dword v2, v1, s[4:5]",
                                                                   "global_store_dword v1, v2, s[6:7]")
    code = CodeObject(assemble(BODY.replace("LOAD", load).replace("STORE", store)))
    launch(code, True)  # compile everything once
    off = min(launch(code, False)[0] for _ in range(5))
    on = min(launch(code, True)[0] for _ in range(5))
    report = launch(code, True)[1]
    assert report.trace is not None
    start = time.perf_counter()
    modelled = model(report.trace)
    pass_seconds = time.perf_counter() - start
    print(f"clock off {off:.3f} s, on {on:.3f} s ({on / off:.2f}x); timing pass {pass_seconds:.3f} s for "
          f"{modelled.events:,} events of {report.wave_instructions:,} wave-instructions")
    print(modelled.summary())


if __name__ == "__main__":
    main()
