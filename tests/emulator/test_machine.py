"""The emulator on small assembled kernels (tests/support/asm_kernels.py): single instructions against
answers computed here from AMD's ISA definitions with exact arithmetic, and the machine's
behaviour (co-resident workgroups, buffer range checks, faults, traps, deadlock reports)."""

from __future__ import annotations

import struct
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
import torch
from asm_kernels import TOOLS_PRESENT, assemble

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

from mono_jit.emulator import CodeObject, CodeObjectError, Deadlock, EmulatorFault, Machine  # noqa: E402

LANES = 64


def _two_inputs(row_bytes: int) -> str:
    """The prologue of a kernel of kernarg (i, j, out): v4 = i[lane], v5 = j[lane], v3 = the
    lane's row of `row_bytes` in out (s[10:11])."""
    return f"""  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_load_dwordx4 s[8:11], s[0:1], 0x8
  v_lshlrev_b32 v1, 2, v0
  v_mul_u32_u24 v3, {row_bytes}, v0
  s_waitcnt lgkmcnt(0)
  global_load_dword v4, v1, s[4:5]
  global_load_dword v5, v1, s[8:9]
  s_waitcnt vmcnt(0)
"""


def _launch_two_inputs(body: str, i: torch.Tensor, j: torch.Tensor, out: torch.Tensor, **kw) -> None:
    """One wave of `body` with kernarg (i, j, out): i and j read-only."""
    machine = Machine()
    machine.register(i, "i", writable=False)
    machine.register(j, "j", writable=False)
    machine.register(out, "out")
    machine.launch(_code(body, **kw), (1, 1, 1), (LANES, 1, 1), struct.pack("<QQQ", i.data_ptr(), j.data_ptr(),
                                                                          out.data_ptr()))


OPS_BODY = _two_inputs(64) + """  s_mov_b32 s12, 0x7fffffff
  v_add_u32 v6, s12, v4
  global_store_dword v3, v6, s[10:11]
  s_mov_b32 s12, 0x9e3779b9
  v_mul_hi_u32 v6, v4, s12
  global_store_dword v3, v6, s[10:11] offset:4
  v_ashrrev_i32 v6, 3, v4
  global_store_dword v3, v6, s[10:11] offset:8
  v_bfe_i32 v6, v4, 4, 7
  global_store_dword v3, v6, s[10:11] offset:12
  s_mov_b32 s12, 0x0c050702
  v_perm_b32 v6, v4, v5, s12
  global_store_dword v3, v6, s[10:11] offset:16
  v_cvt_f32_i32 v6, v4
  global_store_dword v3, v6, s[10:11] offset:20
  v_fma_f32 v6, v5, v5, 0.5
  global_store_dword v3, v6, s[10:11] offset:24
  v_exp_f32 v6, v5
  global_store_dword v3, v6, s[10:11] offset:28
  v_rcp_f32 v6, v5
  global_store_dword v3, v6, s[10:11] offset:32
  v_rsq_f32_e64 v6, |v5|
  global_store_dword v3, v6, s[10:11] offset:36
  v_mul_f32 v7, 4.0, v5
  v_cvt_pk_bf16_f32 v6, v5, v7
  global_store_dword v3, v6, s[10:11] offset:40
  v_mov_b32 v6, 0
  v_cvt_pk_fp8_f32 v6, v5, v7
  global_store_dword v3, v6, s[10:11] offset:44
  s_mov_b32 s12, 0x447a0000
  v_mul_f32 v7, s12, v5
  v_cvt_i32_f32 v6, v7
  global_store_dword v3, v6, s[10:11] offset:48
  s_movk_i32 s12, 100
  v_med3_i32 v6, v4, -5, s12
  global_store_dword v3, v6, s[10:11] offset:52
  v_mbcnt_lo_u32_b32 v6, -1, 0
  global_store_dword v3, v6, s[10:11] offset:56
  ds_swizzle_b32 v6, v4 offset:swizzle(SWAP,8)
  s_waitcnt lgkmcnt(0)
  global_store_dword v3, v6, s[10:11] offset:60
  s_endpgm
"""
RESULTS = 16

