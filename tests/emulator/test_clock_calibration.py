"""The calibration table in docs/emulator.md is what the clock's micro-kernels give now
(tests/support/clock_calibration.py runs them: about 8 s), and none departs by more than 15 %
from its public hardware figure without the table saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
from asm_kernels import TOOLS_PRESENT

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytestmark = pytest.mark.skipif(not TOOLS_PRESENT, reason="needs llvm-22's llvm-mc and ld.lld (scripts/setup.sh)")

import clock_calibration  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"


def test_the_docs_calibration_table_is_what_the_micro_kernels_give():
    text = DOC.read_text()
    begin, end = "<!-- clock calibration: begin -->\n", "\n<!-- clock calibration: end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == clock_calibration.markdown()
