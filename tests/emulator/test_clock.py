"""The clock (mono_jit/emulator/clock/) on small assembled kernels: modelled cycles against times
worked out by hand from the parameter table and the model's rules as docs/emulator.md states
them (issue slots, the level that serves a line, the shared MFMA pipe, LDS bank conflicts,
barriers, and hand-offs whose time does not depend on how often the emulator let a poller
fail)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from asm_kernels import TOOLS_PRESENT, assemble

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

from mono_jit.emulator import CodeObject, Launch, Machine  # noqa: E402
from mono_jit.emulator.clock import params  # noqa: E402
from mono_jit.emulator.clock.report import ModelledLaunch, model  # noqa: E402
from mono_jit.emulator.clock.trace import Clock  # noqa: E402

P = {p.name: p.value for p in params.TABLE}
ISSUE = P["issue"]
HBM_RATE = P["hbm_tb_per_s"] * 1e12 * P["hbm_efficiency"] / (P["clock_peak_ghz"] * 1e9)  # bytes a cycle


def _timed(body: str, grid: int, threads: int, kernarg: bytes = b"", lds: int = 0,
           arrays: tuple = ()) -> ModelledLaunch:
    machine = Machine()
    machine.timing = Clock()
    for array, name in arrays:
        machine.register(array, name)
    report = machine.launch(CodeObject(assemble(body, lds=lds)), (grid, 1, 1), (threads, 1, 1), kernarg)
    return model(report.trace)


COPY_BODY = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  v_lshlrev_b32 v1, 2, v0
  s_waitcnt lgkmcnt(0)
  global_load_dword v2, v1, s[4:5]
  s_waitcnt vmcnt(0)
  v_add_u32 v2, 3, v2
  global_store_dword v1, v2, s[6:7]
  s_endpgm
"""


def test_a_dependent_load_store_chain_costs_its_levels_latencies_and_issue_slots():
    source, out = np.arange(64, dtype=np.uint32), np.zeros(64, np.uint32)
    modelled = _timed(COPY_BODY, 1, 64, struct.pack("<QQ", source.ctypes.data, out.ctypes.data),
                      arrays=((source, "source"), (out, "out")))
    assert np.array_equal(out, np.arange(64) + 3)
    # s_load: its line's first touch comes from HBM, through the XCD's L2 and HBM servers
    scalar_done = P["hbm_latency"] + max(128 / P["l2_bytes_per_cycle"], 128 / HBM_RATE)
    # s_load, v_lshlrev, then s_waitcnt waits and issues; global_load of 256 bytes (two HBM
    # lines) queues 2 cycles at the CU's L1
    load_done = scalar_done + ISSUE + P["hbm_latency"] + 256 / P["l1_bytes_per_cycle"]
    store_issue = load_done + ISSUE + ISSUE  # s_waitcnt vmcnt(0), v_add_u32
    expected = store_issue + P["l2_latency"] + 256 / P["l1_bytes_per_cycle"]  # s_endpgm waits for the store
    assert modelled.cycles == pytest.approx(expected)
    assert modelled.bytes["hbm"] == 3 * 128 and modelled.bytes["written"] == 256
    assert modelled.breakdown["issue"] == 7 * ISSUE
    assert modelled.us == pytest.approx(expected / 2400)


def test_two_waves_on_a_simd_share_its_mfma_pipe():
    body = "\n".join(["  v_mfma_f32_16x16x4_f32 v[4:7], v1, v2, v[4:7]"] * 16) + "\n  s_endpgm\n"
    modelled = _timed(body, 1, 512)  # 8 waves, 2 on each SIMD
    busy = 16 * P["mfma_f32_16x16x4_passes"] * 4
    # waves 3 and 7 share SIMD 3; wave 3 is dispatched 3 waves in, wave 7 seven in
    expected = 3 * P["dispatch_per_wave"] + 2 * busy
    assert modelled.cycles == pytest.approx(expected)
    assert modelled.critical_wave == 7
    assert modelled.breakdown["mfma"] == pytest.approx(expected - 7 * P["dispatch_per_wave"] - 16 * ISSUE)


@pytest.mark.parametrize("shift, passes", [(2, 1), (8, 64)])
def test_lds_bank_conflicts_come_from_the_lanes_addresses(shift, passes):
    """Lane stride 4 bytes: every lane in its own bank; 256 bytes: all 64 lanes in bank 0."""
    body = f"  v_lshlrev_b32 v1, {shift}, v0\n  ds_read_b32 v2, v1\n  s_waitcnt lgkmcnt(0)\n  s_endpgm\n"
    modelled = _timed(body, 1, 64, lds=16384)
    service = max(passes, 256 / P["lds_bytes_per_cycle"])
    assert modelled.cycles == pytest.approx(ISSUE + P["lds_latency"] + service + ISSUE)


BARRIER_BODY = """  v_readfirstlane_b32 s3, v0
  s_cmp_lt_u32 s3, 64
  s_cbranch_scc1 .Lgo
""" + "  s_nop 7\n" * 10 + """.Lgo:
  s_barrier
  s_endpgm
"""