# out[lane] = in[lane] + 3 over the kernarg pointers (in, out).
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

# Workgroup 1 raises flag[0] and waits for flag[1]; workgroup 0 waits for flag[0], then raises
# flag[1]: finishes only if both are resident at once. With one workgroup it waits forever.
HANDSHAKE_BODY = """
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  v_mov_b32 v1, 0
  v_mov_b32 v2, 1
  s_waitcnt lgkmcnt(0)
  s_cmp_eq_u32 s2, 0
  s_cbranch_scc1 .Lfirst
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

# Raw buffer loads and stores through resources of the given byte extents (kernarg: in, out,
# in_records, out_records): dword, sbyte and ubyte loads at lane * 4.
BUFFER_BODY = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  s_load_dwordx2 s[16:17], s[0:1], 0x10
  v_lshlrev_b32 v1, 2, v0
  s_waitcnt lgkmcnt(0)
  s_mov_b32 s8, s4
  s_and_b32 s9, s5, 0xffff
  s_mov_b32 s10, s16
  s_mov_b32 s11, 0x27000
  s_mov_b32 s12, s6
  s_and_b32 s13, s7, 0xffff
  s_mov_b32 s14, s17
  s_mov_b32 s15, 0x27000
  buffer_load_dword v2, v1, s[8:11], 0 offen
  buffer_load_sbyte v3, v1, s[8:11], 0 offen
  buffer_load_ubyte v4, v1, s[8:11], 0 offen
  s_waitcnt vmcnt(0)
  v_mul_u32_u24 v5, 12, v0
  buffer_store_dword v2, v5, s[12:15], 0 offen
  buffer_store_dword v3, v5, s[12:15], 0 offen offset:4
  buffer_store_dword v4, v5, s[12:15], 0 offen offset:8
  s_endpgm
"""


def _code(body: str, **kw) -> CodeObject:
    return CodeObject(assemble(body, **kw))


