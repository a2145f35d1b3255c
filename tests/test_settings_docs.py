"""docs/settings.md states every setting once, and the backend setting names every backend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mono_jit.config import _TABLE, BACKENDS, Settings
from mono_jit.runtime.backends import _BY_NAME, backend

SETTINGS_MD = Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def _rows() -> dict[str, list[str]]:
    """Each row of the settings table by the variables its first cell names."""
    rows: dict[str, list[str]] = {}
    for line in SETTINGS_MD.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `MONO_JIT_"):
            first, meaning = line.split("|")[1:3]
            for variable in re.findall(r"`(MONO_JIT_\w+)", first):
                rows.setdefault(variable, []).append(meaning)
    return rows


def test_settings_md_has_one_row_per_setting_and_no_other():
    rows = _rows()
    assert sorted(rows) == sorted(variable for _, variable, *_ in _TABLE)
    assert all(len(meanings) == 1 for meanings in rows.values()), {v: m for v, m in rows.items() if len(m) > 1}
    firsts = [line.split("|")[1] for line in SETTINGS_MD.read_text(encoding="utf-8").splitlines()
              if line.startswith("| `MONO_JIT_")]
    assert [first for first in firsts if first.count("`MONO_JIT_") != 1] == [], "a row names one setting"


def test_the_backend_setting_its_help_and_its_row_name_every_backend():
    (meaning,) = _rows()["MONO_JIT_BACKEND"]
    help_text = next(row[4] for row in _TABLE if row[0] == "backend")
    for name in BACKENDS:
        assert f"`{name}`" in meaning and f"{name} (" in help_text
        assert Settings({"MONO_JIT_BACKEND": name}).backend == name
    assert list(_BY_NAME) == list(BACKENDS)  # one class a name, each called by its name
    with pytest.raises(ValueError, match="expected one of hip, reference, emulator"):
        backend("rocm")
