"""Shared fixtures: real gfx950 compiles of small grids, kept between runs and copied per session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cache_settings import SMALL_SPECS, settings_at
from golden_pool import answer_compiles_from

from mono_jit.cache import Store
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.spec import STANDARD_MAX_TOKENS, Spec
from mono_jit.templates import Template, get

# Where the session fixtures' compiles are kept between runs. Reuse is safe: an entry's key covers
# its template's sources and the toolchain, so an edited kernel or another toolchain misses and
# compiles again, and every load re-verifies the entry. Read at import, before any test's
# monkeypatch clears the MONO_JIT_* variables.
FIXTURE_CACHE = Path(os.environ.get("MONO_JIT_TEST_FIXTURE_CACHE")
                     or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mono-jit-test-fixtures")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test touches the user's cache: MONO_JIT_CACHE_DIR points into the test's tmp folder."""
    for name in [n for n in os.environ if n.startswith("MONO_JIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MONO_JIT_CACHE_DIR", str(tmp_path / "cache"))


def compiled_grid(tmp_path_factory, name: str, templates: list[Template], specs: list[Spec], builds: int,
                  timeout: float) -> Path:
    """A cache in the session's tmp folder, filled by a prebuild of `templates` at `specs` (`builds`
    distinct keys). The compiles are real, done into FIXTURE_CACHE/<name> or found there from an
    earlier run; the session's own prebuild is answered with those bytes, so its cache is what a
    compiling prebuild leaves (entries, staged toolchain, probe memo) and nothing else."""
    kept = FIXTURE_CACHE / name
    summary, _ = prebuild(templates, specs, settings_at(kept), jobs=2, timeout=timeout)
    assert not summary.failed, json.dumps(summary.failed, indent=1)[:4000]
    assert summary.compiled + summary.hits == builds, summary.as_dict()  # each key compiled now or kept
    root = tmp_path_factory.mktemp(name) / "cache"
    with pytest.MonkeyPatch.context() as patch:
        answer_compiles_from(kept, patch)
        summary, _ = prebuild(templates, specs, settings_at(root), jobs=2, timeout=timeout)
    assert not summary.failed, json.dumps(summary.failed, indent=1)[:4000]
    assert summary.compiled == builds, summary.as_dict()
    return root


@pytest.fixture(scope="session")
def golden_cache(tmp_path_factory) -> Path:
    """A cache holding router and keytable for SMALL_SPECS, compiled for real (gfx950)."""
    # router reads only max_tokens: one build for both specs, two for keytable
    return compiled_grid(tmp_path_factory, "golden", [get("router"), get("keytable")], SMALL_SPECS, 3, 600)


@pytest.fixture
def warm_cache(golden_cache, tmp_path) -> Path:
    root = tmp_path / "warm"
    shutil.copytree(golden_cache, root, symlinks=True)
    os.chmod(root, 0o700)
    return root


@pytest.fixture
def golden_pool(golden_cache, monkeypatch) -> Store:
    """Compiles answered with the golden cache's bytes for the same keys: no compiler runs (the
    session's golden copy is read, never written, so a test may break its own warm_cache)."""
    return answer_compiles_from(golden_cache, monkeypatch)


@pytest.fixture(scope="session")
def k2_cache(tmp_path_factory) -> Path:
    """A cache holding K2 for every standard bucket and both ratios at TP8 (the deployment's K2
    grid, HCA at its default width)."""
    specs = [Spec(8, ratio, width, t) for ratio, width in ((4, 1024), (128, 8192)) for t in STANDARD_MAX_TOKENS]
    return compiled_grid(tmp_path_factory, "k2", [get("k2")], specs, len(specs), 900)


@pytest.fixture(scope="session")
def k1_cache(tmp_path_factory) -> Path:
    """A cache holding K1 for every standard bucket at TP8 (a runner's whole K1 grid)."""
    specs = [Spec(8, 4, 1024, t) for t in STANDARD_MAX_TOKENS]
    return compiled_grid(tmp_path_factory, "k1", [get("k1")], specs, len(specs), 900)