def test_a_barrier_releases_the_workgroup_after_its_last_arrival():
    modelled = _timed(BARRIER_BODY, 1, 128)
    # wave 1 (dispatched 2 cycles later) also runs ten s_nop 7: 8 wait states each
    late = P["dispatch_per_wave"] + 3 * ISSUE + max(10 * ISSUE, 10 * 8) + ISSUE
    assert modelled.cycles == pytest.approx(late + P["barrier_cost"])
    assert modelled.breakdown["barrier"] == pytest.approx(late + P["barrier_cost"] - 4 * ISSUE)


# Workgroup 1 spins `LOOPS` times, raises flag[0] and polls flag[1]; workgroup 0 polls flag[0],
# then raises flag[1]. They sit on XCDs 1 and 0.
HANDSHAKE_BODY = """
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  v_mov_b32 v1, 0
  v_mov_b32 v2, 1
  s_waitcnt lgkmcnt(0)
  s_cmp_eq_u32 s2, 0
  s_cbranch_scc1 .Lfirst
  s_mov_b32 s8, LOOPS
.Lspin:
  s_sub_u32 s8, s8, 1
  s_cmp_lg_u32 s8, 0
  s_cbranch_scc1 .Lspin
  global_store_dword v1, v2, s[4:5] sc0 sc1
  s_mov_b32 s6, 4
  s_branch .Lwait
.Lfirst:
  s_mov_b32 s6, 0
.Lwait:
  v_mov_b32 v3, s6
  global_load_dword v4, v3, s[4:5] sc0 sc1
  s_waitcnt vmcnt(0)
  v_readfirstlane_b32 s7, v4
  s_cmp_eq_u32 s7, 0
  s_cbranch_scc0 .Lseen
  s_sleep 1
  s_branch .Lwait
.Lseen:
  s_cmp_eq_u32 s2, 0
  s_cbranch_scc0 .Ldone
  global_store_dword v1, v2, s[4:5] offset:4 sc0 sc1
.Ldone:
  s_endpgm
"""


def test_a_poll_completes_at_the_writers_store_plus_its_visibility_however_often_it_failed():
    """50,000 spins (150,003 instructions) outlast the emulator's 65,536-instruction turn, so the
    poller fails several times; its failed iterations cost no modelled time."""
    loops = 50_000
    flags = np.zeros(2, np.uint32)
    modelled = _timed(HANDSHAKE_BODY.replace("LOOPS", str(loops)), 2, 64, struct.pack("<Q", flags.ctypes.data),
                      arrays=((flags, "flags"),))
    assert list(flags) == [1, 1]
    assert modelled.failed_polls >= 3
    store = 1 + P["l2_latency"]  # a one-line store: 1 cycle through the CU's L1, then the L2's latency
    # workgroup 1 (XCD 1) reads the kernarg line workgroup 0 (XCD 0) fetched first: from the MALL
    writer_ready = P["mall_latency"] + 128 / P["l2_bytes_per_cycle"] + ISSUE
    flag0_done = writer_ready + ISSUE * (3 + 3 * loops) + store
    # the poller's load of flag[0] completes when the flag is visible on XCD 0; then its
    # s_waitcnt, five scalar instructions and the store of flag[1]
    flag1_done = flag0_done + P["vis_other_xcd"] + ISSUE + 5 * ISSUE + store
    assert modelled.workgroups[0][1] == pytest.approx(flag1_done)
    # and workgroup 1 sees flag[1] the same way: s_waitcnt and five instructions after it
    assert modelled.workgroups[1][1] == pytest.approx(flag1_done + P["vis_other_xcd"] + ISSUE + 5 * ISSUE)
    assert modelled.critical_workgroup == 1
    assert modelled.breakdown["handoff"] > 0


def test_a_line_another_device_read_still_comes_from_hbm_and_each_device_has_its_own_floor():
    """Two devices copy the same source: each reads it from its own HBM (another GPU's caches
    do not serve it), and the floor is one device's bytes at its own 8 TB/s."""
    source = np.arange(64, dtype=np.uint32)
    outs = [np.zeros(64, np.uint32) for _ in range(2)]
    machine = Machine(devices=2)
    machine.timing = Clock()
    machine.register(source, "source")
    for d, out in enumerate(outs):
        machine.register(out, f"out{d}")
    code = CodeObject(assemble(COPY_BODY))
    report = machine.launch_many([Launch(code, (1, 1, 1), (64, 1, 1), struct.pack("<QQ", source.ctypes.data,
                                                                                     out.ctypes.data), 0, d)
                                  for d, out in enumerate(outs)])
    modelled = model(report.trace)
    assert modelled.bytes["hbm"] == 2 * 3 * 128 and modelled.bytes["mall"] == 0
    assert modelled.hbm_floor_us == pytest.approx(3 * 128 / (P["hbm_tb_per_s"] * 1e6))


def test_the_clock_is_off_unless_asked_for():
    machine = Machine()
    source, out = np.arange(64, dtype=np.uint32), np.zeros(64, np.uint32)
    machine.register(source, "source")
    machine.register(out, "out")
    report = machine.launch(CodeObject(assemble(COPY_BODY)), (1, 1, 1), (64, 1, 1),
                            struct.pack("<QQ", source.ctypes.data, out.ctypes.data))
    assert report.trace is None
