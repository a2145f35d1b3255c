"""resolve(): offline misses, graph capture, keys that ignore unread spec fields."""

import sys
import types

import pytest

from cache_settings import settings_at
from mono_jit.pipeline.job import BuildJob
from mono_jit.errors import CaptureError, OfflineMiss, ToolchainError
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
from mono_jit.templates import get

FP = {"flydsl": "0.5.0", "flydsl_files": "x", "ld_lld": "22.1.8", "device_bitcode": "y"}


def test_offline_miss_names_spec_and_prebuild_command(tmp_path):
    settings = settings_at(tmp_path / "empty", MONO_JIT_OFFLINE="1")
    with pytest.raises(OfflineMiss) as info:
        resolve("keytable", Spec(8, 4, 1024, 8), settings=settings)
    text = str(info.value)
    assert "tp8-r4-k1024-m8-gfx950" in text and "mono-jit prebuild --template keytable" in text


def test_offline_hit_works(warm_cache):
    settings = settings_at(warm_cache, MONO_JIT_OFFLINE="1")
    assert not resolve("router", Spec(8, 128, 8192, 1), settings=settings).compiled


def test_capture_raises_before_touching_anything(monkeypatch, tmp_path):
    fake_cuda = types.SimpleNamespace(is_available=lambda: True, is_current_stream_capturing=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=fake_cuda))
    with pytest.raises(CaptureError, match="graph capture"):
        resolve("router", Spec(8, 4, 1024, 1), settings=settings_at(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


def test_unread_fields_share_a_key_and_read_ones_do_not():
    router, keytable = get("router"), get("keytable")
    a, b = Spec(8, 4, 1024, 4), Spec(4, 128, 8192, 4)
    assert BuildJob.plan(router, a, FP).key == BuildJob.plan(router, b, FP).key
    assert BuildJob.plan(keytable, a, FP).key != BuildJob.plan(keytable, b, FP).key
    assert BuildJob.plan(keytable, a, FP).key == BuildJob.plan(keytable, Spec(2, 4, 1024, 4), FP).key
    assert BuildJob.plan(router, a, FP).key != BuildJob.plan(router, a, {**FP, "ld_lld": "19.1.0"}).key


def test_without_a_toolchain_hits_come_from_recorded_toolchains(warm_cache, tmp_path):
    # An explicit ld.lld that does not exist: this process can fingerprint no toolchain.
    settings = settings_at(tmp_path / "rw", MONO_JIT_CACHE_PATH=str(warm_cache), MONO_JIT_LD_LLD="/nonexistent/ld.lld")
    assert not resolve("keytable", Spec(8, 4, 1024, 1), settings=settings).compiled
    with pytest.raises(ToolchainError) as info:
        resolve("keytable", Spec(8, 4, 1024, 2), settings=settings)
    assert "tp8-r4-k1024-m2-gfx950" in str(info.value) and "cannot be compiled here" in str(info.value)
