"""Warm loads: resolve_many serves a grid from the cache in a fresh process without importing
FlyDSL, MLIR, torch or the compile side (bench/warm_load.py times it; no timings are asserted
here), and answers exactly what resolve answers."""

import json
import os
import subprocess
import sys

import pytest

from cache_settings import SMALL_SPECS, settings_at
from mono_jit.cache import Store
from mono_jit.errors import OfflineMiss
from mono_jit.pipeline.resolve import resolve, resolve_many

# Modules a warm load must not import: FlyDSL and its MLIR, torch, and the compile side
# (mono_jit.pipeline.job stays: it plans keys; finishing a build is only called on a miss), the code object
# object reader (a load checks the ELF header only, mono_jit.hsaco.elf_header, and parses the stored records of
# mono_jit.hsaco.kernel_info) and glob.
ABSENT_PREFIXES = ("flydsl", "_mlir", "mlir", "torch", "mono_jit.pipeline.compile", "mono_jit.pipeline.workers",
                   "mono_jit.pipeline.prebuild", "mono_jit.pipeline.miss", "mono_jit.cache.lock", "filelock", "multiprocessing",
                   "elftools", "msgpack", "subprocess", "hashlib", "logging", "shutil", "uuid", "mono_jit.hsaco.metadata",
                   "glob")

GRID = """
import collections, dataclasses, json, sys
# every dataclass and namedtuple the warm load defines: each compiles generated source when
# defined (70-800 us; a Record, mono_jit/record.py, about 10)
defined = []
process_class, namedtuple = dataclasses._process_class, collections.namedtuple
def record(cls, *args):
    defined.append(f"dataclass {cls.__module__}.{cls.__qualname__}")
    return process_class(cls, *args)
def record_tuple(name, *args, **kwargs):
    defined.append(f"namedtuple {name}")
    return namedtuple(name, *args, **kwargs)
dataclasses._process_class, collections.namedtuple = record, record_tuple
from mono_jit.pipeline.resolve import resolve_many
from mono_jit.spec import Spec
pairs = [(t, Spec.from_dict(s)) for t, s in json.loads(sys.argv[1])]
resolved = resolve_many(pairs)
prefixes = tuple(json.loads(sys.argv[2]))
print(json.dumps({
    "compiled": [r.compiled for r in resolved],
    "keys": [r.entry.key for r in resolved],
    "sizes": [len(r.hsaco) for r in resolved],
    "loaded": sorted(m for m in sys.modules if m.startswith(prefixes)),
    "generated": defined,
}))
"""


def _pairs():
    return [(t, s) for t in ("router", "keytable") for s in SMALL_SPECS]


def test_grid_loads_in_a_fresh_process_without_flydsl_torch_or_the_compile_side(warm_cache):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(MONO_JIT_CACHE_DIR=str(warm_cache), MONO_JIT_OFFLINE="1")
    pairs = json.dumps([(t, s.as_dict()) for t, s in _pairs()])
    out = subprocess.run([sys.executable, "-c", GRID, pairs, json.dumps(ABSENT_PREFIXES)], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["generated"] == [], "the hit path's records are Records (mono_jit/record.py)"
    assert result["compiled"] == [False] * 4
    assert len(set(result["keys"])) == 3  # router reads only max_tokens: both specs share a key
    assert all(size > 0 for size in result["sizes"])


def test_resolve_many_answers_what_resolve_answers_and_shares_duplicate_keys(warm_cache):
    settings = settings_at(warm_cache, MONO_JIT_OFFLINE="1")
    many = resolve_many(_pairs(), settings=settings)
    one = [resolve(t, s, settings=settings) for t, s in _pairs()]
    assert [r.entry.key for r in many] == [r.entry.key for r in one]
    assert [r.hsaco for r in many] == [r.hsaco for r in one]
    assert many[0] is many[1]  # router at both specs: one key, one load


def test_resolve_many_still_verifies_every_entry(warm_cache):
    settings = settings_at(warm_cache, MONO_JIT_OFFLINE="1")
    (router,) = resolve_many([("router", SMALL_SPECS[0])], settings=settings)
    hsaco = router.entry.path / "kernel.hsaco"
    data = bytearray(hsaco.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only the sha256 can notice
    hsaco.write_bytes(bytes(data))
    with pytest.raises(OfflineMiss):  # the bad entry is not served: a miss, an error offline
        resolve_many([("router", SMALL_SPECS[0])], settings=settings)
    assert hsaco.exists()  # offline writes nothing: it stays where it is
    online = settings_at(warm_cache)
    assert Store(online).lookup(router.entry.key, "gfx950") is None  # a writable store quarantines it
    assert (warm_cache / "v1" / "quarantine").is_dir() and not hsaco.exists()
