"""A serving host whose toolchain differs from the build machine's (a ROCm vLLM image brings its own
FlyDSL, ld.lld and device bitcode) hits the entries the build machine made: the same build
(template sources, spec, arch, options) by another toolchain the layers hold serves when this
host's toolchain has none, verified as any entry, with one log line naming the toolchain that
built it; `MONO_JIT_EXACT_TOOLCHAIN=1` serves only this host's toolchain's entries.

The two toolchains are real: the build machine's (the session's compiles) and a serving host's
whose device bitcode folder holds one more .bc file, FlyDSL installed on both."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.pipeline.job import BuildJob
from mono_jit.cache import Entry, EntryMeta, Store, cache_key
from mono_jit.cache.store import meta_bytes, meta_digest, toolchain_record
import mono_jit.pipeline.resolve as resolver
from mono_jit.cli import main
from mono_jit.errors import OfflineMiss
from mono_jit.pipeline.resolve import resolve, resolve_many
from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.pipeline.toolchain import describe, resolve_toolchain

ROUTER, KEYTABLE = Spec(8, 4, 1024, 1), Spec(8, 128, 8192, 1)


@pytest.fixture
def serving_bitcode(warm_cache, tmp_path):
    """A device bitcode folder with the build machine's files (linked) and one more: the
    bitcode of a serving host whose fingerprint differs in `device_bitcode` only."""
    built_with = resolve_toolchain(settings_at(warm_cache)).bitcode_dir
    folder = tmp_path / "serving-bitcode"
    folder.mkdir()
    for name in os.listdir(built_with):
        (folder / name).symlink_to(built_with / name)
    (folder / "zz_serving_image.bc").write_bytes(b"BC\xc0\xde another ROCm release")
    return folder


@pytest.fixture(autouse=True)
def _fresh_announcements(monkeypatch):
    monkeypatch.setattr(resolver, "_ANNOUNCED", set(), raising=False)


def serving(cache, bitcode, **extra: str):
    """Settings of the serving host: its own bitcode (so its own toolchain) and `cache` as a
    read-only layer (an image layer), with a writable cache of its own."""
    return settings_at(cache.parent / "serving-rw", MONO_JIT_CACHE_PATH=str(cache),
                       MONO_JIT_DEVICE_LIBS=str(bitcode), **extra)


def fingerprints(cache, bitcode) -> tuple[dict, dict]:
    built = resolve_toolchain(settings_at(cache)).fingerprint
    served = resolve_toolchain(serving(cache, bitcode)).fingerprint
    return built, served


def key(template: str, spec: Spec, fingerprint: dict) -> str:
    return BuildJob.plan(get(template), spec, fingerprint).key


def test_the_two_hosts_have_two_real_toolchains_with_flydsl(warm_cache, serving_bitcode):
    built, served = fingerprints(warm_cache, serving_bitcode)
    assert built != served and {n for n in built if built[n] != served[n]} == {"device_bitcode"}
    assert served["flydsl"] == built["flydsl"] and served["flydsl_files"]  # FlyDSL is on the serving side


def test_an_offline_serving_host_hits_the_build_machines_entries_with_one_log_line(warm_cache, serving_bitcode,
                                                                                   caplog):
    built, served = fingerprints(warm_cache, serving_bitcode)
    settings = serving(warm_cache, serving_bitcode, MONO_JIT_OFFLINE="1")
    with caplog.at_level(logging.INFO, logger="mono_jit.pipeline.resolve"):
        router, keytable = resolve_many([("router", ROUTER), ("keytable", KEYTABLE)], settings=settings)
        again = resolve("router", ROUTER, settings=settings)
    assert router.entry.key == key("router", ROUTER, built) != key("router", ROUTER, served)
    assert keytable.entry.key == key("keytable", KEYTABLE, built)
    assert not router.compiled and not keytable.compiled and again.entry.key == router.entry.key
    lines = [r.getMessage() for r in caplog.records if "another toolchain" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"({describe(built)})" in lines[0] and f"this host's toolchain ({describe(served)}) has none" in lines[0]
    assert str(warm_cache) in lines[0] and "MONO_JIT_EXACT_TOOLCHAIN=1" in lines[0]


@pytest.mark.slow
def test_a_host_that_can_compile_serves_them_too_and_compiles_only_when_told_exact(warm_cache, serving_bitcode,
                                                                                    tmp_path):
    built, served = fingerprints(warm_cache, serving_bitcode)
    rw = tmp_path / "serving-rw"
    hit = resolve("router", ROUTER, settings=serving(warm_cache, serving_bitcode))
    assert not hit.compiled and hit.entry.key == key("router", ROUTER, built)
    assert not (rw / "v1" / "gfx950").exists()  # nothing compiled, nothing written for it
    exact = resolve("router", ROUTER, settings=serving(warm_cache, serving_bitcode, MONO_JIT_EXACT_TOOLCHAIN="1"))
    assert exact.compiled and exact.entry.key == key("router", ROUTER, served) and exact.entry.layer.root == rw
    assert exact.hsaco == hit.hsaco  # one more .bc file changes no byte of a template that calls no ocml


def test_the_exact_setting_makes_it_a_miss_that_names_the_setting(warm_cache, serving_bitcode):
    settings = serving(warm_cache, serving_bitcode, MONO_JIT_OFFLINE="1", MONO_JIT_EXACT_TOOLCHAIN="1")
    with pytest.raises(OfflineMiss) as info:
        resolve("router", ROUTER, settings=settings)
    text = str(info.value)
    assert ": built by another toolchain: " in text and "toolchain.device_bitcode" in text, text
    assert "MONO_JIT_EXACT_TOOLCHAIN=1 refuses it" in text and "\n" not in text


def _republish(cache, template: str, spec: Spec, fingerprint: dict) -> Entry:
    """The cache's entry of `template` at `spec` published again as `fingerprint` built it (a
    valid entry of the same build, under that toolchain's key)."""
    store = Store(settings_at(cache))
    entry = store.lookup(key(template, spec, resolve_toolchain(settings_at(cache)).fingerprint), "gfx950")
    meta = entry.meta.to_json()
    meta["factors"]["toolchain"] = fingerprint
    meta["key"] = cache_key(meta["factors"])
    return store.publish(meta["key"], "gfx950", entry.hsaco, EntryMeta.from_json(meta))


