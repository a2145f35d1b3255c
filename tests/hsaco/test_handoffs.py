"""The site-by-site hand-off check on small hand-written kernels (assembled by LLVM): each
sequence of AMDGPUUsage's "Memory Model GFX942" table passes, each weakened one is reported at
its site with what is missing, and a scalar load is proved to read the kernarg segment or
reported."""

from __future__ import annotations

import pytest
from asm_kernels import TOOLS_PRESENT, assemble

from mono_jit.config import Settings
from mono_jit.hsaco.handoffs import check_listing
from mono_jit.hsaco.isa import disassemble, find_objdump
from mono_jit.hsaco.kernarg_loads import kernarg_pair, unproved_scalar_loads
from mono_jit.hsaco.listing import parse_listing

pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs LLVM 22's llvm-mc and ld.lld")

DATA = "global_store_dword v1, v2, s[4:5]\n"
RELEASE = "buffer_wbl2 sc1\ns_waitcnt vmcnt(0)\n"
FLAG = "global_store_dword v1, v3, s[6:7] sc1\n"
POLL = """.Lpoll:
  s_sleep 1
  global_load_dword v4, v1, s[6:7] sc1
  s_waitcnt vmcnt(0)
  v_cmp_eq_u32_e32 vcc, 0, v4
  s_cbranch_vccnz .Lpoll
"""
ACQUIRE = "s_waitcnt vmcnt(0)\nbuffer_inv sc1\n"
READ = "global_load_dword v5, v1, s[4:5]\n"


def findings(body: str) -> list[tuple[str, str, str]]:
    listing = disassemble(assemble(body + "s_endpgm\n"), find_objdump(Settings()))
    return [(f.rule, f.instruction, f.missing) for f in check_listing(listing)]


def test_the_tables_release_and_acquire_pass():
    assert findings(DATA + RELEASE + FLAG) == []
    assert findings(POLL + ACQUIRE + READ) == []


def test_a_flag_store_without_the_write_back_is_reported_at_its_site():
    (finding,) = findings(DATA + "s_waitcnt vmcnt(0)\n" + FLAG)
    assert finding == ("release", FLAG.strip(), "stored data not written back (agent scope)")


def test_a_flag_store_before_the_write_back_completes_is_reported():
    (finding,) = findings(DATA + "buffer_wbl2 sc1\n" + FLAG)
    assert finding[2] == "write-back not waited for (agent scope)"


def test_a_write_back_short_of_the_flags_scope_is_reported():
    assert findings(DATA + "buffer_wbl2\ns_waitcnt vmcnt(0)\n" + FLAG)[0][2].startswith("stored data not written back")
    system_flag = "global_store_dword v1, v3, s[6:7] sc0 sc1\n"
    assert findings(DATA + RELEASE + system_flag) == [
        ("release", system_flag.strip(), "stored data not written back (system scope)")]
    assert findings(DATA + "buffer_wbl2 sc0 sc1\ns_waitcnt vmcnt(0)\n" + system_flag) == []


def test_a_release_on_one_path_only_is_reported():
    body = DATA + "s_cmp_eq_u32 s2, 0\ns_cbranch_scc1 .Lskip\n" + RELEASE + ".Lskip:\n" + FLAG
    assert [f[0] for f in findings(body)] == ["release"]


def test_written_through_data_needs_only_the_wait():
    wide = "global_store_dwordx4 v1, v[8:11], s[4:5] sc1\n"
    assert findings(wide + "s_waitcnt vmcnt(0)\n" + FLAG) == []
    assert findings(wide + FLAG)[0][2] == "written-through store not waited for (agent scope)"


def test_an_rmw_atomic_is_a_flag_too():
    assert findings(DATA + "global_atomic_add v1, v3, s[6:7]\n")[0][0] == "release"
    assert findings(DATA + RELEASE + "global_atomic_add v1, v3, s[6:7]\n") == []


def test_a_read_after_a_poll_without_the_invalidate_is_reported():
    (finding,) = findings(POLL + READ)
    assert finding[:2] == ("acquire", READ.strip()) and "no invalidate since the poll (agent scope)" in finding[2]
    assert findings(POLL + "buffer_inv sc1\n" + READ) == []  # the loop's own wait covers the poll
    assert findings(POLL + "buffer_inv sc0\n" + READ)[0][0] == "acquire"  # the L1 only: L2 may be stale
    assert findings(POLL + "global_load_dword v5, v1, s[4:5] sc1\n") == []  # coherent by itself


