"""The cross-lane operations (emulator/crosslane.py, and the DS forms that move data between lanes
in emulator/lds.py): each lane's answer from the other lanes' inputs, per the CDNA4 ISA."""

from __future__ import annotations

import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import Case, lanes, run_cases

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

IN = lanes(1)


def _x(lane: int) -> int:
    return IN[lane].x


CASES = [
    # readfirstlane with lanes 0-2 off: lane 3's x in every lane
    Case("V_READFIRSTLANE_B32", "  s_mov_b64 s[22:23], exec\n  s_mov_b64 exec, -8\n  v_readfirstlane_b32 s20, v4\n"
         "  s_mov_b64 exec, s[22:23]\n  v_mov_b32 v6, s20\n", lambda L: _x(3)),
    Case("V_READLANE_B32", "  s_mov_b32 s21, 45\n  v_readlane_b32 s20, v4, s21\n  v_mov_b32 v6, s20\n", lambda L: _x(45)),
    Case("V_WRITELANE_B32", "  v_mov_b32 v6, v4\n  s_mov_b32 s20, 0x5eed\n  v_writelane_b32 v6, s20, 17\n",
         lambda L: 0x5EED if L.lane == 17 else L.x),
    Case("V_MBCNT_LO_U32_B32", "  v_mbcnt_lo_u32_b32 v6, v4, v7",
         lambda L: bin(L.x & ((1 << min(L.lane, 32)) - 1)).count("1") + L.n),
    Case("V_MBCNT_HI_U32_B32", "  v_mbcnt_hi_u32_b32 v6, v4, v7",
         lambda L: bin(L.x & ((1 << max(L.lane - 32, 0)) - 1)).count("1") + L.n),
    # permlane swaps exchange v6's and v10's lane halves (16 within each 32, or 32)
    Case("V_PERMLANE16_SWAP_B32", "  v_mov_b32 v6, v4\n  v_mov_b32 v10, v5\n  v_permlane16_swap_b32 v6, v10\n",
         lambda L: IN[L.lane - 16].y if L.lane % 32 >= 16 else L.x),
    Case("V_PERMLANE32_SWAP_B32", "  v_mov_b32 v6, v4\n  v_mov_b32 v10, v5\n  v_permlane32_swap_b32 v10, v6\n",
         lambda L: IN[L.lane + 32].y if L.lane < 32 else L.x),
    # ds_swizzle bit-mask mode: and 0x1f, or 0, xor 5 within each 32 lanes; quad-permute [3,2,1,0]
    Case("DS_SWIZZLE_B32", "  ds_swizzle_b32 v6, v4 offset:swizzle(BITMASK_PERM,\"ppipi\")\n  s_waitcnt lgkmcnt(0)\n",
         lambda L: _x(L.lane ^ 5)),
    Case("DS_SWIZZLE_B32", "  ds_swizzle_b32 v6, v4 offset:swizzle(QUAD_PERM,3,2,1,0)\n  s_waitcnt lgkmcnt(0)\n",
         lambda L: _x(L.lane ^ 3)),
    # ds_bpermute: lane l reads lane (4 y + offset) / 4 mod 64
    Case("DS_BPERMUTE_B32", "  v_lshlrev_b32 v10, 2, v5\n  ds_bpermute_b32 v6, v10, v4 offset:8\n  s_waitcnt lgkmcnt(0)\n",
         lambda L: _x(((4 * L.y + 8) & 0xFFFFFFFF) // 4 % 64)),
]


def test_cross_lane_operations_give_the_isas_answers():
    wrong = run_cases(CASES)
    assert not wrong, "\n".join(wrong[:20])
