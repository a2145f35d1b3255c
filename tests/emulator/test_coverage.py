"""Every operation the decoder accepts (ops.NAMES) has a known-answer case in tests/emulator/, whose
assembled kernel the decoder reads as that operation, or is listed here with the runs that cover it."""

from __future__ import annotations

import pytest
from asm_kernels import TOOLS_PRESENT
from instruction_cases import decoded_operations

pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

# Operations with no single-instruction known answer, and what runs them.
WHOLE_KERNEL_ONLY = {
    "S_ENDPGM": "every kernel ends with it (a launch completes)",
    "S_WAITCNT": "every kernel here (a no-op: accesses complete at once)",
    "S_NOP": "the MFMA cases and every template kernel (a no-op)",
    "S_BARRIER": "test_machine.py (scratch over 2 waves) and every multi-wave template kernel",
    "S_SLEEP": "test_machine.py (co-resident workgroups, deadlock and timed-wait reports)",
    "S_TRAP": "test_machine.py (s_trap fails the launch) and K1 / K2's trap paths",
    "S_MEMTIME": "K1 / K2's bounded waits (test_emulated_launches.py, test_emulated_k2.py)",
    "S_MEMREALTIME": "test_machine.py (a time-bounded wait on another process)",
    "V_MFMA_F32_16X16X16_BF16": "test_machine.py (bf16 MFMAs' operand and result layouts)",
    "V_MFMA_F32_16X16X32_BF16": "test_machine.py (bf16 MFMAs' operand and result layouts)",
    "V_MFMA_SCALE_F32_16X16X128_F8F6F4": "test_emulator_kernels.py (fp8 / fp4 micro-kernels) and K1 / K2",
}


def _families():
    from test_crosslane import CASES as crosslane
    from test_memory import CASES as memory
    from test_memory import LDS_CASES, SCRATCH, SCRATCH_CASES
    from test_mfma import CASES as mfma
    from test_salu import CASES as salu
    from test_valu import CASES as valu

    return [(salu, {}), (valu, {}), (crosslane, {}), (memory, {}), (LDS_CASES, {"lds": 2048}),
            (SCRATCH_CASES, {"scratch": SCRATCH}), (mfma, {})]


def test_every_operation_has_a_known_answer_or_is_listed_with_its_runs():
    from mono_jit.emulator.ops import NAMES

    claimed, decoded = set(), set()
    for cases, options in _families():
        claimed |= {case.op for case in cases}
        decoded |= decoded_operations(cases, **options)
    assert not claimed - set(NAMES), f"cases name operations the decoder does not know: {sorted(claimed - set(NAMES))}"
    assert not claimed - decoded, f"cases whose kernel does not hold their operation: {sorted(claimed - decoded)}"
    assert not claimed & set(WHOLE_KERNEL_ONLY), f"listed but with a case: {sorted(claimed & set(WHOLE_KERNEL_ONLY))}"
    missing = sorted(set(NAMES) - claimed - set(WHOLE_KERNEL_ONLY))
    assert not missing, f"operations with neither a known-answer case nor a listed run: {missing}"
