"""The store, for real: compiled gfx950 entries, corruption, read-only layers, races, bundles."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from cache_settings import SMALL_SPECS, settings_at
from mono_jit.cache import Entry, Store
from mono_jit.cache.bundle import export_bundle, import_bundle
from mono_jit.errors import BundleError, UntrustedRoot
from mono_jit.hsaco.metadata import inspect_code_object
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.pipeline.resolve import resolve
from mono_jit.templates import get


def entries(root):
    return [e for e in Store(settings_at(root)).entries() if isinstance(e, Entry)]


def test_entries_are_gfx950_code_objects_within_budget(golden_cache):
    found = entries(golden_cache)
    assert {e.meta.template for e in found} == {"router", "keytable"}
    for entry in found:
        kernels = inspect_code_object(entry.hsaco, "gfx950")
        assert kernels[0].scratch == 0 and kernels[0].vgpr_spills == 0
        assert entry.meta.launch.grid[0] == entry.meta.spec["max_tokens"]
        assert entry.meta.toolchain["flydsl"] == "0.5.0"
        assert "/" not in json.dumps(entry.meta.factors)  # no paths in the key


def test_second_prebuild_is_all_hits(warm_cache):
    summary, planned = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings_at(warm_cache), jobs=1, timeout=600)
    assert (summary.compiled, summary.hits, summary.failed) == (0, 3, [])


def test_corrupt_entry_is_quarantined_and_recompiled(warm_cache, golden_pool):
    settings = settings_at(warm_cache)
    entry = next(e for e in entries(warm_cache) if e.meta.template == "router")
    blob = bytearray((entry.path / "kernel.hsaco").read_bytes())
    blob[200] ^= 0xFF
    (entry.path / "kernel.hsaco").write_bytes(bytes(blob))
    resolved = resolve("router", SMALL_SPECS[0], settings=settings)
    assert resolved.compiled and resolved.entry.key == entry.key
    quarantined = list((warm_cache / "v1" / "quarantine").iterdir())
    assert len(quarantined) == 1 and "sha256" in (quarantined[0] / "reason.txt").read_text()


def test_truncated_meta_is_a_miss_not_a_crash(warm_cache):
    entry = next(e for e in entries(warm_cache) if e.meta.template == "keytable")
    (entry.path / "meta.json").write_text('{"schema": 1, "key"')
    store = Store(settings_at(warm_cache))
    assert store.lookup(entry.key, "gfx950") is None


def test_read_only_layer_serves_hits_and_nothing_is_written(warm_cache, tmp_path):
    os.chmod(warm_cache, 0o500)
    try:
        before = sorted(p for p in warm_cache.rglob("*"))
        writable = tmp_path / "rw"
        settings = settings_at(writable, MONO_JIT_CACHE_PATH=str(warm_cache))
        for spec in SMALL_SPECS:
            for name in ("router", "keytable"):
                assert not resolve(name, spec, settings=settings).compiled
        assert sorted(p for p in warm_cache.rglob("*")) == before
        assert not list((writable / "v1").glob("gfx950/*"))
    finally:
        os.chmod(warm_cache, 0o700)


def test_world_writable_root_is_refused(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(UntrustedRoot, match="world-writable"):
        Store(settings_at(root))
    Store(settings_at(root, MONO_JIT_ALLOW_SHARED_ROOTS="1"))


RACE = """
import sys
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
r = resolve("keytable", Spec(8, 128, 256, 2))
print("COMPILED" if r.compiled else "HIT", r.entry.key)
"""


@pytest.mark.slow
def test_four_racing_processes_compile_once(tmp_path):
    env = {**os.environ, "MONO_JIT_CACHE_DIR": str(tmp_path / "race")}
    procs = [subprocess.Popen([sys.executable, "-c", RACE], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=600)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(o[0] for o in outputs) == ["COMPILED", "HIT", "HIT", "HIT"]
    assert len({o[1] for o in outputs}) == 1


def test_bundle_round_trip_and_refusals(warm_cache, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    assert export_bundle(bundle, entries(warm_cache)).manifest["entries"] == 3
    fresh = Store(settings_at(tmp_path / "fresh"))
    assert import_bundle(fresh, bundle) == {"imported": 3, "present": 0}
    assert import_bundle(fresh, bundle) == {"imported": 0, "present": 3}

    def tar_with(members):
        path = tmp_path / f"bad{len(list(tmp_path.iterdir()))}.tar"
        with tarfile.open(path, "w") as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    good_manifest = json.dumps({"schema": "mono-jit-bundle/1", "files": {}}).encode()
    with pytest.raises(BundleError, match="escapes"):
        import_bundle(fresh, tar_with([("manifest.json", good_manifest), ("../evil", b"x")]))
    with pytest.raises(BundleError, match="schema"):
        import_bundle(fresh, tar_with([("manifest.json", json.dumps({"schema": "other/9"}).encode())]))
    with tarfile.open(bundle) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    tampered = [(n, d[:-1] + bytes([d[-1] ^ 1]) if n.endswith("kernel.hsaco") else d) for n, d in members]
    with pytest.raises(BundleError, match="checksum"):
        import_bundle(Store(settings_at(tmp_path / "other")), tar_with(tampered))
    # A consistent manifest over a tampered kernel: the entry check (meta's sha256) refuses it.
    files = {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in tampered if n != "manifest.json"}
    relabelled = [("manifest.json", json.dumps({"schema": "mono-jit-bundle/1", "files": files}).encode())]
    relabelled += [(n, d) for n, d in tampered if n != "manifest.json"]
    with pytest.raises(BundleError, match="is bad: kernel.hsaco's sha256"):
        import_bundle(Store(settings_at(tmp_path / "other")), tar_with(relabelled))
    assert not list((tmp_path / "other" / "v1").glob("gfx950/*"))
