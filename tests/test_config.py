"""Settings: every setting of the table is a typed attribute, read once with its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from mono_jit.config import _TABLE, Settings


def test_every_setting_of_the_table_is_a_declared_attribute_and_nothing_else():
    assert [row[0] for row in _TABLE] == list(Settings.__annotations__)


def test_values_have_their_declared_types(tmp_path):
    settings = Settings({"MONO_JIT_CACHE_DIR": str(tmp_path), "MONO_JIT_LOCK_TIMEOUT": "5",
                         "MONO_JIT_OFFLINE": "yes", "MONO_JIT_CACHE_PATH": f"{tmp_path}/a:{tmp_path}/b"})
    assert settings.cache_dir == tmp_path and settings.lock_timeout == 5.0 and settings.offline is True
    assert settings.cache_path == (tmp_path / "a", tmp_path / "b")
    assert settings.lock_dir is None and settings.locks() == tmp_path / "v1" / "locks"
    assert [(s.name, s.source) for s in settings.items() if s.source == "env"] == [
        ("cache_dir", "env"), ("cache_path", "env"), ("offline", "env"), ("lock_timeout", "env")]
    assert isinstance(Settings({}).cache_dir, Path)


def test_replaced_overrides_attributes_and_sources_and_refuses_unknown_names(tmp_path):
    settings = Settings({"MONO_JIT_CACHE_DIR": str(tmp_path)})
    offline = settings.replaced(offline=True, lock_dir=tmp_path / "locks")
    assert offline.offline is True and settings.offline is False
    assert offline.locks() == tmp_path / "locks"
    assert {s.name: s.source for s in offline.items()}["offline"] == "override"
    with pytest.raises(AttributeError, match="no such setting: nonsense"):
        settings.replaced(nonsense=1)
    with pytest.raises(AttributeError):
        getattr(settings, "nonsense")  # an unknown setting is not an attribute
