"""Registry faults (through a local proxy that truncates, corrupts or delays answers, a registry
that is down, forged manifests): one warning line, then a compile (or offline, the offline
miss); a pull fails in one line; nothing bad is ever published."""

from __future__ import annotations

import logging
import os
import time

import pytest
from cache_settings import settings_at
from click.testing import CliRunner
from oci_registry import free_port, oci_proxy, oci_registry, pushed, remote_env  # noqa: F401  (fixtures)

from mono_jit.cache import Store
from mono_jit.cache.oci.artifact import A_ARCH, build_manifest, parse_manifest
from mono_jit.cache.oci.client import Registry
from mono_jit.cache.oci.reference import parse_reference
from mono_jit.cli import main
from mono_jit.errors import OfflineMiss
from mono_jit.pipeline.resolve import resolve_many
from mono_jit.spec import Spec

ROUTER = ("router", Spec(8, 4, 1024, 1))


def nothing_published(root) -> None:
    """No entry, nothing half-written, nothing quarantined in the cache at `root`."""
    assert not list(Store(settings_at(root)).entries())
    tmp = root / "v1" / "tmp"
    assert not tmp.exists() or not os.listdir(tmp)
    assert not (root / "v1" / "quarantine").exists()


def registry_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("mono_jit.cache.oci")
            and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("fault, says", [("truncate", "cut off"), ("corrupt", "does not hash to its digest")])
def test_a_damaged_blob_is_refused_offline(fault, says, warm_cache, tmp_path, oci_proxy, caplog):
    ref = pushed(oci_proxy, warm_cache)
    oci_proxy.fault = fault
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", **remote_env(oci_proxy, ref))
    with pytest.raises(OfflineMiss, match="MONO_JIT_OFFLINE=1"):
        resolve_many([ROUTER], settings=settings)
    (line,) = registry_warnings(caplog)
    assert says in line and "not compiling" in line and "\n" not in line, line
    nothing_published(tmp_path / "host")


@pytest.mark.slow
def test_a_corrupt_blob_falls_back_to_compiling(warm_cache, tmp_path, oci_proxy, caplog):
    ref = pushed(oci_proxy, warm_cache)
    oci_proxy.fault = "corrupt"
    (resolved,) = resolve_many([ROUTER], settings=settings_at(tmp_path / "host", **remote_env(oci_proxy, ref)))
    assert resolved.compiled
    assert resolved.hsaco == next(e.hsaco for e in Store(settings_at(warm_cache)).served() if e.key == resolved.entry.key)
    (line,) = registry_warnings(caplog)
    assert "compiling it here" in line


def test_a_slow_registry_costs_one_timeout_for_the_whole_grid(warm_cache, tmp_path, oci_proxy, caplog):
    ref = pushed(oci_proxy, warm_cache)
    oci_proxy.fault, oci_proxy.slow_seconds = "slow_manifest", 4.0
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", MONO_JIT_REMOTE_TIMEOUT="1",
                           **remote_env(oci_proxy, ref))
    started = time.monotonic()
    with pytest.raises(OfflineMiss):
        resolve_many([ROUTER, ("keytable", Spec(8, 4, 1024, 1))], settings=settings)
    assert time.monotonic() - started < 3.5
    (line,) = registry_warnings(caplog)
    assert "did not answer within 1 s" in line and "not asked again" in line, line
    nothing_published(tmp_path / "host")


def test_a_registry_that_is_down_is_one_line(tmp_path, caplog):
    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", MONO_JIT_REMOTE=f"{host}/mono-jit/x:t",
                           MONO_JIT_REMOTE_INSECURE=host)
    with pytest.raises(OfflineMiss):
        resolve_many([ROUTER], settings=settings)
    (line,) = registry_warnings(caplog)
    assert f"cannot reach registry {host} (Connection refused" in line, line


def forge(proxy, cache, change) -> str:
    """Push `cache`, then tag (as :forged) a manifest of the layers `change` rewrote; its reference."""
    source = parse_reference(pushed(proxy, cache))
    registry = Registry(source, insecure=True)
    listing = parse_manifest(*registry.manifest(), source)
    layers = [dict(e.descriptor, annotations=dict(e.descriptor["annotations"])) for e in listing.entries.values()]
    forged = parse_reference(f"{source.registry}/{source.repository}:forged")
    Registry(forged, insecure=True).put_manifest(build_manifest(change(layers), listing.toolchains))
    proxy.reset()
    return str(forged)


def test_a_manifest_pointing_a_key_at_another_entrys_blob_is_refused(warm_cache, tmp_path, oci_proxy, caplog):
    def rotate(layers):  # every key now names the blob of the next entry: real blobs, wrong entries
        blobs = [(layer["digest"], layer["size"]) for layer in layers]
        for layer, (digest, size) in zip(layers, blobs[1:] + blobs[:1]):
            layer["digest"], layer["size"] = digest, size
        return layers

    ref = forge(oci_proxy, warm_cache, rotate)
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", **remote_env(oci_proxy, ref))
    with pytest.raises(OfflineMiss):
        resolve_many([ROUTER], settings=settings)
    (line,) = registry_warnings(caplog)
    assert "fails verification (forged or damaged)" in line, line
    nothing_published(tmp_path / "host")
    result = CliRunner().invoke(main, ["pull", ref, "--insecure", "--cache-dir", str(tmp_path / "pulled")])
    assert result.exit_code == 1 and "fails verification" in result.output and result.output.count("\n") == 1
    nothing_published(tmp_path / "pulled")


def test_entries_listed_for_another_arch_are_not_fetched(warm_cache, tmp_path, oci_proxy, caplog):
    def other_arch(layers):
        for layer in layers:
            layer["annotations"][A_ARCH] = "gfx942"
        return layers

    ref = forge(oci_proxy, warm_cache, other_arch)
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", **remote_env(oci_proxy, ref))
    with pytest.raises(OfflineMiss):
        resolve_many([ROUTER], settings=settings)
    (line,) = registry_warnings(caplog)
    assert "for arch gfx942, not gfx950" in line, line
    assert "GET blob" not in oci_proxy.counts
    nothing_published(tmp_path / "host")


def test_a_truncated_pull_publishes_nothing(warm_cache, tmp_path, oci_proxy):
    ref = pushed(oci_proxy, warm_cache)
    oci_proxy.fault = "truncate"
    result = CliRunner().invoke(main, ["pull", ref, "--insecure", "--cache-dir", str(tmp_path / "pulled")])
    assert result.exit_code == 1 and "cut off" in result.output and result.output.count("\n") == 1, result.output
    nothing_published(tmp_path / "pulled")
