"""Shared fixtures: a real gfx950 compile of a small grid, done once per session and copied."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cache_settings import SMALL_SPECS, settings_at

from mono_jit.prebuild import prebuild
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import get


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test touches the user's cache: MONO_JIT_CACHE_DIR points into the test's tmp folder."""
    for name in [n for n in os.environ if n.startswith("MONO_JIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MONO_JIT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def golden_cache(tmp_path_factory) -> Path:
    """A cache holding router and keytable for SMALL_SPECS, compiled for real (gfx950)."""
    root = tmp_path_factory.mktemp("golden") / "cache"
    summary, _ = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings_at(root), jobs=2, timeout=600)
    assert not summary.failed, summary.failed
    assert summary.compiled == 3  # router reads only max_tokens: one build for both specs
    return root


@pytest.fixture
def warm_cache(golden_cache, tmp_path) -> Path:
    root = tmp_path / "warm"
    shutil.copytree(golden_cache, root, symlinks=True)
    os.chmod(root, 0o700)
    return root


@pytest.fixture(scope="session")
def k2_cache(tmp_path_factory) -> Path:
    """A cache holding K2 for every standard bucket and both ratios at TP8 (the deployment's K2
    grid, HCA at its default width)."""
    root = tmp_path_factory.mktemp("k2") / "cache"
    specs = [Spec(8, ratio, width, t) for ratio, width in ((4, 1024), (128, 8192)) for t in STANDARD_MAX_TOKENS]
    summary, _ = prebuild([get("k2")], specs, settings_at(root), jobs=2, timeout=900)
    assert not summary.failed, json.dumps(summary.failed, indent=1)[:4000]
    assert summary.compiled == len(specs)
    return root


@pytest.fixture(scope="session")
def k1_cache(tmp_path_factory) -> Path:
    """A cache holding K1 for every standard bucket at TP8 (a runner's whole K1 grid)."""
    root = tmp_path_factory.mktemp("k1") / "cache"
    specs = [Spec(8, 4, 1024, t) for t in STANDARD_MAX_TOKENS]
    summary, _ = prebuild([get("k1")], specs, settings_at(root), jobs=2, timeout=900)
    assert not summary.failed, json.dumps(summary.failed, indent=1)[:4000]
    assert summary.compiled == len(specs)
    return root
