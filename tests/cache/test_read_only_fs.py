"""A filled cache whose writable root sits on a read-only file system, one entry missing: the
hits are reported, the miss fails in one line naming the path and the fix, exit 1; resolve()
says the same in one line. On a real read-only mount (tests/support/read_only_mount.py)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.cli import main
from mono_jit.errors import MonoJitError
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
from read_only_mount import read_only_mount
from golden_pool import PREBUILD

MISSING = Spec(8, 4, 1024, 1)  # keytable at ratio 4: the entry taken out before the mount turns read-only


@pytest.fixture
def read_only_cache(warm_cache, tmp_path):
    """The warm cache (router, keytable x 2 ratios) without keytable at MISSING, on a read-only mount."""
    def fill(mount):
        shutil.copytree(warm_cache, mount / "cache", symlinks=True)
        os.chmod(mount / "cache", 0o700)
        store = Store(settings_at(mount / "cache"))
        (entry,) = [e for e in store.entries() if isinstance(e, Entry) and e.meta.template == "keytable"
                    and e.meta.factors["spec"]["ratio"] == MISSING.ratio]
        shutil.rmtree(entry.path)
        assert (mount / "cache" / "v1" / "locks").is_dir()  # the prebuild that filled it made its lock folder

    with read_only_mount(tmp_path / "ro", fill) as mount:
        yield mount / "cache"


def test_prebuild_keeps_the_hits_and_fails_the_miss_in_one_line(read_only_cache, golden_pool):
    result = CliRunner().invoke(main, [*PREBUILD, "--json", "--cache-dir", str(read_only_cache)])
    assert result.exit_code == 1, (result.output, result.exception)
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.exception
    summary = json.loads(result.stdout)
    assert (summary["hits"], summary["compiled"], summary["failed"]) == (2, 0, 1)
    (failure,) = summary["failures"]
    locks = read_only_cache / "v1" / "locks"
    assert failure["error"].startswith("keytable(ratio=4, topk_width=1024, max_tokens=1, arch=gfx950): cannot open "
                                       f"its lock: {locks}/"), failure["error"]
    assert "Read-only file system; the file system is read-only: point MONO_JIT_CACHE_DIR at a writable folder" \
        in failure["error"]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("failed ")]
    assert line == f"failed {failure['error']}"


def test_resolve_serves_the_hits_and_says_the_miss_in_one_line(read_only_cache):
    settings = settings_at(read_only_cache)
    assert not resolve("keytable", Spec(8, 128, 8192, 1), settings=settings).compiled
    with pytest.raises(MonoJitError) as missed:
        resolve("keytable", MISSING, settings=settings)
    message = str(missed.value)
    assert "\n" not in message and f"{read_only_cache / 'v1' / 'locks'}/" in message, message
    assert "Read-only file system; the file system is read-only: point MONO_JIT_CACHE_DIR" in message
