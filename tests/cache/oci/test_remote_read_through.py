"""The read-through registry tier (MONO_JIT_REMOTE) against a real registry: a miss is fetched,
not compiled (online, offline, and on a host with no toolchain), eight processes missing the
same key fetch it once, and a compiled miss is pushed when MONO_JIT_REMOTE_PUSH allows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from cache_settings import SMALL_SPECS, settings_at
from oci_registry import new_ref, oci_proxy, oci_registry, pushed, remote_env  # noqa: F401  (fixtures)

from mono_jit.cache import Store
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.pipeline.resolve import resolve_many
from mono_jit.spec import Spec
from mono_jit.templates import get

GRID = [(name, spec) for name in ("router", "keytable") for spec in SMALL_SPECS]


def test_a_miss_is_fetched_from_the_registry_not_compiled(warm_cache, tmp_path, oci_proxy):
    ref = pushed(oci_proxy, warm_cache)
    settings = settings_at(tmp_path / "host", **remote_env(oci_proxy, ref))
    resolved = resolve_many(GRID, settings=settings)
    assert not any(r.compiled for r in resolved)
    assert {r.entry.key: r.hsaco for r in resolved} == {e.key: e.hsaco for e in Store(settings_at(warm_cache)).served()}
    assert dict(oci_proxy.counts) == {"GET manifest": 1, "GET blob": 3}  # one manifest a run, one blob a miss
    oci_proxy.reset()
    assert not any(r.compiled for r in resolve_many(GRID, settings=settings))
    assert not oci_proxy.counts  # now every kernel is a local hit


def test_offline_never_compiles_but_may_fetch(warm_cache, tmp_path, oci_proxy):
    ref = pushed(oci_proxy, warm_cache)
    settings = settings_at(tmp_path / "host", MONO_JIT_OFFLINE="1", **remote_env(oci_proxy, ref))
    assert not any(r.compiled for r in resolve_many(GRID, settings=settings))
    assert oci_proxy.counts["GET blob"] == 3


def test_a_host_without_a_toolchain_fetches_under_the_manifests_toolchains(warm_cache, tmp_path, oci_proxy):
    ref = pushed(oci_proxy, warm_cache)
    settings = settings_at(tmp_path / "lean", MONO_JIT_LD_LLD="/nonexistent/ld.lld", **remote_env(oci_proxy, ref))
    resolved = resolve_many(GRID, settings=settings)
    assert not any(r.compiled for r in resolved) and oci_proxy.counts["GET blob"] == 3


def test_prebuild_fetches_what_the_registry_holds_and_compiles_only_the_rest(warm_cache, tmp_path, oci_proxy,
                                                                             golden_pool):
    """With MONO_JIT_REMOTE set, a prebuild takes the steps of a miss as resolve does: the key the
    registry lists (router's, pushed alone) is fetched under its lock, not compiled; keytable's
    two keys, which it does not list, are compiled (by the golden pool)."""
    from click.testing import CliRunner

    from mono_jit.cli import main

    ref = new_ref(oci_proxy)
    result = CliRunner().invoke(main, ["push", ref, "--template", "router", "--insecure",
                                       "--cache-dir", str(warm_cache)])
    assert result.exit_code == 0, result.output
    oci_proxy.reset()
    settings = settings_at(tmp_path / "host", **remote_env(oci_proxy, ref))
    summary, planned = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings, jobs=1, timeout=60)
    assert len(planned) == 3 and not summary.failed
    assert summary.compiled == 2 and summary.fetched == 1 and summary.hits == 0
    assert dict(oci_proxy.counts) == {"GET manifest": 1, "GET blob": 1}
    (router,) = [e for e in summary.entries if e["template"] == "router"]
    served = {e.key: e.hsaco for e in Store(settings_at(warm_cache)).served()}
    assert Store(settings).lookup(router["key"], "gfx950").hsaco == served[router["key"]]


RANK = """
import json, sys, time
from mono_jit import Spec, resolve
start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.002)
r = resolve("router", Spec(8, 4, 1024, 1))
print(json.dumps({"compiled": r.compiled, "key": r.entry.key}))
"""


@pytest.mark.slow
def test_eight_ranks_missing_the_same_key_fetch_it_once(warm_cache, tmp_path, oci_proxy):
    ref = pushed(oci_proxy, warm_cache)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(MONO_JIT_CACHE_DIR=str(tmp_path / "host"), **remote_env(oci_proxy, ref))
    start = time.time() + 4.0  # every rank has imported mono-jit by then: they resolve together
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(start)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outs = [rank.communicate(timeout=180) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outs]
    results = [json.loads(out) for out, _ in outs]
    assert len({r["key"] for r in results}) == 1 and not any(r["compiled"] for r in results)
    assert oci_proxy.counts["GET manifest"] == 1 and oci_proxy.counts["GET blob"] == 1, dict(oci_proxy.counts)


@pytest.mark.slow
def test_a_compiled_miss_is_pushed_when_allowed(tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    spec = Spec(8, 4, 1024, 2)
    first = settings_at(tmp_path / "builder", MONO_JIT_REMOTE_PUSH="1", **remote_env(oci_proxy, ref))
    (built,) = resolve_many([("router", spec)], settings=first)
    assert built.compiled
    oci_proxy.reset()
    second = settings_at(tmp_path / "next-host", **remote_env(oci_proxy, ref))
    (fetched,) = resolve_many([("router", spec)], settings=second)
    assert not fetched.compiled and fetched.hsaco == built.hsaco
    assert oci_proxy.counts["GET blob"] == 1


@pytest.mark.slow
def test_without_push_allowed_nothing_is_written_to_the_registry(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)  # names nothing yet: the miss compiles, and nothing is pushed
    settings = settings_at(tmp_path / "host", **remote_env(oci_proxy, ref))
    (built,) = resolve_many([("router", Spec(8, 4, 1024, 2))], settings=settings)
    assert built.compiled
    assert set(oci_proxy.counts) == {"GET manifest"}


HIT = """
import json, sys
from mono_jit import Spec, resolve
r = resolve("router", Spec(8, 4, 1024, 1))
print(json.dumps({"compiled": r.compiled, "oras": "oras" in sys.modules, "requests": "requests" in sys.modules}))
"""


def test_a_warm_hit_never_loads_the_registry_client(warm_cache, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(MONO_JIT_CACHE_DIR=str(warm_cache), MONO_JIT_REMOTE="127.0.0.1:9/mono-jit/never:t")
    out = subprocess.run([sys.executable, "-c", HIT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == {"compiled": False, "oras": False, "requests": False}
