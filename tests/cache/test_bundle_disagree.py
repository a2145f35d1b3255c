"""Importing a bundle from another build machine: an entry with the key of a present entry but
other code-object bytes keeps the present one, and says the two disagree (one line naming the
key; `--json` lists it). A repacked bundle is refused with how to make one."""

from __future__ import annotations

import hashlib
import json
import tarfile

from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Store
from mono_jit.cache.bundle import export_bundle
from mono_jit.cli import main


def test_a_bundled_entry_that_disagrees_with_the_present_one_is_named(warm_cache, tmp_path):
    source = Store(settings_at(warm_cache))
    entries = list(source.entries())
    bundle = tmp_path / "b.tar.gz"
    export_bundle(bundle, entries)
    entry = entries[0]
    hsaco = bytearray(entry.hsaco)
    hsaco[len(hsaco) // 2] ^= 0xFF
    meta = json.loads((entry.path / "meta.json").read_bytes())
    meta["hsaco"]["sha256"] = hashlib.sha256(hsaco).hexdigest()
    here = tmp_path / "here"
    Store(settings_at(here)).publish_json(entry.key, entry.arch, bytes(hsaco), json.dumps(meta).encode())

    result = CliRunner().invoke(main, ["import", str(bundle), "--cache-dir", str(here)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"imported {len(entries) - 1} entries (1 already present)\n", result.stdout
    warning = [line for line in result.stderr.splitlines() if entry.key in line]
    assert len(warning) == 1 and "different code-object bytes" in warning[0] and "kept" in warning[0], result.stderr
    assert Store(settings_at(here)).lookup(entry.key, entry.arch).hsaco == bytes(hsaco)  # the present one stays

    again = CliRunner().invoke(main, ["import", str(bundle), "--cache-dir", str(here), "--json"])
    report = json.loads(again.stdout)
    assert report["differing"] == [f"{entry.arch}/{entry.key}"] and report["present"] == len(entries)


def test_a_bundle_that_agrees_with_what_is_present_says_nothing_more(warm_cache, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    export_bundle(bundle, list(Store(settings_at(warm_cache)).entries()))
    result = CliRunner().invoke(main, ["import", str(bundle), "--cache-dir", str(warm_cache), "--json"])
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert "differing" not in json.loads(result.stdout)  # a clean import's shape is unchanged


def test_a_repacked_bundle_is_refused_with_how_to_make_one(warm_cache, tmp_path):
    """`tar -C dir .` of an unpacked bundle starts with the folder '.', not manifest.json."""
    unpacked = tmp_path / "unpacked"
    export_bundle(tmp_path / "b.tar.gz", list(Store(settings_at(warm_cache)).entries()))
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        tar.extractall(unpacked, filter="data")
    with tarfile.open(tmp_path / "repacked.tar.gz", "w:gz") as tar:
        tar.add(unpacked, arcname=".")
    result = CliRunner().invoke(main, ["import", str(tmp_path / "repacked.tar.gz"), "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "not a mono-jit bundle" in result.output and "mono-jit export" in result.output, result.output