def test_an_invalidate_issued_before_the_poll_completes_does_not_acquire():
    unwaited = ".Lagain:\nglobal_load_dword v4, v1, s[6:7] sc1\ns_cbranch_scc1 .Lagain\n"
    assert findings(unwaited + "buffer_inv sc1\ns_waitcnt vmcnt(0)\n" + READ)[0][0] == "acquire"
    assert findings(unwaited + ACQUIRE + READ) == []


def test_value_and_tag_pairs_carry_their_data():
    pair = "global_store_dwordx2 v1, v[8:9], s[6:7] sc0 sc1\n"
    pair_poll = ".Lagain:\ns_sleep 1\nglobal_load_dwordx2 v[8:9], v1, s[6:7] sc0 sc1\ns_waitcnt vmcnt(0)\ns_cbranch_scc1 .Lagain\n"
    assert findings(DATA + pair) == [] and findings(pair_poll + READ) == []


def _scalar(body: str, kernarg_size: int = 64) -> list[str]:
    hsaco = assemble(body + "s_endpgm\n")
    code = parse_listing(disassemble(hsaco, find_objdump(Settings())))
    return [f.missing for f in unproved_scalar_loads(code, kernarg_pair(hsaco, "k"), kernarg_size)]


def test_scalar_loads_of_the_kernarg_segment_are_proved():
    assert _scalar("s_load_dwordx2 s[4:5], s[0:1], 0x8\ns_mov_b64 s[10:11], s[0:1]\ns_load_dword s6, s[10:11], 0x10\n") == []


def test_a_scalar_load_of_anything_else_is_reported():
    through_pointer = "s_load_dwordx2 s[4:5], s[0:1], 0x0\ns_waitcnt lgkmcnt(0)\ns_load_dword s6, s[4:5], 0x0\n"
    assert _scalar(through_pointer) == ["its base s[4:5] is not the kernarg pointer on every path"]
    clobbered_on_a_path = "s_cmp_eq_u32 s2, 0\ns_cbranch_scc1 .Lload\ns_mov_b32 s1, 0\n.Lload:\ns_load_dword s6, s[0:1], 0x0\n"
    assert _scalar(clobbered_on_a_path) == ["its base s[0:1] is not the kernarg pointer on every path"]
    assert _scalar("s_load_dwordx2 s[4:5], s[0:1], 0x3c\n") == ["its offset is not inside the 64-byte kernarg segment"]


def test_a_branch_only_an_empty_exec_takes_is_not_a_path():
    """The compiler's first-lane election after an execz guard: its own execz branch is never
    taken, so the write-back inside it covers the flag store after it; an ordinary branch around
    the write-back is a path."""
    election = """s_cmp_eq_u32 s2, 0
s_cbranch_execz .Lend
s_mov_b64 s[8:9], exec
v_mbcnt_lo_u32_b32 v6, s8, 0
v_mbcnt_hi_u32_b32 v6, s9, v6
v_cmp_eq_u32_e32 vcc, 0, v6
s_and_saveexec_b64 s[10:11], vcc
s_cbranch_execz .Lskip
""" + RELEASE + "global_atomic_add v1, v3, s[6:7]\n.Lskip:\n" + FLAG + ".Lend:\n"
    assert findings(DATA + election) == []
    assert findings(DATA + election.replace("v_cmp_eq_u32_e32 vcc, 0, v6", "v_cmp_eq_u32_e32 vcc, 1, v6"))[0][0] == "release"


def test_each_fence_mutant_of_a_hand_off_is_caught_and_an_idle_fence_is_named():
    from mono_jit.hsaco.fence_mutants import fence_mutants, idle_fences

    body = DATA + RELEASE + FLAG + RELEASE + POLL + ACQUIRE + READ + "s_endpgm\n"  # the second release is idle
    hsaco = assemble(body)
    listing = disassemble(hsaco, find_objdump(Settings()))
    code = parse_listing(listing)
    mutants = list(fence_mutants(hsaco, listing))
    assert [m.instruction for m in mutants] == ["buffer_wbl2 sc1", "s_waitcnt vmcnt(0)"] * 2 + ["buffer_inv sc1"]
    idle = idle_fences(code)
    assert [code[i].text for i in idle] == ["buffer_wbl2 sc1", "s_waitcnt vmcnt(0)"]
    assert sorted(code[i].address for i in idle) == [m.address for m in mutants[2:4]]
    caught = [bool(check_listing(disassemble(m.hsaco, find_objdump(Settings())))) for m in mutants]
    assert caught == [True, True, False, False, True]
