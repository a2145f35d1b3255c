"""The moments right after a publish: a `gc` evicting the brand-new entry before its publisher
reads it back, and a full disk while the toolchain record is written. Neither turns a good
compile into a failure; each says what is true. The windows are forced open here."""

from __future__ import annotations

import errno
import json
import os

from click.testing import CliRunner

import mono_jit.cache.store as store_module
from cache_settings import settings_at
from golden_pool import PREBUILD
from mono_jit.cache import Store
from mono_jit.cache.gc import collect
from mono_jit.cache.store import TOOLCHAINS_DIR
from mono_jit.cli import main
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec


def evict_before_read_back(monkeypatch, root):
    """A `gc --max-size 0` of `root` runs between each publish's rename and its read-back."""
    read_entry = store_module.read_entry
    evicted = []

    def gc_first(layer, path, arch):
        if layer.writable and path.name not in evicted:
            evicted.append(path.name)
            collect(Store(settings_at(root)), max_bytes=0, older_than=None)
        return read_entry(layer, path, arch)

    monkeypatch.setattr(store_module, "read_entry", gc_first)
    return evicted


def test_an_entry_evicted_before_its_read_back_still_serves_its_compile(golden_pool, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    evicted = evict_before_read_back(monkeypatch, root)
    result = resolve("router", Spec(8, 4, 1024, 1), settings=settings_at(root))
    assert result.compiled and evicted == [result.meta.key] and len(result.hsaco) == result.meta.hsaco.size
    assert Store(settings_at(root)).lookup(result.meta.key, "gfx950") is None  # gc did evict it


def test_a_prebuild_whose_entries_are_evicted_at_once_reports_them_compiled(golden_pool, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    evicted = evict_before_read_back(monkeypatch, root)
    result = CliRunner().invoke(main, [*PREBUILD, "--json", "--cache-dir", str(root)])
    assert result.exit_code == 0, (result.output, result.exception)
    summary = json.loads(result.stdout)
    assert (summary["compiled"], summary["failed"]) == (3, 0) and len(evicted) == 3, summary


def test_a_full_disk_at_the_toolchain_record_fails_no_published_entry(golden_pool, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    write_new = store_module.write_new

    def full_at_records(path, data, mode=0o600, **kwargs):
        if path.parent.name == TOOLCHAINS_DIR:
            write_new(path, data[: len(data) // 2], mode, durable=False)  # what a full disk leaves
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_new(path, data, mode, **kwargs)

    monkeypatch.setattr(store_module, "write_new", full_at_records)
    result = CliRunner().invoke(main, [*PREBUILD, "--json", "--cache-dir", str(root)])
    assert result.exit_code == 0, (result.output, result.exception)
    summary = json.loads(result.stdout)
    assert (summary["compiled"], summary["failed"]) == (3, 0), summary
    said = [line for line in result.stderr.splitlines() if "toolchain" in line]
    assert said and all("is published" in line and "No space left" in line for line in said), result.stderr
    records = root / "v1" / "gfx950" / TOOLCHAINS_DIR
    assert os.listdir(records) == []  # no temporary record left for gc to find an hour later
    assert len([e for e in Store(settings_at(root)).entries()]) == 3
