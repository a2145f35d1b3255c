"""The weak-memory mode on assembled litmus kernels: two one-lane workgroups, a producer
(workgroup 0) publishing a dword and a flag, and a consumer (workgroup 1) that waits for the flag
and reads the dword. Each variant drops or changes one step of the hand-off; the mode must report
exactly the broken ones, naming where the fresh value was, and return what the hardware could."""

from __future__ import annotations

import struct

import pytest
import torch
from asm_kernels import TOOLS_PRESENT, assemble

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

from mono_jit.emulator import CodeObject, EmulatorFault, Machine  # noqa: E402
from mono_jit.emulator.weak_state import WeakMemory  # noqa: E402

OLD, NEW = 5, 7
DATA, FLAG, READY, OUT = 0, 256, 512, 768  # byte offsets in one buffer, each on its own line

FULL = dict(data_bits="", wbl2="buffer_wbl2 sc1", vmcnt="s_waitcnt vmcnt(0)", warm="", inv="buffer_inv sc1",
            read="global_load_dword v4, v1, s[4:5]\n  s_waitcnt vmcnt(0)")
SCALAR_READ = "s_load_dword s7, s[4:5], 0x0\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v4, s7"
WARM_L1 = "global_load_dword v2, v1, s[4:5]\n  s_waitcnt vmcnt(0)"
WARM_SCALAR = "s_load_dword s7, s[4:5], 0x0\n  s_waitcnt lgkmcnt(0)"
# vLLM 0.33's discipline: sc1 data stores, no write-back, plain loads of lines not read before.
VLLM = dict(FULL, data_bits=" sc1", wbl2="", inv="")

BODY = """  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v1, 0
  s_cmp_eq_u32 s2, 0
  s_cbranch_scc0 consumer
wait_ready:
  global_load_dword v2, v1, s[4:5] offset:{READY} sc1
  s_waitcnt vmcnt(0)
  v_readfirstlane_b32 s6, v2
  s_cmp_eq_u32 s6, 1
  s_cbranch_scc1 publish
  s_sleep 1
  s_branch wait_ready
publish:
  v_mov_b32 v3, {NEW}
  global_store_dword v1, v3, s[4:5]{data_bits}
  {wbl2}
  {vmcnt}
  v_mov_b32 v3, 1
  global_store_dword v1, v3, s[4:5] offset:{FLAG} sc1
  s_endpgm
consumer:
  {warm}
  v_mov_b32 v3, 1
  global_store_dword v1, v3, s[4:5] offset:{READY} sc1
  s_waitcnt vmcnt(0)
poll:
  global_load_dword v2, v1, s[4:5] offset:{FLAG} sc1
  s_waitcnt vmcnt(0)
  v_readfirstlane_b32 s6, v2
  s_cmp_eq_u32 s6, 1
  s_cbranch_scc1 take
  s_sleep 1
  s_branch poll
take:
  {inv}
  {read}
  global_store_dword v1, v4, s[4:5] offset:{OUT}
  s_endpgm
"""


def _run(steps: dict, options: WeakMemory | None) -> tuple[int, list[str]]:
    """Launch the hand-off on two workgroups; (the value the consumer read, the stale reports)."""
    body = BODY.format(READY=READY, FLAG=FLAG, OUT=OUT, NEW=NEW, **steps)
    memory = torch.zeros(1024, dtype=torch.uint8)
    memory[DATA:DATA + 4] = torch.tensor(list(struct.pack("<I", OLD)), dtype=torch.uint8)
    machine = Machine()
    machine.weak_memory = options
    machine.register(memory, "handoff")
    report = machine.launch(CodeObject(assemble(body)), (2, 1, 1), (1, 1, 1), struct.pack("<Q", memory.data_ptr()))
    out = struct.unpack("<I", memory[OUT:OUT + 4].numpy().tobytes())[0]
    return out, report.stale_report


COUNT = WeakMemory(fail=False)