def test_this_hosts_own_toolchains_entry_is_preferred(warm_cache, serving_bitcode, caplog):
    built, served = fingerprints(warm_cache, serving_bitcode)
    own = _republish(warm_cache, "router", ROUTER, served)
    with caplog.at_level(logging.INFO, logger="mono_jit.pipeline.resolve"):
        hit = resolve("router", ROUTER, settings=serving(warm_cache, serving_bitcode, MONO_JIT_OFFLINE="1"))
        back_home = resolve("router", ROUTER, settings=settings_at(warm_cache, MONO_JIT_OFFLINE="1"))
    assert hit.entry.key == own.key == key("router", ROUTER, served)
    assert back_home.entry.key == key("router", ROUTER, built)
    assert not [r for r in caplog.records if "another toolchain" in r.getMessage()]


def test_explain_names_the_entry_that_serves_and_why(warm_cache, serving_bitcode):
    built, served = fingerprints(warm_cache, serving_bitcode)
    env = {"MONO_JIT_CACHE_PATH": str(warm_cache), "MONO_JIT_DEVICE_LIBS": str(serving_bitcode)}
    rw = str(warm_cache.parent / "serving-rw")
    result = CliRunner().invoke(main, ["explain", "--template", "router", "--json", "--cache-dir", rw], env=env)
    report = json.loads(result.output)
    assert report["status"] == "hit" and report["key"] == key("router", ROUTER, built)
    assert report["served_by"] == "another toolchain" and report["built_by"] == built
    assert report["reason"].startswith(f"this host's toolchain has no entry (key {key('router', ROUTER, served)[:16]})")
    text = CliRunner().invoke(main, ["explain", "--template", "router", "--cache-dir", rw], env=env).output
    assert text.splitlines()[1] == (f"served by the entry of another toolchain ({describe(built)}): this host's "
                                    f"toolchain has no entry (key {key('router', ROUTER, served)[:16]}); "
                                    "MONO_JIT_EXACT_TOOLCHAIN=1 would refuse it"), text
    home = json.loads(CliRunner().invoke(main, ["explain", "--template", "router", "--json", "--cache-dir",
                                               str(warm_cache)]).output)
    assert home["served_by"] == "this host's toolchain" and home["built_by"] == built and home["reason"] is None
    exact = json.loads(CliRunner().invoke(main, ["explain", "--template", "router", "--json", "--cache-dir", rw],
                                          env={**env, "MONO_JIT_EXACT_TOOLCHAIN": "1"}).output)
    assert exact["status"] == "miss" and exact["miss_kind"] == "built by another toolchain"


