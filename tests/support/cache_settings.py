"""Settings for a test's own cache root, and the small grid the session compiles for real.

Kept out of conftest.py so tests import them by a name no other folder's conftest shadows
(tests/vllm has a conftest of its own)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mono_jit.config import Settings
from mono_jit.spec import Spec

SMALL_SPECS = [Spec(8, 128, 8192, 1), Spec(8, 4, 1024, 1)]


def settings_at(root: Path, **extra: str) -> Settings:
    """Settings with `root` as the writable cache and no MONO_JIT_* of the caller's environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    environ.update(MONO_JIT_CACHE_DIR=str(root), **extra)
    return Settings(environ)


def joined_grid(k1_cache: Path, k2_cache: Path, root: Path) -> Path:
    """The deployment's whole default grid (k1 and k2, TP8, 1M context, every bucket) in one cache
    at `root`, from the session's K1 and K2 caches."""
    shutil.copytree(k1_cache, root, symlinks=True)
    shutil.copytree(k2_cache / "v1" / "gfx950", root / "v1" / "gfx950", dirs_exist_ok=True)  # entries, records
    os.chmod(root, 0o700)
    return root


def cached_builds(root: Path, key) -> dict:
    """{key(meta.spec): (meta, hsaco, ISA listing)} of every entry in the cache at `root`
    (a session fixture's real gfx950 compiles, for the templates' static gates)."""
    from mono_jit.cache.store import Entry, Store
    from mono_jit.hsaco.isa import disassemble, find_objdump

    objdump = find_objdump(Settings())
    builds = {}
    for entry in Store(settings_at(root)).entries():
        assert isinstance(entry, Entry), entry
        builds[key(entry.meta.spec)] = (entry.meta, entry.hsaco, disassemble(entry.hsaco, objdump))
    return builds