def test_full_publish_across_xcds_is_fresh():
    assert _run(FULL, COUNT) == (NEW, [])


def test_dropped_write_back_across_xcds_reads_the_old_value_and_names_the_dirty_l2():
    out, stale = _run(dict(FULL, wbl2="s_nop 0"), COUNT)
    assert out == OLD
    assert len(stale) == 1
    assert "dirty in XCD 0's L2" in stale[0]
    assert "workgroup (1, 0, 0) wave 0" in stale[0] and "GLOBAL_LOAD_DWORD" in stale[0]
    assert f"latest value {NEW:#x} was written by workgroup (0, 0, 0) wave 0" in stale[0]


def test_dropped_write_back_fails_the_launch_by_default():
    with pytest.raises(EmulatorFault, match="stale read: workgroup \\(1, 0, 0\\).*dirty in XCD 0's L2"):
        _run(dict(FULL, wbl2="s_nop 0"), WeakMemory())


def test_dropped_write_back_on_one_xcd_is_fresh():
    assert _run(dict(FULL, wbl2="s_nop 0"), WeakMemory(placement="one-xcd", fail=False)) == (NEW, [])


def test_dropped_invalidate_is_stale_only_with_a_warm_l1():
    assert _run(dict(FULL, inv="s_nop 0"), COUNT) == (NEW, [])
    out, stale = _run(dict(FULL, inv="s_nop 0", warm=WARM_L1), COUNT)
    assert out == OLD
    assert len(stale) == 1 and "vector L1 was a line filled at pc" in stale[0]


def test_full_publish_with_a_warm_l1_is_fresh():
    assert _run(dict(FULL, warm=WARM_L1), COUNT) == (NEW, [])


def test_scalar_load_after_invalidate_with_a_warm_scalar_cache_is_stale():
    out, stale = _run(dict(FULL, warm=WARM_SCALAR, read=SCALAR_READ), COUNT)
    assert out == OLD
    assert len(stale) == 1 and "scalar cache was a line filled at pc" in stale[0] and "S_LOAD_DWORD" in stale[0]
    assert _run(dict(FULL, read=SCALAR_READ), COUNT) == (NEW, [])  # a cold scalar cache misses


def test_vllm_discipline_is_fresh():
    assert _run(VLLM, COUNT) == (NEW, [])


def test_missing_vmcnt_is_stale_when_the_flag_completes_first():
    mutant = dict(FULL, vmcnt="s_nop 0")
    assert _run(mutant, COUNT) == (NEW, [])  # in order, the data lands before the flag
    out, stale = _run(mutant, WeakMemory(fail=False, flag_first=True))
    assert out == OLD
    assert len(stale) == 1 and "still queued in workgroup (0, 0, 0) wave 0" in stale[0]
    assert _run(FULL, WeakMemory(fail=False, flag_first=True)) == (NEW, [])


def test_permuted_placement_is_seeded():
    # Two workgroups permuted keep XCDs 0 and 1 (a permutation of 0, 1): the mutant stays stale.
    out, stale = _run(dict(FULL, wbl2="s_nop 0"), WeakMemory(placement="permuted", seed=3, fail=False))
    assert out == OLD and len(stale) == 1


def test_sequentially_consistent_mode_reads_the_new_value_of_every_mutant():
    for steps in (dict(FULL, wbl2="s_nop 0"), dict(FULL, inv="s_nop 0", warm=WARM_L1), dict(FULL, vmcnt="s_nop 0")):
        assert _run(steps, None) == (NEW, [])


def test_unknown_placement_is_one_line():
    with pytest.raises(ValueError, match="placement 'spread': expected one of round-robin, one-xcd, permuted"):
        WeakMemory(placement="spread")


