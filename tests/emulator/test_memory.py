"""Vector and scalar memory (emulator/memory.py) and LDS (emulator/lds.py): loads of every width
and sign from the inputs, stores and atomics into a writable buffer read back, raw buffer range
checks, per-lane scratch, and LDS reads and writes in every addressing form, each against the
bytes the CDNA4 ISA's definition gives."""

from __future__ import annotations

import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import Case, lanes, run_cases, s32, table

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

IN = lanes(1)
TABLE = table(IN)
M = 0xFFFFFFFF


def byte(k: int) -> int:
    """Byte k of the input table (little-endian)."""
    return TABLE[k // 4] >> 8 * (k % 4) & 0xFF


def sext(value: int, bits: int) -> int:
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def _regs(first: int, dwords: int) -> str:
    return f"v{first}" if dwords == 1 else f"v[{first}:{first + dwords - 1}]"


def _loads(kind: str, setup: str = "") -> list[Case]:
    """Every load of `kind` (global, or buffer through s[12:15]) from the inputs: the wide ones at
    their width times the lane (the last dword read back), the narrow ones inside the lane's dword."""
    def at(vaddr: str) -> str:
        return f"{vaddr}, s[4:5]" if kind == "global" else f"{vaddr}, s[12:15], 0 offen"

    cases = []
    for suffix, dwords in (("dword", 1), ("dwordx2", 2), ("dwordx3", 3), ("dwordx4", 4)):
        cases.append(Case(f"{kind.upper()}_LOAD_{suffix.upper()}",
                          f"{setup}  v_mul_u32_u24 v11, {4 * dwords}, v0\n"
                          f"  {kind}_load_{suffix} {_regs(12, dwords)}, {at('v11')}\n  s_waitcnt vmcnt(0)\n"
                          f"  v_mov_b32 v6, v{11 + dwords}\n",
                          lambda L, d=dwords: TABLE[d * L.lane + d - 1]))
    for suffix, offset, want in (("ubyte", 1, lambda L: byte(4 * L.lane + 1)),
                                 ("sbyte", 3, lambda L: sext(byte(4 * L.lane + 3), 8)),
                                 ("ushort", 2, lambda L: TABLE[L.lane] >> 16),
                                 ("sshort", 2, lambda L: sext(TABLE[L.lane] >> 16, 16))):
        cases.append(Case(f"{kind.upper()}_LOAD_{suffix.upper()}",
                          f"{setup}  {kind}_load_{suffix} v6, {at('v1')} offset:{offset}\n  s_waitcnt vmcnt(0)\n", want))
    return cases


# V# of the inputs (raw: stride 0, 1280 bytes) in s[12:15], and of the writable memory in s[16:19]
INPUT_RESOURCE = ("  s_mov_b32 s12, s4\n  s_and_b32 s13, s5, 0xffff\n  s_movk_i32 s14, 0x500\n"
                  "  s_mov_b32 s15, 0x27000\n")
MEMORY_RESOURCE = ("  s_mov_b32 s16, s24\n  s_and_b32 s17, s25, 0xffff\n  s_movk_i32 s18, 0x1000\n"
                   "  s_mov_b32 s19, 0x27000\n")


def _stores(kind: str) -> list[Case]:
    """Each store of `kind` (global, or buffer through s[16:19]) over y in all four dwords of the
    lane's 16 bytes of memory (v10 = 16 x lane), one dword read back."""
    def put(suffix: str, data: str) -> str:
        if kind == "global":
            return f"  global_store_{suffix} v10, {data}, s[24:25]\n"
        return f"  buffer_store_{suffix} {data}, v10, s[16:19], 0 offen\n"

    setup = (MEMORY_RESOURCE + "  v_lshlrev_b32 v10, 4, v0\n  v_mov_b32 v11, v4\n" + "".join(f"  v_mov_b32 v{r}, v5\n" for r in range(12, 16))
             + put("dwordx4", "v[12:15]"))
    cases = []
    for suffix, data, offset, want in (
            ("byte", "v4", 0, lambda L: L.y & ~0xFF | L.x & 0xFF),
            ("short", "v4", 0, lambda L: L.y & ~0xFFFF | L.x & 0xFFFF),
            ("dword", "v4", 0, lambda L: L.x),
            ("dwordx2", "v[4:5]", 4, lambda L: L.y),
            ("dwordx3", "v[8:10]", 8, lambda L: 16 * L.lane),  # v10, the third, is the address
            ("dwordx4", "v[8:11]", 12, lambda L: L.x)):
        cases.append(Case(f"{kind.upper()}_STORE_{suffix.upper()}", setup + put(suffix, data)
                          + f"  global_load_dword v6, v10, s[24:25] offset:{offset}\n  s_waitcnt vmcnt(0)\n", want))
    return cases


def _atomic(op: str, mnemonic: str, want_new, want_old=None, data: str = "v5", before: str = "") -> list[Case]:
    """`mnemonic` on memory holding x at the lane's dword: the value after, and the value it
    returns with sc0 (the one before)."""
    setup = before + "  global_store_dword v1, v4, s[24:25]\n"
    cases = [Case(op, setup + f"  {mnemonic} v1, {data}, s[24:25]\n"
                  "  s_waitcnt vmcnt(0)\n  global_load_dword v6, v1, s[24:25]\n  s_waitcnt vmcnt(0)\n", want_new)]
    if want_old is not None:
        cases.append(Case(op, setup + f"  {mnemonic} v6, v1, {data}, s[24:25] sc0\n  s_waitcnt vmcnt(0)\n", want_old))
    return cases


def _lds(op: str, asm: str, want) -> Case:
    return Case(op, asm + "  s_waitcnt lgkmcnt(0)\n", want)


def _next(lane: int, field: str = "x") -> int:
    return getattr(IN[(lane + 1) % 64], field)


# LDS: each lane writes at an address of its own and reads its neighbour's (lane + 1), so a wrong
# address or width shows. v10 = the lane's address, v11 = its neighbour's.
def _addresses(bytes_a_lane: int) -> str:
    return (f"  v_mul_u32_u24 v10, {bytes_a_lane}, v0\n  v_add_u32 v11, 1, v0\n  v_and_b32 v11, 63, v11\n"
            f"  v_mul_u32_u24 v11, {bytes_a_lane}, v11\n")


LDS_CASES = [
    _lds("DS_WRITE_B32", _addresses(4) + "  ds_write_b32 v10, v4\n  ds_read_b32 v6, v11\n", lambda L: _next(L.lane)),
    _lds("DS_READ_B32", _addresses(4) + "  ds_write_b32 v10, v5 offset:4\n  ds_read_b32 v6, v11 offset:4\n",
         lambda L: _next(L.lane, "y")),
    _lds("DS_WRITE_B64", _addresses(8) + "  ds_write_b64 v10, v[4:5]\n  ds_read_b64 v[12:13], v11\n"
         "  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v13\n", lambda L: _next(L.lane, "y")),
    _lds("DS_READ_B64", _addresses(8) + "  ds_write_b64 v10, v[8:9]\n  ds_read_b64 v[12:13], v11\n"
         "  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v12\n", lambda L: _next(L.lane, "f_bits")),
    _lds("DS_WRITE_B96", _addresses(16) + "  v_mov_b32 v12, v4\n  v_mov_b32 v13, v5\n  v_mov_b32 v14, v7\n"
         "  ds_write_b96 v10, v[12:14]\n  ds_read_b96 v[16:18], v11\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v18\n",
         lambda L: _next(L.lane, "n")),
    _lds("DS_READ_B96", _addresses(16) + "  ds_read_b96 v[16:18], v11\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v17\n",
         lambda L: _next(L.lane, "y")),
    _lds("DS_WRITE_B128", _addresses(16) + "  v_mov_b32 v12, v4\n  v_mov_b32 v13, v5\n  v_mov_b32 v14, v7\n"
         "  v_mov_b32 v15, v9\n  ds_write_b128 v10, v[12:15]\n  ds_read_b128 v[16:19], v11\n  s_waitcnt lgkmcnt(0)\n"
         "  v_mov_b32 v6, v19\n", lambda L: _next(L.lane, "g_bits")),
    _lds("DS_READ_B128", _addresses(16) + "  ds_read_b128 v[16:19], v11\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v16\n",
         lambda L: _next(L.lane)),
    # two addresses: offsets in dwords (read2 / write2), in 64-byte rows of dwords (st64)
    _lds("DS_WRITE2_B32", _addresses(8) + "  ds_write2_b32 v10, v4, v5 offset0:1 offset1:0\n"
         "  ds_read_b32 v6, v11\n", lambda L: _next(L.lane, "y")),
    _lds("DS_READ2_B32", _addresses(8) + "  ds_read2_b32 v[12:13], v11 offset0:1 offset1:0\n  s_waitcnt lgkmcnt(0)\n"
         "  v_sub_u32 v6, v12, v13\n", lambda L: _next(L.lane) - _next(L.lane, "y")),
    _lds("DS_WRITE2_B64", _addresses(16) + "  ds_write2_b64 v10, v[4:5], v[8:9] offset0:1 offset1:0\n"
         "  ds_read_b32 v6, v11 offset:12\n", lambda L: _next(L.lane, "y")),
    _lds("DS_READ2_B64", _addresses(16) + "  ds_read2_b64 v[12:15], v11 offset0:1 offset1:0\n"
         "  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v14\n", lambda L: _next(L.lane, "f_bits")),
    _lds("DS_WRITE2ST64_B32", _addresses(4) + "  ds_write2st64_b32 v10, v4, v5 offset0:0 offset1:2\n"
         "  ds_read_b32 v6, v11 offset:512\n", lambda L: _next(L.lane, "y")),
    _lds("DS_READ2ST64_B32", _addresses(4) + "  ds_read2st64_b32 v[12:13], v11 offset0:2 offset1:0\n"
         "  s_waitcnt lgkmcnt(0)\n  v_xor_b32 v6, v12, v13\n", lambda L: _next(L.lane, "y") ^ _next(L.lane)),
    _lds("DS_READ2ST64_B64", _addresses(8) + "  ds_write_b64 v10, v[4:5]\n  ds_write_b64 v10, v[8:9] offset:1024\n"
         "  ds_read2st64_b64 v[12:15], v11 offset0:2 offset1:0\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v6, v12\n",
         lambda L: _next(L.lane, "f_bits")),
    _lds("DS_OR_B32", _addresses(4) + "  ds_write_b32 v10, v4\n  ds_or_b32 v10, v5\n  ds_read_b32 v6, v11\n",
         lambda L: _next(L.lane) | _next(L.lane, "y")),
]

SCRATCH = 32  # bytes of private segment a work-item
SCRATCH_CASES = [
    Case(f"SCRATCH_STORE_DWORD{suffix}", f"  v_mov_b32 v10, v4\n  v_mov_b32 v11, v5\n  v_mov_b32 v12, v7\n"
         f"  v_mov_b32 v13, v9\n  scratch_store_dword{suffix} off, {_regs(10, n)}, off offset:8\n"
         f"  scratch_load_dword v6, off, off offset:{4 + 4 * n}\n  s_waitcnt vmcnt(0)\n",
         lambda L, n=n: (L.x, L.y, L.n, L.g_bits)[n - 1])
    for suffix, n in (("", 1), ("X2", 2), ("X3", 3), ("X4", 4))
] + [
    Case(f"SCRATCH_LOAD_DWORD{suffix}", f"  v_mov_b32 v10, v9\n  v_mov_b32 v11, v4\n  v_mov_b32 v12, v5\n"
         f"  v_mov_b32 v13, v7\n  scratch_store_dwordx4 off, v[10:13], off offset:16\n"
         f"  scratch_load_dword{suffix} {_regs(14, n)}, off, off offset:16\n  s_waitcnt vmcnt(0)\n"
         f"  v_mov_b32 v6, v{13 + n}\n", lambda L, n=n: (L.g_bits, L.x, L.y, L.n)[n - 1])
    for suffix, n in (("", 1), ("X2", 2), ("X3", 3), ("X4", 4))
]

CASES = [
    *_loads("global"),
    *_loads("buffer", INPUT_RESOURCE),
    # a raw buffer of 128 bytes: lanes past dword 31 read 0
    Case("BUFFER_LOAD_DWORD", INPUT_RESOURCE + "  s_movk_i32 s14, 0x80\n  buffer_load_dword v6, v1, s[12:15], 0 offen\n"
         "  s_waitcnt vmcnt(0)\n", lambda L: TABLE[L.lane] if L.lane < 32 else 0),
    *_stores("global"),
    *_stores("buffer"),
    *_atomic("GLOBAL_ATOMIC_ADD", "global_atomic_add", lambda L: L.x + L.y, lambda L: L.x),
    *_atomic("GLOBAL_ATOMIC_OR", "global_atomic_or", lambda L: L.x | L.y),
    *_atomic("GLOBAL_ATOMIC_SWAP", "global_atomic_swap", lambda L: L.y, lambda L: L.x),
    *_atomic("GLOBAL_ATOMIC_SMAX", "global_atomic_smax", lambda L: L.x if s32(L.x) >= s32(L.y) else L.y),
    *_atomic("GLOBAL_ATOMIC_UMAX", "global_atomic_umax", lambda L: max(L.x, L.y)),
    # cmpswap's data is {new, compare}: v12 = y, v13 = x in even lanes (swapped), x + 1 in odd
    *_atomic("GLOBAL_ATOMIC_CMPSWAP", "global_atomic_cmpswap", lambda L: L.y if L.lane % 2 == 0 else L.x,
             data="v[12:13]", before="  v_mov_b32 v12, v5\n  v_and_b32 v13, 1, v0\n  v_add_u32 v13, v4, v13\n"),
    # the cache maintenance instructions keep a store visible (memory is sequentially consistent)
    Case("BUFFER_WBL2", "  global_store_dword v1, v5, s[24:25]\n  buffer_wbl2 sc0 sc1\n  s_waitcnt vmcnt(0)\n"
         "  global_load_dword v6, v1, s[24:25]\n  s_waitcnt vmcnt(0)\n", lambda L: L.y),
    Case("BUFFER_INV", "  global_store_dword v1, v4, s[24:25]\n  buffer_inv sc1\n  global_load_dword v6, v1, s[24:25]\n"
         "  s_waitcnt vmcnt(0)\n", lambda L: L.x),
]


def test_memory_operations_give_the_isas_answers():
    wrong = run_cases(CASES)
    assert not wrong, "\n".join(wrong[:20])


def test_lds_operations_give_the_isas_answers():
    wrong = run_cases(LDS_CASES, lds=2048)
    assert not wrong, "\n".join(wrong[:20])


def test_scratch_operations_give_the_isas_answers():
    wrong = run_cases(SCRATCH_CASES, scratch=SCRATCH)
    assert not wrong, "\n".join(wrong[:20])
