"""Poison entries and bit flips: a malformed meta.json, a FIFO, a link
to /dev/zero or one flipped bit anywhere in an entry is a corrupt entry (quarantined in the
writable layer, skipped in a read-only one), never a hang, a memory blow-up, a traceback or a
changed entry served."""

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.cli import main


def _entry(root, template="router"):
    return next(e for e in Store(settings_at(root)).entries() if isinstance(e, Entry) and e.meta.template == template)


def _write_meta(path, meta):
    """Rewrite an entry's meta.json as the store writes it, with a matching digest file when the
    store keeps one: only the schema check can catch what is wrong."""
    data = (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode()
    (path / "meta.json").write_bytes(data)
    if (path / "meta.sha256").exists():
        (path / "meta.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def _cli(root, *args, env=None):
    return CliRunner().invoke(main, [*args, "--cache-dir", str(root)], env=env)


def _no_traceback(result):
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def _set(path, value):
    """A mutation of meta: `path` is a list of keys / indexes, the last one set to `value`
    (a missing sentinel deletes it)."""
    def mutate(meta):
        node = meta
        for step in path[:-1]:
            node = node[step]
        if value is MISSING:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return meta
    return mutate


MISSING = object()
MALFORMED = {
    "hsaco null": _set(["hsaco"], None),
    "hsaco missing": _set(["hsaco"], MISSING),
    "hsaco size string": _set(["hsaco", "size"], "6688"),
    "factors null": _set(["factors"], None),
    "kernels null": _set(["kernels"], None),
    "kernels empty": _set(["kernels"], []),
    "kernel vgpr missing": _set(["kernels", 0, "vgpr"], MISSING),
    "arg offset string": _set(["kernels", 0, "args", 0, "offset"], "0"),
    "arg size negative": _set(["kernels", 0, "args", 0, "size"], -8),
    "arg value_kind null": _set(["kernels", 0, "args", 0, "value_kind"], None),
    "launch grid short": _set(["launch", "grid"], [1, 1]),
    "launch block float": _set(["launch", "block", 0], 64.0),
    "dynamic_lds bool": _set(["launch", "dynamic_lds"], True),
    "launches empty": _set(["launches"], []),
    "launch of unknown kernel": _set(["launches", 0, "kernel"], "nope"),
    "arguments null": _set(["arguments"], None),
    "argument kind unknown": _set(["arguments", 0, "kind"], "blob"),
    "residency list": _set(["residency"], []),
    "persistent string": _set(["persistent"], "no"),
    "template missing": _set(["template"], MISSING),
    "meta a list": lambda meta: [meta],
    "meta null": lambda meta: None,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_meta_is_quarantined_and_no_command_crashes(warm_cache, name):
    entry = _entry(warm_cache)
    _write_meta(entry.path, MALFORMED[name](json.loads((entry.path / "meta.json").read_text())))
    listed = _cli(warm_cache, "list", "--json")
    _no_traceback(listed)
    assert listed.exit_code == 0 and entry.key not in listed.output
    verified = _cli(warm_cache, "verify", "--json")
    _no_traceback(verified)
    assert verified.exit_code == 1
    rows = json.loads(verified.output)["entries"]
    assert [r["ok"] for r in rows if r["key"] == entry.key] == [False]
    _no_traceback(_cli(warm_cache, "inspect", entry.key))
    assert Store(settings_at(warm_cache)).lookup(entry.key, "gfx950") is None
    assert not entry.path.exists()  # quarantined, so a compile can replace it
    (quarantined,) = (warm_cache / "v1" / "quarantine").iterdir()
    assert (quarantined / "reason.txt").read_text().strip()


@pytest.mark.parametrize("name", ["hsaco null", "kernels null", "arg offset string", "meta null"])
def test_malformed_meta_in_a_read_only_layer_is_skipped_for_the_good_writable_copy(warm_cache, tmp_path, name):
    writable = tmp_path / "rw"
    shutil.copytree(warm_cache, writable, symlinks=True)
    entry = _entry(warm_cache)
    before = sorted(warm_cache.rglob("*"))
    _write_meta(entry.path, MALFORMED[name](json.loads((entry.path / "meta.json").read_text())))
    served = Store(settings_at(writable, MONO_JIT_CACHE_PATH=str(warm_cache))).lookup(entry.key, "gfx950")
    assert served is not None and served.layer.writable
    assert sorted(warm_cache.rglob("*")) == before  # nothing moved or written in the read-only layer


PROBE = """
import json, sys
from mono_jit.cache import Entry, Store
from mono_jit.config import Settings
store = Store(Settings())
entry = store.lookup(sys.argv[1], "gfx950")
items = list(store.entries())
print(json.dumps({"served": None if entry is None else ("writable" if entry.layer.writable else "read-only"),
                  "good": sum(isinstance(i, Entry) for i in items), "bad": sum(not isinstance(i, Entry) for i in items)}))
"""


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _probe(writable, key, readonly=None):
    """Look `key` up and list every entry in a fresh process with 2 GiB of address space and
    60 s: a hang or a memory blow-up fails the test instead of the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env["MONO_JIT_CACHE_DIR"] = str(writable)
    if readonly is not None:
        env["MONO_JIT_CACHE_PATH"] = str(readonly)
    try:
        run = subprocess.run([sys.executable, "-c", PROBE, key], env=env, capture_output=True, text=True,
                             timeout=60, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("the lookup hung")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _poison(path, how):
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


@pytest.mark.parametrize("how", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["kernel.hsaco", "meta.json"])
def test_fifo_or_dev_zero_in_place_of_a_file_neither_hangs_nor_eats_memory(warm_cache, tmp_path, how, name):
    entry = _entry(warm_cache)
    writable = tmp_path / "rw"
    shutil.copytree(warm_cache, writable, symlinks=True)
    _poison(entry.path / name, how)
    # In a read-only layer: skipped, and the good writable copy serves.
    assert _probe(writable, entry.key, warm_cache) == {"served": "writable", "good": 5, "bad": 1}
    # In the writable layer: quarantined, a miss.
    assert _probe(warm_cache, entry.key) == {"served": None, "good": 2, "bad": 0}
    assert len(list((warm_cache / "v1" / "quarantine").iterdir())) == 1


FLIPS = 2000


def _flip_positions(size, seed):
    return random.Random(seed).sample(range(size * 8), min(FLIPS, size * 8))


@pytest.mark.parametrize("name", ["meta.json", "kernel.hsaco", "meta.sha256"])
def test_every_sampled_bit_flip_is_detected(warm_cache, tmp_path, name):
    entry = _entry(warm_cache, "keytable")
    target = entry.path / name
    if not target.exists():
        pytest.skip(f"no {name} in this store's entries")
    readonly = tmp_path / "ro"  # a layer holding only this entry: flips are skipped, never moved
    shutil.copytree(entry.path, readonly / entry.path.relative_to(warm_cache))
    target = readonly / entry.path.relative_to(warm_cache) / name
    store = Store(settings_at(tmp_path / "rw", MONO_JIT_CACHE_PATH=str(readonly)))
    original = target.read_bytes()
    served = []
    for index, bit in enumerate(_flip_positions(len(original), name)):
        flipped = bytearray(original)
        flipped[bit // 8] ^= 1 << (bit % 8)
        target.write_bytes(bytes(flipped))
        if store.lookup(entry.key, "gfx950") is not None or any(isinstance(i, Entry) for i in store.entries()):
            served.append(bit)
        if index % 100 == 0:  # the commands too, on a sample: no KeyError, no traceback
            for args in (("list", "--json"), ("verify", "--json")):
                result = _cli(tmp_path / "rw", *args, env={"MONO_JIT_CACHE_PATH": str(readonly)})
                _no_traceback(result)
    assert served == [], f"{len(served)} of {FLIPS} flips of {name} were served"
    target.write_bytes(original)
    assert store.lookup(entry.key, "gfx950") is not None  # the untouched entry still serves