def test_a_wave_reads_its_own_store_before_it_completes():
    """Program order within a CU: a load after the wave's own store sees it with no s_waitcnt."""
    body = """  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v1, 0
  global_load_dword v2, v1, s[4:5]
  s_waitcnt vmcnt(0)
  v_mov_b32 v3, 9
  global_store_dword v1, v3, s[4:5]
  global_load_dword v4, v1, s[4:5]
  s_waitcnt vmcnt(0)
  global_store_dword v1, v4, s[4:5] offset:4
  s_endpgm
"""
    memory = torch.zeros(8, dtype=torch.uint8)
    machine = Machine()
    machine.weak_memory = WeakMemory(fail=False, flag_first=True)
    machine.register(memory, "own")
    report = machine.launch(CodeObject(assemble(body)), (1, 1, 1), (1, 1, 1), struct.pack("<Q", memory.data_ptr()))
    assert report.stale_report == [] and memory[4] == 9


def test_a_launch_past_the_line_budget_fails_in_one_line():
    with pytest.raises(EmulatorFault, match="weak-memory mode: the launch needs more than lines=2 lines of writable memory touched"):
        _run(FULL, WeakMemory(fail=False, lines=2))


def test_an_unaligned_load_across_two_lines_reads_both():
    """A ushort at byte 127 takes its bytes from two lines (numbered apart: the flag's line is met
    between them)."""
    across = dict(FULL, data_bits=" offset:124\n  global_store_dword v1, v3, s[4:5] offset:128",
                  read="global_load_ushort v4, v1, s[4:5] offset:127\n  s_waitcnt vmcnt(0)")
    assert _run(across, COUNT) == (NEW << 8, [])


def test_a_write_back_forced_by_a_probe_reaches_the_prober_copy():
    """XCD 1 holds a dirty byte of a line; XCD 0, holding the line clean, writes it back with a
    byte of its own: the probe writes XCD 1's byte back and XCD 0's copy must show it."""
    from dataclasses import dataclass

    import numpy as np
    from numba import typed

    from mono_jit.emulator import weak, weak_state

    @dataclass
    class Buffer:
        base: int
        size: int
        view: np.ndarray
        writable: bool = True
        weight: bool = False

    view = np.zeros(128, np.uint8)
    W = weak_state.build(COUNT, [Buffer(0x1000, 128, view)], set(), np.array([0, 1]), np.array([0, 0]), 1)
    bufs, alloc = typed.List([view]), np.array([[0x1000, 128, 1, 0]], np.int64)
    assert weak.load(W, bufs, alloc, 0, 0, 0, 0, 4, 0, True, False) == 0  # XCD 0 holds the line, clean
    weak.issue(W, 1)
    assert weak.store_byte(W, bufs, alloc, 1, 5, 0, 1, 0xAB, False) and weak.wait_vmcnt(W, 1, 0)  # dirty in XCD 1
    weak.issue(W, 0)
    assert weak.store_byte(W, bufs, alloc, 0, 6, 0, 0, 0xCD, False) and weak.wbl2(W, 0, True)
    assert weak.wait_vmcnt(W, 0, 0)  # XCD 0 writes back and probes XCD 1
    view[1], view[0] = 0xAB, 0xCD  # the latest bytes, as the interpreter keeps them
    assert weak.load(W, bufs, alloc, 0, 7, 0, 0, 2, 0xABCD, True, False) == 0xABCD
    assert W[0][weak.O_COUNT] == 0


def test_the_warm_l1_option_makes_a_dropped_invalidate_stale_with_no_earlier_read():
    """With `warm_l1` the consumer's L1 holds the line before the launch (as if read earlier):
    without the invalidate it reads that copy; with it, the fresh value."""
    warm = WeakMemory(fail=False, warm_l1=True)
    out, stale = _run(dict(FULL, inv="s_nop 0"), warm)
    assert out == OLD
    assert len(stale) == 1 and "vector L1 was a line filled before the launch before the write" in stale[0]
    assert _run(FULL, warm) == (NEW, [])
    # vLLM's discipline relies on the consumer not having read the line before: warm, it is stale
    assert _run(VLLM, warm)[0] == OLD