def _round_f32(exact: Fraction) -> float:
    """exact rounded to the nearest f32, ties to even (finite, normal results)."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))
    return float(best)


def _decimal(x: float) -> Decimal:
    return Decimal(Fraction(x).numerator) / Decimal(Fraction(x).denominator)


def _expected(i: np.ndarray, f: np.ndarray) -> np.ndarray:
    """What each instruction of OPS_BODY computes (AMD CDNA4 ISA, the op's description)."""
    getcontext().prec = 60
    out = np.zeros((LANES, RESULTS), np.uint32)
    u = i.view(np.uint32).astype(np.uint64)
    f32 = lambda x: np.float32(x).view(np.uint32)  # noqa: E731
    for lane in range(LANES):
        iv, fv, uv = int(i[lane]), float(f[lane]), int(u[lane])
        sel, pair = 0x0C050702, uv << 32 | int(f[lane:lane + 1].view(np.uint32)[0])
        perm = 0
        for k in range(4):
            s = sel >> 8 * k & 0xFF
            perm |= (pair >> 8 * s & 0xFF if s < 8 else 0) << 8 * k  # 12: the byte 0x00
        field = (iv >> 4) & 0x7F
        row = [
            (uv + 0x7FFFFFFF) & 0xFFFFFFFF,
            (uv * 0x9E3779B9) >> 32,
            iv >> 3 & 0xFFFFFFFF,
            (field - 0x80 if field & 0x40 else field) & 0xFFFFFFFF,
            perm,
            f32(iv),
            f32(_round_f32(Fraction(fv) * Fraction(fv) + Fraction(1, 2))),
            f32(_round_f32(Fraction((_decimal(fv) * Decimal(2).ln()).exp()))),
            f32(_round_f32(1 / Fraction(fv))),
            f32(_round_f32(Fraction(1 / _decimal(abs(fv)).sqrt()))),
            (_bf16(fv) | _bf16(4 * fv) << 16),
            (_e4m3(fv) | _e4m3(4 * fv) << 8),
            int(np.float32(_round_f32(Fraction(fv) * 1000))) & 0xFFFFFFFF,
            min(max(iv, -5), 100) & 0xFFFFFFFF,
            min(lane, 32),
            int(u[lane ^ 8]),
        ]
        out[lane] = row
    return out


def _bf16(x: float) -> int:
    return int(torch.tensor([x]).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def _e4m3(x: float) -> int:
    return int(torch.tensor([x]).to(torch.float8_e4m3fn).view(torch.uint8).item())


def test_single_instructions_give_the_isas_answers():
    """Integer, bit-field, byte-permute, conversion (f32, bf16, fp8 e4m3 with round to nearest
    even), fused multiply-add, transcendentals correctly rounded, lane count and swizzle."""
    g = torch.Generator().manual_seed(3)
    i = torch.randint(-2**31, 2**31 - 1, (LANES,), generator=g, dtype=torch.int64).to(torch.int32)
    magnitude = torch.rand(LANES, generator=g) * 3.75 + 0.25
    f = torch.where(torch.rand(LANES, generator=g) < 0.5, -magnitude, magnitude)
    out = torch.zeros(LANES * RESULTS, dtype=torch.int32)
    _launch_two_inputs(OPS_BODY, i, f, out)
    got = out.numpy().view(np.uint32).reshape(LANES, RESULTS)
    want = _expected(i.numpy(), f.numpy())
    names = ("add_u32", "mul_hi_u32", "ashrrev_i32", "bfe_i32", "perm_b32", "cvt_f32_i32", "fma_f32", "exp_f32",
             "rcp_f32", "rsq_f32", "cvt_pk_bf16_f32", "cvt_pk_fp8_f32", "cvt_i32_f32", "med3_i32", "mbcnt_lo",
             "ds_swizzle")
    wrong = [f"{names[k]} lane {lane}: {got[lane, k]:#010x}, the ISA gives {want[lane, k]:#010x}"
             for k in range(RESULTS) for lane in range(LANES) if got[lane, k] != want[lane, k]]
    assert not wrong, "\n".join(wrong[:20])


def test_workgroups_are_co_resident_and_wait_on_each_other():
    flags = torch.zeros(2, dtype=torch.int32)
    machine = Machine()
    machine.register(flags, "flags")
    report = machine.launch(_code(HANDSHAKE_BODY), (2, 1, 1), (64, 1, 1), struct.pack("<Q", flags.data_ptr()))
    assert flags.tolist() == [1, 1]
    assert report.polls > 0


def test_a_wave_spinning_on_memory_nobody_writes_is_reported_not_hung():
    flags = torch.zeros(2, dtype=torch.int32)
    machine = Machine()
    machine.register(flags, "flags")
    with pytest.raises(Deadlock) as error:
        machine.launch(_code(HANDSHAKE_BODY), (1, 1, 1), (64, 1, 1), struct.pack("<Q", flags.data_ptr()))
    text = str(error.value)
    assert "workgroup (0, 0, 0) wave 0: polling at pc" in text, text
    assert f"last load {flags.data_ptr():#x} = 0x0 (inside 'flags'" in text, text


def test_buffer_loads_past_the_extent_give_zero_and_stores_past_it_are_dropped():
    """Raw buffers check each dword against num_records (offset + size > records: the load
    gives 0, the store is dropped); sbyte sign-extends, ubyte zero-extends."""
    source = torch.tensor([0x12345690 + lane for lane in range(LANES)], dtype=torch.int64).to(torch.int32)
    out = torch.full((LANES * 3,), -1, dtype=torch.int32)
    machine = Machine()
    machine.register(source, "in", writable=False)
    machine.register(out, "out")
    kernarg = struct.pack("<QQII", source.data_ptr(), out.data_ptr(), 10 * 4, 50 * 12)
    machine.launch(_code(BUFFER_BODY), (1, 1, 1), (LANES, 1, 1), kernarg)
    rows = out.view(LANES, 3)
    for lane in range(LANES):
        if lane >= 50:
            assert rows[lane].tolist() == [-1, -1, -1], f"lane {lane}: a store past the extent was written"
        elif lane >= 10:
            assert rows[lane].tolist() == [0, 0, 0], f"lane {lane}: a load past the extent was not 0"
        else:
            low = (0x90 + lane) & 0xFF
            assert rows[lane].tolist() == [0x12345690 + lane, low - 256 if low & 0x80 else low, low]


def test_an_access_outside_every_allocation_fails_with_where_it_happened():
    source = np.arange(1024, dtype=np.int32)
    out = torch.zeros(LANES, dtype=torch.int32)
    machine = Machine()
    machine.register(source[:16], "in")  # the kernel reads 64; the rest of the array is nobody's
    machine.register(out, "out")
    with pytest.raises(EmulatorFault) as error:
        machine.launch(_code(COPY_BODY), (1, 1, 1), (LANES, 1, 1), struct.pack("<QQ", source.ctypes.data,
                                                                              out.data_ptr()))
    text = str(error.value)
    assert "GLOBAL_LOAD_DWORD" in text and "lane 16" in text and "0 bytes past the end of 'in'" in text, text
    assert f"{source.ctypes.data + 64:#x}" in text
    assert out.eq(0).all(), "the faulting launch stored nothing"


def test_a_write_into_a_weight_fails():
    source = torch.arange(LANES, dtype=torch.int32)
    weight = torch.zeros(LANES, dtype=torch.int32)
    machine = Machine()
    machine.register(source, "in")
    machine.register(weight, "w_qkv", writable=False)
    with pytest.raises(EmulatorFault, match=r"write into read-only memory at 0x[0-9a-f]+, inside 'w_qkv' .*GLOBAL_STORE_DWORD\), lane 0"):
        machine.launch(_code(COPY_BODY), (1, 1, 1), (LANES, 1, 1), struct.pack("<QQ", source.data_ptr(),
                                                                              weight.data_ptr()))
    assert weight.eq(0).all()


def test_s_trap_fails_the_launch_as_hip_would():
    with pytest.raises(EmulatorFault, match=r"s_trap 2 .*: k on device 0, workgroup \(0, 0, 0\) wave 0, pc 0x[0-9a-f]+ \(S_TRAP\)"):
        Machine().launch(_code("  s_trap 2\n  s_endpgm"), (1, 1, 1), (64, 1, 1), b"")


def test_an_unaligned_lds_access_fails():
    body = "  v_mov_b32 v1, 2\n  ds_read_b32 v2, v1\n  s_waitcnt lgkmcnt(0)\n  s_endpgm"
    with pytest.raises(EmulatorFault, match=r"DS_READ_B32"):
        Machine().launch(_code(body, lds=256), (1, 1, 1), (64, 1, 1), b"")


def test_a_code_object_that_flushes_f32_denormals_is_refused():
    with pytest.raises(CodeObjectError, match="float mode 0xc0 is not emulated"):
        _code("  s_endpgm", denorm32=0)


def test_launches_run_together_keep_their_own_instructions_and_branches():
    """launch_many puts every launch's instructions in one table: only the row links (next,
    branch target) move by the rows before; every other field, the flags included, is the code
    object's own. Then two handshakes on two devices, with their branches, both complete."""
    from mono_jit.emulator.decode import F_NEXT, F_TARGET
    from mono_jit.emulator.machine import Launch, _State

    copy, other = _code(COPY_BODY), _code(HANDSHAKE_BODY)
    flags = [torch.zeros(2, dtype=torch.int32) for _ in range(2)]
    machine = Machine(devices=2)
    for k, f in enumerate(flags):
        machine.register(f, f"flags{k}")
    launches = [Launch(code, (2, 1, 1), (64, 1, 1), struct.pack("<Q", f.data_ptr()), 0, device)
                for device, (code, f) in enumerate(((other, flags[0]), (other, flags[1])))]
    state = _State(machine, [Launch(copy, (1, 1, 1), (64, 1, 1), bytes(16)), *launches])
    try:
        first, second = copy.program.table, other.program.table
        joined = state.program[len(first): len(first) + len(second)]
        links = [F_NEXT, F_TARGET]
        kept = [c for c in range(second.shape[1]) if c not in links]
        assert (joined[:, kept] == second[:, kept]).all()
        assert (joined[:, links] == second[:, links] + len(first)).all()
    finally:
        state.release()
    machine.launch_many(launches)
    assert [f.tolist() for f in flags] == [[1, 1], [1, 1]]


# Architected flat scratch (gfx940+): every work-item of 2 workgroups x 128 stores its id-derived
# words at private addresses 4..19 (through off / off + offset, SADDR + VADDR, the dwordx2 form)
# and reads them back into out[id] = (100 + id, 100 + id, 3 id, 3 id). All lanes use the same
# private addresses, so a lane or wave reading another's segment shows.
SCRATCH_BODY = """
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_lshl_b32 s7, s2, 7
  v_add_u32 v9, s7, v0
  v_add_u32 v2, 100, v9
  v_mul_u32_u24 v3, 3, v9
  scratch_store_dword off, v2, off offset:4
  scratch_store_dwordx2 off, v[2:3], off offset:8
  s_movk_i32 s6, 12
  v_mov_b32 v7, 4
  scratch_store_dword v7, v3, s6
  v_mov_b32 v2, 0
  v_mov_b32 v3, 0
  scratch_load_dword v4, off, off offset:4
  scratch_load_dwordx2 v[10:11], off, off offset:8
  scratch_load_dword v12, v7, off offset:12
  v_lshlrev_b32 v1, 4, v9
  s_waitcnt vmcnt(0) lgkmcnt(0)
  global_store_dword v1, v4, s[4:5]
  global_store_dwordx2 v1, v[10:11], s[4:5] offset:4
  global_store_dword v1, v12, s[4:5] offset:12
  s_endpgm
"""


def test_scratch_gives_each_work_item_its_own_private_segment():
    """SCRATCH_* addresses are SADDR (unless off) + VADDR (with SVE) + the offset into the
    work-item's own private segment, of the descriptor's private_segment_fixed_size (CDNA4 ISA
    CalcScratchAddr; LLVM AMDGPUUsage, private memory per work-item, gfx940+ architected flat
    scratch): each of 256 work-items in 4 waves reads back its own words."""
    out = torch.full((256, 4), -1, dtype=torch.int32)
    machine = Machine()
    machine.register(out, "out")
    report = machine.launch(_code(SCRATCH_BODY, scratch=20), (2, 1, 1), (128, 1, 1), struct.pack("<Q", out.data_ptr()))
    ids = torch.arange(256, dtype=torch.int32)
    assert torch.equal(out, torch.stack([100 + ids, 100 + ids, 3 * ids, 3 * ids], 1))
    assert report.by_class["scratch"] == 6 * 4  # 6 scratch instructions in each of 4 waves
    assert not [a for a in machine.allocations if a.name.startswith("scratch")], "the launch's scratch is released"


def test_a_scratch_access_past_the_private_segment_fails():
    body = "  v_mov_b32 v1, 7\n  scratch_store_dword off, v1, off offset:16\n  s_endpgm"
    Machine().launch(_code(body, scratch=20), (1, 1, 1), (64, 1, 1), b"")
    with pytest.raises(EmulatorFault, match=r"4 bytes at private address 0x14, past the work-item's 20-byte "
                                            r"private segment .*SCRATCH_STORE_DWORD\), lane 0"):
        Machine().launch(_code(body.replace("offset:16", "offset:20"), scratch=20), (1, 1, 1), (64, 1, 1), b"")
    with pytest.raises(EmulatorFault, match=r"past the work-item's 0-byte private segment"):
        Machine().launch(_code(body), (1, 1, 1), (64, 1, 1), b"")


# Operations vLLM's K2 uses beyond ours; kernarg (i, j, out), out[lane] 14 words (see _upstream_expected).
UPSTREAM_OPS_BODY = _two_inputs(56) + """  s_mov_b32 s12, 0
  s_mov_b32 s13, 0x100
  s_ff1_i32_b64 s14, s[12:13]
  s_mov_b32 s13, 0
  s_ff1_i32_b64 s15, s[12:13]
  v_mov_b32 v6, s14
  global_store_dword v3, v6, s[10:11]
  v_mov_b32 v6, s15
  global_store_dword v3, v6, s[10:11] offset:4
  s_movk_i32 s12, 0x10
  s_bitcmp1_b32 s12, 4
  s_cselect_b32 s13, 7, 9
  s_bitcmp1_b32 s12, 3
  s_cselect_b32 s14, 7, 9
  s_lshl_b32 s14, s14, 8
  s_or_b32 s13, s13, s14
  v_mov_b32 v6, s13
  global_store_dword v3, v6, s[10:11] offset:8
  v_cmp_gt_i16_e64 s[16:17], v4, v5
  v_cndmask_b32_e64 v6, 0, 1, s[16:17]
  global_store_dword v3, v6, s[10:11] offset:12
  v_min3_i32 v6, v4, v5, s12
  global_store_dword v3, v6, s[10:11] offset:16
  s_mov_b32 s18, 0x12345678
  v_bitop3_b16 v6, v4, v5, s18 bitop3:0xec
  v_and_b32 v6, 0xffff, v6
  global_store_dword v3, v6, s[10:11] offset:20
  ds_write_b32 v1, v4
  ds_or_b32 v1, v5
  ds_read_b32 v6, v1
  s_waitcnt lgkmcnt(0)
  global_store_dword v3, v6, s[10:11] offset:24
  s_mov_b32 s20, 0xaaaaaaaa
  s_mov_b32 s21, 0xaaaaaaaa
  v_cndmask_b32_e64 v6, -1, -|v5|, s[20:21]
  global_store_dword v3, v6, s[10:11] offset:28
  v_cndmask_b32_e64 v6, 0, |v5|, s[20:21]
  global_store_dword v3, v6, s[10:11] offset:32
  s_mov_b32 s22, 0x40400000
  v_cvt_scalef32_pk_f32_fp8 v[6:7], v4, s22
  global_store_dwordx2 v3, v[6:7], s[10:11] offset:36
  v_cvt_scalef32_pk_f32_fp8 v[6:7], v4, s22 op_sel:[1,0,0]
  v_cvt_scalef32_pk_bf16_fp8 v8, v4, s22 op_sel:[1,0,0]
  global_store_dwordx2 v3, v[6:7], s[10:11] offset:44
  global_store_dword v3, v8, s[10:11] offset:52
  s_endpgm
"""
UPSTREAM_RESULTS = 14


def _upstream_expected(i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """What each instruction of UPSTREAM_OPS_BODY computes (CDNA4 ISA pseudocode of each op)."""
    out = np.zeros((LANES, UPSTREAM_RESULTS), np.uint32)
    s16 = lambda x: (x & 0xFFFF) - 0x10000 if x & 0x8000 else x & 0xFFFF  # noqa: E731
    fp8 = lambda b: float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float())  # noqa: E731
    f32 = lambda x: int(np.float32(x).view(np.uint32))  # noqa: E731
    for lane in range(LANES):
        a, b = int(i[lane]) & 0xFFFFFFFF, int(j[lane]) & 0xFFFFFFFF
        table = 0
        for bit in range(16):  # bitop3: bit n of the table is the result for inputs (S0, S1, S2) = n
            n = (a >> bit & 1) << 2 | (b >> bit & 1) << 1 | (0x5678 >> bit & 1)
            table |= (0xEC >> n & 1) << bit
        odd = lane & 1
        scaled = [fp8(a >> 8 * k & 0xFF) * 2.0 for k in range(4)]  # scale 3.0: its exponent, 2^1
        out[lane] = [
            40, 0xFFFFFFFF, 7 | 9 << 8,
            int(s16(a) > s16(b)),
            min(int(i[lane]), int(j[lane]), 16) & 0xFFFFFFFF,
            table,
            a | b,
            (b | 0x80000000) if odd else 0xFFFFFFFF,
            (b & 0x7FFFFFFF) if odd else 0,
            f32(scaled[0]), f32(scaled[1]), f32(scaled[2]), f32(scaled[3]),
            _bf16(scaled[2]) | _bf16(scaled[3]) << 16,
        ]
    return out


def test_the_operations_of_vllms_k2_give_the_isas_answers():
    """s_ff1_i32_b64, s_bitcmp1_b32, v_cmp_gt_i16, v_min3_i32, v_bitop3_b16 (low half),
    ds_or_b32, v_cndmask_b32 with neg / abs on its sources (the f32 sign bit), and
    v_cvt_scalef32_pk_{f32,bf16}_fp8 with both words and a scale that is not a power of two
    (only its exponent counts)."""
    g = torch.Generator().manual_seed(5)
    j = torch.randint(-2**31, 2**31 - 1, (LANES,), generator=g, dtype=torch.int64).to(torch.int32)
    codes = torch.randint(0, 0x7F, (LANES, 4), generator=g) | torch.randint(0, 2, (LANES, 4), generator=g) << 7
    i = (codes << torch.tensor([0, 8, 16, 24])).sum(1).to(torch.int64).to(torch.uint32).view(torch.int32)
    out = torch.zeros(LANES * UPSTREAM_RESULTS, dtype=torch.int32)
    _launch_two_inputs(UPSTREAM_OPS_BODY, i, j, out, lds=256)
    got = out.numpy().view(np.uint32).reshape(LANES, UPSTREAM_RESULTS)
    want = _upstream_expected(i.numpy(), j.numpy())
    names = ("s_ff1", "s_ff1 of 0", "s_bitcmp1", "cmp_gt_i16", "min3_i32", "bitop3_b16", "ds_or_b32", "cndmask -|x|",
             "cndmask |x|", "scalef32 f32 b0", "b1", "b2", "b3", "scalef32 bf16 word 1")
    wrong = [f"{names[k]} lane {lane}: {got[lane, k]:#010x}, the ISA gives {want[lane, k]:#010x}"
             for k in range(UPSTREAM_RESULTS) for lane in range(LANES) if got[lane, k] != want[lane, k]]
    assert not wrong, "\n".join(wrong[:20])


# The bf16 MFMAs on operands read from memory: kernarg (a, b, out), 4 words a lane each of a and
# b; out 8 words a lane: D of v_mfma_f32_16x16x32_bf16 (all 4 words), then of _16x16x16_bf16
# (words 0-1).
BF16_MFMA_BODY = """
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  s_load_dwordx2 s[8:9], s[0:1], 0x10
  v_lshlrev_b32 v1, 4, v0
  s_waitcnt lgkmcnt(0)
  global_load_dwordx4 v[4:7], v1, s[4:5]
  global_load_dwordx4 v[8:11], v1, s[6:7]
  s_waitcnt vmcnt(0)
  v_mfma_f32_16x16x32_bf16 v[12:15], v[4:7], v[8:11], 0
  v_mfma_f32_16x16x16_bf16 v[16:19], v[4:5], v[8:9], 0
  s_nop 7
  s_nop 7
  v_lshlrev_b32 v2, 5, v0
  global_store_dwordx4 v2, v[12:15], s[8:9]
  global_store_dwordx4 v2, v[16:19], s[8:9] offset:16
  s_endpgm
"""


def test_bf16_mfmas_use_the_hardwares_operand_and_result_layouts():
    """v_mfma_f32_16x16x{16,32}_bf16: lane 16 q + i holds A[i, k] and B[k, i] for k = n q + e, its
    e-th bf16 (low half first; n = 4 or 8 a lane), and D[4 g + e, c] is element e of lane 16 g + c
    (AMD's matrix instruction calculator; Triton's AMD backend, kWidth 4 / 8). Small halves keep
    every sum exact, so D is exact."""
    g = torch.Generator().manual_seed(9)
    values = [(torch.randint(-8, 9, (LANES, 8), generator=g) / 2).to(torch.bfloat16) for _ in range(2)]
    a, b = (v.view(torch.int16).contiguous().view(torch.int32).reshape(-1) for v in values)
    out = torch.zeros(LANES * 8, dtype=torch.float32)
    _launch_two_inputs(BF16_MFMA_BODY, a, b, out)
    got = out.view(LANES, 2, 4)
    for form, (per_lane, k_total) in enumerate(((8, 32), (4, 16))):
        A = torch.zeros(16, k_total, dtype=torch.float64)
        B = torch.zeros(k_total, 16, dtype=torch.float64)
        for k in range(k_total):
            for i in range(16):
                A[i, k] = float(values[0][16 * (k // per_lane) + i, k % per_lane])
                B[k, i] = float(values[1][16 * (k // per_lane) + i, k % per_lane])
        D = A @ B
        want = torch.tensor([[D[4 * (lane // 16) + e, lane % 16] for e in range(4)] for lane in range(LANES)])
        assert torch.equal(got[:, form].double(), want), f"form {form}: {(got[:, form].double() - want).abs().max()}"


# A time-bounded wait, as K2's cross-rank polls are (kernarg: flags, limit in s_memrealtime ticks):
# wait for flags[0] != 0, then store flags[1] = 1; s_trap 2 once the wait has lasted `limit` ticks.
TIMED_WAIT_BODY = """
  s_load_dwordx2 s[4:5], s[0:1], 0x0
  s_load_dword s3, s[0:1], 0x8
  v_mov_b32 v1, 0
  v_mov_b32 v2, 1
  s_memrealtime s[12:13]
  s_waitcnt lgkmcnt(0)
.Lpoll:
  global_load_dword v4, v1, s[4:5] sc0 sc1
  s_waitcnt vmcnt(0)
  v_readfirstlane_b32 s7, v4
  s_cmp_eq_u32 s7, 0
  s_cbranch_scc0 .Lseen
  s_memrealtime s[8:9]
  s_waitcnt lgkmcnt(0)
  s_sub_u32 s10, s8, s12
  s_subb_u32 s11, s9, s13
  s_cmp_lg_u32 s11, 0
  s_cbranch_scc1 .Lexpired
  s_cmp_gt_u32 s10, s3
  s_cbranch_scc1 .Lexpired
  s_sleep 1
  s_branch .Lpoll
.Lexpired:
  s_trap 2
.Lseen:
  global_store_dword v1, v2, s[4:5] offset:4 sc0 sc1
  s_endpgm
"""


def _wait_for_another_writer(limit_seconds: float, write_after: float | None) -> tuple[float, torch.Tensor]:
    """TIMED_WAIT_BODY on a machine with external writers; a thread (standing for a peer process)
    sets the flag `write_after` seconds in (never if None). Returns (seconds the launch took, flags)."""
    import threading
    import time

    flags = torch.zeros(2, dtype=torch.int32)
    machine = Machine()
    machine.external_writers = True
    machine.register(flags, "flags")
    code = _code(TIMED_WAIT_BODY)
    timer = threading.Timer(write_after, flags.__setitem__, (0, 1)) if write_after is not None else None
    kernarg = struct.pack("<QI", flags.data_ptr(), int(limit_seconds * 100_000_000))
    start = time.monotonic()
    if timer:
        timer.start()
    try:
        machine.launch(code, (1, 1, 1), (64, 1, 1), kernarg)
    finally:
        if timer:
            timer.cancel()
    return time.monotonic() - start, flags


def test_a_time_bounded_wait_on_another_process_lasts_wall_time_not_idle_jumps():
    """With external writers the device's s_memrealtime runs on in wall time while it waits (no
    idle jumps: another process's slowness is not this device's deadlock), so a peer that writes
    within the bound is seen, and one that does not is trapped on after the bound, not at once."""
    _code(TIMED_WAIT_BODY)  # assembled before the clock starts
    took, flags = _wait_for_another_writer(limit_seconds=5.0, write_after=0.5)
    assert flags.tolist() == [1, 1] and took >= 0.5, took
    import time

    start = time.monotonic()
    with pytest.raises(EmulatorFault, match=r"s_trap 2"):
        _wait_for_another_writer(limit_seconds=0.4, write_after=None)
    assert 0.4 <= time.monotonic() - start < 5.0
