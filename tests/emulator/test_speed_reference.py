"""A fixed launch whose outputs and counters were recorded from the emulator before its speed-ups
(the scaled and dense MFMAs, raw buffer loads with lanes past num_records, partial EXEC): the
speed-ups have no switch, so the sped-up interpreter must give these very bytes and counters;
and the same launch profiled (`emulator/profile.py`) gives them too."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
from asm_kernels import TOOLS_PRESENT, assemble

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

INPUT_BYTES = 128 * 128  # 128 bytes a work-item
OUT_BYTES = 2 * 128 * 80  # 2 workgroups of 128 work-items, 5 dwordx4 each
# s[4:5] inputs, s[6:7] out; V# of the inputs with num_records short of the last work-items' bytes
BODY = """  s_load_dwordx4 s[4:7], s[0:1], 0
  s_waitcnt lgkmcnt(0)
  s_mov_b32 s12, s4
  s_and_b32 s13, s5, 0xffff
  s_mov_b32 s14, 0x3f10
  s_mov_b32 s15, 0x27000
  v_lshlrev_b32 v2, 7, v0
  buffer_load_dwordx4 v[4:7], v2, s[12:15], 0 offen
  buffer_load_dwordx4 v[8:11], v2, s[12:15], 0 offen offset:16
  buffer_load_dwordx4 v[12:15], v2, s[12:15], 0 offen offset:32
  buffer_load_dwordx4 v[16:19], v2, s[12:15], 0 offen offset:48
  buffer_load_dwordx4 v[28:31], v2, s[12:15], 0 offen offset:64
  buffer_load_ubyte v20, v2, s[12:15], 0 offen offset:80
  buffer_load_ubyte v21, v2, s[12:15], 0 offen offset:81
  s_waitcnt vmcnt(0)
  v_and_b32 v20, 7, v20
  v_add_u32 v20, 124, v20
  v_and_b32 v21, 7, v21
  v_add_u32 v21, s2, v21
  v_add_u32 v21, 123, v21
  v_mfma_scale_f32_16x16x128_f8f6f4 v[24:27], v[4:11], v[12:19], v[28:31], v20, v21
  v_mfma_scale_f32_16x16x128_f8f6f4 v[32:35], v[4:7], v[12:19], v[28:31], v20, v21 cbsz:4
  v_mfma_f32_16x16x32_bf16 v[36:39], v[4:7], v[12:15], v[28:31]
  v_mfma_f32_16x16x16_bf16 v[40:43], v[8:9], v[16:17], 0
  v_mfma_f32_16x16x4_f32 v[44:47], v28, v29, v[28:31]
  s_nop 7
  s_nop 7
  v_and_b32 v1, 63, v0
  v_cmp_gt_u32 vcc, 40, v1
  s_and_saveexec_b64 s[10:11], vcc
  buffer_load_dwordx4 v[48:51], v2, s[12:15], 0 offen offset:96
  s_waitcnt vmcnt(0)
  v_add_f32 v24, v24, v48
  v_mov_b32 v25, v49
  v_fma_f32 v26, v50, v51, v26
  s_or_b64 exec, exec, s[10:11]
  s_mul_i32 s8, s2, 0x80
  v_add_u32 v3, s8, v0
  v_mul_u32_u24 v3, 0x50, v3
  global_store_dwordx4 v3, v[24:27], s[6:7]
  global_store_dwordx4 v3, v[32:35], s[6:7] offset:16
  global_store_dwordx4 v3, v[36:39], s[6:7] offset:32
  global_store_dwordx4 v3, v[40:43], s[6:7] offset:48
  global_store_dwordx4 v3, v[44:47], s[6:7] offset:64
  s_endpgm
"""
# Recorded from the interpreter at 7ecc6d1 (before the speed-ups) by running this file.
OUT_SHA256 = "8ef47b24595353f46688a4ad1f45459576683fad3b2a9b26c7989e346eb62dbc"
COUNTERS_SHA256 = "e7fc16925d18f7a534536d78642ff1f95b885c8a8a7ebabf0b8c50c4a11ff72e"
WAVE_INSTRUCTIONS = 180


def launch() -> tuple[str, str, int]:
    """The fixed launch: (sha256 of the output bytes, sha256 of the counters, wave-instructions)."""
    import torch

    from mono_jit.emulator import CodeObject, Machine

    g = torch.Generator().manual_seed(40)
    # bit 6 of every byte clear: no fp8 NaN code, and bf16 / f32 exponents below 128 (no NaN, no inf)
    inputs = torch.randint(0, 256, (INPUT_BYTES,), dtype=torch.uint8, generator=g) & 0xBF
    out = torch.zeros(OUT_BYTES, dtype=torch.uint8)
    machine = Machine()
    machine.register(inputs, "inputs", writable=False)
    machine.register(out, "out")
    code = CodeObject(assemble(BODY, vgprs=64))
    report = machine.launch(code, (2, 1, 1), (128, 1, 1), struct.pack("<QQ", inputs.data_ptr(), out.data_ptr()))
    counters = json.dumps(report.counters, sort_keys=True).encode()
    return (hashlib.sha256(np.ascontiguousarray(out.numpy()).tobytes()).hexdigest(),
            hashlib.sha256(counters).hexdigest(), report.wave_instructions)


def test_the_fixed_launch_gives_the_recorded_outputs_and_counters():
    out, counters, instructions = launch()
    assert instructions == WAVE_INSTRUCTIONS
    assert counters == COUNTERS_SHA256, "the launch's counters changed"
    assert out == OUT_SHA256, "the launch's output bytes changed"


def test_a_profiled_launch_counts_every_instruction_and_changes_nothing():
    from mono_jit.emulator.profile import COUNT, CYCLES, N_OPS, profiling

    with profiling() as profile:
        out, counters, instructions = launch()
    assert (out, counters, instructions) == (OUT_SHA256, COUNTERS_SHA256, WAVE_INSTRUCTIONS)
    assert profile.table[COUNT, :N_OPS].sum() == WAVE_INSTRUCTIONS
    assert profile.table[CYCLES, :N_OPS].min() >= 0 and profile.total_cycles() > 0
    assert 0 <= profile.scheduler_cycles() < profile.total_cycles()


if __name__ == "__main__":
    print(launch())