def test_an_entry_without_its_toolchain_record_is_found_from_its_own_factors(warm_cache, serving_bitcode):
    """An entry copied without the layer's toolchain records (or made before there were any):
    its stored factors name the toolchain that built it."""
    built, _ = fingerprints(warm_cache, serving_bitcode)
    shutil.rmtree(warm_cache / "v1" / "gfx950" / "toolchains")
    settings = serving(warm_cache, serving_bitcode, MONO_JIT_OFFLINE="1")
    assert Store(settings, read_only=True).recorded_toolchains("gfx950") == []
    assert resolve("keytable", KEYTABLE, settings=settings).entry.key == key("keytable", KEYTABLE, built)


def _plant(cache, folder_key: str, meta: dict, hsaco: bytes) -> None:
    """An entry folder named `folder_key` holding `meta` (its digest file consistent with it)."""
    path = cache / "v1" / "gfx950" / folder_key[:2] / folder_key
    path.mkdir(parents=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    data = meta_bytes(meta)
    (path / "meta.json").write_bytes(data)
    (path / "meta.sha256").write_bytes(meta_digest(data))
    (path / "kernel.hsaco").write_bytes(hsaco)


def test_a_forged_entry_claiming_the_build_but_with_other_factors_is_not_served(warm_cache, serving_bitcode):
    """A third toolchain recorded in the layer, and at the key this build has under it an entry
    whose factors are another build's (another spec): the lookup refuses it; with the real
    entry gone, the spec misses rather than being served the forgery."""
    built, _ = fingerprints(warm_cache, serving_bitcode)
    third = {**built, "ld_lld": "99.0.0"}
    name, data = toolchain_record(third)
    (warm_cache / "v1" / "gfx950" / "toolchains" / name).write_bytes(data)
    real = Store(settings_at(warm_cache)).lookup(key("router", ROUTER, built), "gfx950")
    claimed = key("router", ROUTER, third)
    meta = real.meta.to_json()
    meta["factors"]["toolchain"] = third
    meta["factors"]["spec"]["max_tokens"] = 2  # another build's factors ...
    meta["key"] = claimed  # ... under the key of this one
    _plant(warm_cache, claimed, meta, real.hsaco)
    shutil.rmtree(real.path)
    with pytest.raises(OfflineMiss) as info:
        resolve("router", ROUTER, settings=serving(warm_cache, serving_bitcode, MONO_JIT_OFFLINE="1"))
    assert ": unreadable: " in str(info.value) and "do not match the entry's key" in str(info.value)


def test_the_setting_is_listed_by_config_and_a_bad_value_is_one_line(tmp_path):
    listed = CliRunner().invoke(main, ["config"], env={"MONO_JIT_EXACT_TOOLCHAIN": "1"})
    row = next(line for line in listed.output.splitlines() if line.startswith("exact_toolchain "))
    assert " yes " in row and "[env: MONO_JIT_EXACT_TOOLCHAIN]" in row, row
    bad = CliRunner().invoke(main, ["config"], env={"MONO_JIT_EXACT_TOOLCHAIN": "maybe"})
    assert bad.exit_code == 1 and bad.output.count("\n") == 1 and "MONO_JIT_EXACT_TOOLCHAIN='maybe'" in bad.output


def test_a_lookup_tries_this_hosts_toolchain_then_every_other_unless_told_exact(tmp_path, monkeypatch):
    own, others = {"flydsl": "own"}, [{"flydsl": "b"}, {"flydsl": "c"}]
    for extra, order in (({}, [own, *others]), ({"MONO_JIT_EXACT_TOOLCHAIN": "1"}, [own])):
        store = Store(settings_at(tmp_path, **extra))
        monkeypatch.setattr(store, "other_toolchains", lambda arch, mine: iter(f for f in others if f != mine))
        assert list(store.toolchains_tried("gfx950", own)) == order
        assert list(store.toolchains_tried("gfx950", None)) == others  # no toolchain here: every recorded one
