"""The staged toolchain root: a cache copied with its symlinks dereferenced still hits and
compiles again (the root is repaired, and only a compile stages it); a root that differs in any
way is replaced atomically, also by racing repairers; and under umask 002 / 000 the cache
accepts itself run after run (every folder and file the toolchain side makes is private)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from cache_settings import SMALL_SPECS, settings_at
from mono_jit.errors import ToolchainError
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.pipeline.toolchain import Linker, stage_root


def _staged_roots(root: Path) -> list[Path]:
    return [p for p in (root / "v1" / "toolchain").iterdir() if p.is_dir() and not p.name.startswith(".")]


@pytest.mark.slow
def test_a_dereferenced_copy_hits_then_compiles_again(golden_cache, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(golden_cache, root, symlinks=False)  # what cp -rL or a careless image build does
    os.chmod(root, 0o700)
    (staged,) = _staged_roots(root)
    assert not (staged / "llvm" / "bin" / "ld.lld").is_symlink()  # the copy holds real files now

    settings = settings_at(root)
    summary, _ = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings, jobs=1, timeout=600)
    assert (summary.hits, summary.compiled, summary.failed) == (3, 0, [])

    summary, _ = prebuild([get("router")], [Spec(8, 4, 1024, 2)], settings, jobs=1, timeout=600)
    assert (summary.compiled, summary.failed) == (1, [])
    assert (staged / "llvm" / "bin" / "ld.lld").is_symlink() and (staged / "amdgcn" / "bitcode").is_symlink()
    assert not list((root / "v1" / "toolchain").glob(".tmp-*"))


def test_all_hits_never_touch_the_staged_root(warm_cache):
    """Lookups come before staging: with no place to stage a root at all (v1/toolchain is a
    file), a run of hits still succeeds, and a compile says what is wrong in one line."""
    folder = warm_cache / "v1" / "toolchain"
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    settings = settings_at(warm_cache)
    summary, _ = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings, jobs=1, timeout=600)
    assert (summary.hits, summary.compiled, summary.failed) == (3, 0, [])
    with pytest.raises(ToolchainError, match="cannot stage a toolchain root"):
        prebuild([get("router")], [Spec(8, 4, 1024, 2)], settings, jobs=1, timeout=600)


@pytest.fixture
def pieces(tmp_path) -> tuple[Path, Linker, Path]:
    """A stand-in ld.lld and bitcode folder, and the base a root is staged under."""
    (tmp_path / "llvm").mkdir()
    lld = tmp_path / "llvm" / "ld.lld"
    lld.write_text("#!/bin/sh\n")
    bitcode = tmp_path / "bitcode"
    bitcode.mkdir()
    (bitcode / "ocml.bc").write_bytes(b"BC")
    return tmp_path / "cache" / "v1" / "toolchain", Linker(lld, "22.1.8"), bitcode


def _is_good(root: Path, linker: Linker, bitcode: Path) -> bool:
    return (os.readlink(root / "llvm" / "bin" / "ld.lld") == str(linker.path.resolve())
            and os.readlink(root / "amdgcn" / "bitcode") == str(bitcode.resolve()))


def _damage(root: Path, how: str, tmp_path: Path) -> None:
    if how == "dereferenced":
        lld = root / "llvm" / "bin" / "ld.lld"
        target = lld.resolve()
        lld.unlink()
        shutil.copy(target, lld)
    elif how == "retargeted":
        (root / "amdgcn" / "bitcode").unlink()
        (root / "amdgcn" / "bitcode").symlink_to(tmp_path)
    elif how == "half":
        shutil.rmtree(root / "amdgcn")
    elif how == "a file":
        shutil.rmtree(root)
        root.write_text("planted")
    elif how == "a symlink":
        shutil.rmtree(root)
        root.symlink_to(tmp_path)


@pytest.mark.parametrize("how", ["dereferenced", "retargeted", "half", "a file", "a symlink"])
def test_a_root_that_differs_is_replaced(pieces, tmp_path, how):
    base, linker, bitcode = pieces
    root = stage_root(base, linker, bitcode)
    _damage(root, how, tmp_path)
    assert stage_root(base, linker, bitcode) == root
    assert root.is_dir() and not root.is_symlink() and _is_good(root, linker, bitcode)
    assert sorted(p.name for p in base.iterdir()) == [root.name]  # nothing set aside is left
    assert (tmp_path / "bitcode" / "ocml.bc").read_bytes() == b"BC"  # a symlinked root's target is untouched


def test_racing_repairers_all_get_a_good_root(pieces, tmp_path):
    base, linker, bitcode = pieces
    for _ in range(20):
        root = stage_root(base, linker, bitcode)
        _damage(root, "dereferenced", tmp_path)
        results, errors = [], []

        def repair() -> None:
            try:
                results.append(stage_root(base, linker, bitcode))
            except Exception as exc:  # noqa: BLE001 - the assertion below names it
                errors.append(exc)

        threads = [threading.Thread(target=repair) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and set(results) == {root} and _is_good(root, linker, bitcode)
        assert sorted(p.name for p in base.iterdir()) == [root.name]


RUN = textwrap.dedent("""
    import os, sys
    os.umask(int(sys.argv[2], 8))
    from mono_jit.config import Settings
    from mono_jit.cache import Store
    from mono_jit.pipeline.toolchain import resolve_toolchain
    settings = Settings({**os.environ, "MONO_JIT_CACHE_DIR": sys.argv[1]})
    toolchain = resolve_toolchain(settings)  # writes the probe memo
    print(toolchain.rocm_path)  # stages the root, as a compile does
    Store(settings)  # the trust check of the root
""")


@pytest.mark.parametrize("umask", ["002", "000"])
def test_an_open_umask_does_not_make_the_cache_refuse_itself(tmp_path, umask):
    root = tmp_path / "cache"
    for run in range(2):
        proc = subprocess.run([sys.executable, "-c", RUN, str(root), umask], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, f"run {run + 1}: {proc.stderr[-1500:]}"
    loose = []
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files, ""]:
            path = Path(folder) / name
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
                loose.append(f"{path} {stat.filemode(mode)}")
    assert loose == []
    assert (root / "v1" / "toolchain" / "probes.json").is_file() and len(_staged_roots(root)) == 1
