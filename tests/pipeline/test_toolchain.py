"""Toolchain probes and the cache-hit path's imports."""

import glob
import json
import os
import subprocess
import sys

import pytest

from cache_settings import settings_at
from mono_jit.pipeline.toolchain import ProbeMemo, _expand, resolve_toolchain


@pytest.mark.parametrize("pattern", ["*/amdgcn/bitcode", "llvm-*/bin/ld.lld", "llvm-*/lib/clang/*/lib/amdgcn/bitcode",
                                     "llvm-*", "none-*/x", "file/amdgcn/bitcode"])
def test_expand_finds_what_glob_finds(tmp_path, pattern):
    """The toolchain search's listdir expansion answers as glob.glob does: hidden names skipped,
    a file where a folder is expected found nothing below it, results sorted."""
    for path in ("a/amdgcn/bitcode", ".hidden/amdgcn/bitcode", "b/amdgcn", "llvm-19/bin/ld.lld", "llvm-22/bin/ld.lld",
                 "llvm-20/lib/clang/20/lib/amdgcn/bitcode", "llvm-20/lib/clang/.x/lib/amdgcn/bitcode",
                 "llvmx/bin/ld.lld"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "file").write_text("")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "amdgcn").write_text("")  # a file named like the folder
    full = f"{tmp_path}/{pattern}"
    assert _expand(full) == sorted(glob.glob(full))


def test_probe_memo_reprobes_only_when_the_file_changes(tmp_path):
    target = tmp_path / "tool"
    target.write_text("v1")
    memo_file = tmp_path / "memo.json"
    calls = []

    def probe():
        calls.append(1)
        return f"probe{len(calls)}"

    assert ProbeMemo(memo_file).get("k", [target], probe) == "probe1"
    assert ProbeMemo(memo_file).get("k", [target], probe) == "probe1"  # from the file
    target.write_text("v2 longer")
    assert ProbeMemo(memo_file).get("k", [target], probe) == "probe2"
    memo_file.write_text("{not json")
    assert ProbeMemo(memo_file).get("k", [target], probe) == "probe3"  # a bad memo only costs a probe
    assert len(calls) == 3


def test_probe_memos_of_concurrent_processes_keep_each_others_answers(tmp_path):
    """Two compile workers open the memo before either probed, then each probes something else:
    the later save must not drop the earlier one's answer (a warm grid load would probe again,
    running ld.lld on the cache-hit path)."""
    lld, bitcode = tmp_path / "ld.lld", tmp_path / "ocml.bc"
    lld.write_text("lld")
    bitcode.write_text("bc")
    memo_file = tmp_path / "memo.json"
    first, second = ProbeMemo(memo_file), ProbeMemo(memo_file)
    first.get("ld.lld --version", [lld], lambda: "22.1.8")
    second.get("bitcode", [bitcode], lambda: "digest")
    later = ProbeMemo(memo_file, save=False)
    fail = lambda: (_ for _ in ()).throw(AssertionError("probed again"))  # noqa: E731
    assert later.get("ld.lld --version", [lld], fail) == "22.1.8"
    assert later.get("bitcode", [bitcode], fail) == "digest"


def test_fingerprint_has_no_paths_and_is_stable(tmp_path):
    a = resolve_toolchain(settings_at(tmp_path / "a")).fingerprint
    b = resolve_toolchain(settings_at(tmp_path / "b")).fingerprint
    assert a == b
    assert set(a) == {"flydsl", "flydsl_files", "ld_lld", "device_bitcode"}
    assert a["flydsl"] == "0.5.0" and "/" not in json.dumps(a)


HIT = """
import sys
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
assert not resolve("keytable", Spec(8, 128, 8192, 1)).compiled
print(" ".join(m for m in ("flydsl", "torch", "filelock", "multiprocessing") if m in sys.modules))
"""


def test_cache_hit_imports_neither_flydsl_torch_nor_the_compile_side(warm_cache):
    env = {**os.environ, "MONO_JIT_CACHE_DIR": str(warm_cache)}
    out = subprocess.run([sys.executable, "-c", HIT], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
