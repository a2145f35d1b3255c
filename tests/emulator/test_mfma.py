"""The dense f32 MFMA (emulator/mfma.py) on a known product: A[i, k] = i + 1, B[k, j] = k + 1, so
D[i, j] = 10 (i + 1), read back from the hardware's result layout (lane 16 g + j holds D[4 g + e, j]
in its e-th register). The bf16 and scaled forms: test_machine.py and the micro-kernels."""

from __future__ import annotations

import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import Case, f32_bits, run_cases

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

# lane 16 q + i holds A[i, q] and B[q, i]: A from lane % 16, B from lane / 16
_OPERANDS = ("  v_and_b32 v10, 15, v0\n  v_add_u32 v10, 1, v10\n  v_cvt_f32_u32 v10, v10\n"
             "  v_lshrrev_b32 v11, 4, v0\n  v_add_u32 v11, 1, v11\n  v_cvt_f32_u32 v11, v11\n")
CASES = [Case("V_MFMA_F32_16X16X4_F32", _OPERANDS + f"  v_mfma_f32_16x16x4_f32 v[12:15], v10, v11, 0\n"
              f"  s_nop 7\n  s_nop 7\n  v_mov_b32 v6, v{12 + e}\n",
              lambda L, e=e: f32_bits(10.0 * (4 * (L.lane // 16) + e + 1)))
         for e in range(4)]
# with C: D = C + A B, C = 0.5 everywhere
CASES.append(Case("V_MFMA_F32_16X16X4_F32", _OPERANDS + "  v_mov_b32 v16, 0.5\n  v_mov_b32 v17, 0.5\n"
                  "  v_mov_b32 v18, 0.5\n  v_mov_b32 v19, 0.5\n  v_mfma_f32_16x16x4_f32 v[12:15], v10, v11, v[16:19]\n"
                  "  s_nop 7\n  s_nop 7\n  v_mov_b32 v6, v13\n",
                  lambda L: f32_bits(10.0 * (4 * (L.lane // 16) + 2) + 0.5)))


def test_the_f32_mfma_gives_the_isas_answer():
    wrong = run_cases(CASES)
    assert not wrong, "\n".join(wrong[:20])
