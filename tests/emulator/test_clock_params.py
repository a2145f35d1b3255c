"""docs/emulator.md carries the clock's parameter table exactly as `clock/params.py` holds it,
and every row names a source."""

from __future__ import annotations

from pathlib import Path

import pytest

from mono_jit.emulator.clock import params

DOC = Path(__file__).resolve().parents[2] / "docs" / "emulator.md"


def test_the_docs_table_is_the_codes():
    text = DOC.read_text()
    begin, end = "<!-- clock parameters: begin -->\n", "\n<!-- clock parameters: end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == params.markdown()


def test_every_parameter_has_a_scope_and_a_source():
    for p in params.TABLE:
        assert p.scope in {"C4", "C3", "gen", "estimate"} and p.source, p.name


def test_an_override_by_an_unknown_name_is_refused_by_name():
    with pytest.raises(ValueError, match="clock parameter 'hbm_latncy'"):
        params.vector({"hbm_latncy": 1})
