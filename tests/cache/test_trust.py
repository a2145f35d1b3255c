"""Trust from each root to each file: links, modes and owners planted
at every level of a cache never get an entry served, a refused level is reported once by name
and reason, a good writable copy still serves, and odd umasks never make the cache refuse
itself."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.errors import UntrustedRoot

NOBODY = 65534
ROUTER = "router"


def _entry(root, template=ROUTER):
    return next(e for e in Store(settings_at(root)).entries() if isinstance(e, Entry) and e.meta.template == template)


def _levels(root, entry):
    """name -> path of each level of `entry` under `root`."""
    return {"v1": root / "v1", "arch": root / "v1" / "gfx950", "prefix": entry.path.parent, "entry": entry.path,
            "meta": entry.path / "meta.json", "hsaco": entry.path / "kernel.hsaco"}


def _relink(path, outside):
    """Move `path` out of the cache to `outside` and leave a symlink to it in its place."""
    shutil.move(str(path), str(outside))
    os.symlink(outside, path)


def _plant(attack, level, root, entry, tmp_path):
    path = _levels(root, entry)[level]
    if attack == "symlink":
        _relink(path, tmp_path / f"outside-{level}")
    elif attack == "writable":
        os.chmod(path, os.stat(path).st_mode | 0o022)
    else:
        os.chown(path, NOBODY, NOBODY)
    return path


ATTACKS = [(a, lvl) for a in ("symlink", "writable", "foreign")
           for lvl in ("v1", "arch", "prefix", "entry", "meta", "hsaco")]


@pytest.fixture
def layered(warm_cache, tmp_path):
    """(read-only root, writable root, key): both layers hold the same good router entry."""
    writable = tmp_path / "rw"
    shutil.copytree(warm_cache, writable, symlinks=True)
    return warm_cache, writable, _entry(warm_cache).key


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("attack, level", ATTACKS)
def test_attacked_read_only_level_is_skipped_and_the_writable_copy_serves(layered, tmp_path, caplog, attack, level):
    readonly, writable, key = layered
    path = _plant(attack, level, readonly, _entry(readonly), tmp_path)
    store = Store(settings_at(writable, MONO_JIT_CACHE_PATH=str(readonly)))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            entry = store.lookup(key, "gfx950")
            assert entry is not None and entry.layer.writable, (attack, level)
        listed = [e for e in store.entries() if isinstance(e, Entry)]
    assert all(e.layer.writable for e in listed if e.key == key)
    named = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(named) == 1, named  # reported once, by name and reason
    reason = {"symlink": "symlink", "writable": "writable", "foreign": f"uid {NOBODY}"}[attack]
    assert reason in named[0]


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("attack, level", ATTACKS)
def test_attacked_writable_level_is_never_served(warm_cache, tmp_path, attack, level):
    entry = _entry(warm_cache)
    _plant(attack, level, warm_cache, entry, tmp_path)
    if level == "v1":  # the writable root's own levels: a one-line error, as for the root
        with pytest.raises(UntrustedRoot, match="v1"):
            Store(settings_at(warm_cache))
        return
    store = Store(settings_at(warm_cache))
    assert store.lookup(entry.key, "gfx950") is None
    assert entry.key not in [e.key for e in store.entries() if isinstance(e, Entry)]
    if attack == "symlink":  # the link's target, outside the cache, is left as it was
        assert (tmp_path / f"outside-{level}").exists()


@pytest.mark.parametrize("attack, level", [("writable", "arch"), ("writable", "prefix"), ("writable", "entry"),
                                           ("foreign", "entry"), ("foreign", "meta")])
def test_shared_roots_allowed_accept_modes_and_owners_but_never_links(warm_cache, tmp_path, attack, level):
    if attack == "foreign" and os.getuid() != 0:
        pytest.skip("chown to another user needs root")
    entry = _entry(warm_cache)
    _plant(attack, level, warm_cache, entry, tmp_path)
    shared = settings_at(warm_cache, MONO_JIT_ALLOW_SHARED_ROOTS="1")
    assert Store(shared).lookup(entry.key, "gfx950") is not None
    _relink(entry.path / "kernel.hsaco", tmp_path / "linked.hsaco")
    assert Store(shared).lookup(entry.key, "gfx950") is None


UMASK_RUN = """
import json, os, sys
os.umask(int(sys.argv[1], 8))
from mono_jit.cache import EntryMeta, Store
from mono_jit.config import Settings
entry = json.loads(open(sys.argv[2]).read())
store = Store(Settings())
store.publish(entry["key"], "gfx950", bytes.fromhex(entry["hsaco"]), EntryMeta.from_json(entry["meta"]))
for key in json.loads(sys.argv[3]):
    assert store.lookup(key, "gfx950") is not None, key
print("OK")
"""


@pytest.mark.parametrize("umask", ["002", "000"])
def test_two_runs_under_a_loose_umask_publish_and_hit(golden_cache, tmp_path, umask):
    entries = [e for e in Store(settings_at(golden_cache)).entries() if isinstance(e, Entry)][:2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env["MONO_JIT_CACHE_DIR"] = str(tmp_path / "cache")
    published = []
    for entry in entries:  # two consecutive processes, each publishing one entry
        spec = tmp_path / f"{entry.key}.json"
        spec.write_text(json.dumps({"key": entry.key, "hsaco": entry.hsaco.hex(), "meta": entry.meta.to_json()}))
        published.append(entry.key)
        run = subprocess.run([sys.executable, "-c", UMASK_RUN, umask, str(spec), json.dumps(published)],
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "OK", run.stderr[-2000:]
    for folder in (tmp_path / "cache").rglob("*"):
        if folder.is_dir():
            assert not folder.stat().st_mode & 0o022, folder
