"""Every layer's copy on its own: a bad copy of a key in a read-only layer
never hides the good copy in the writable layer from verify, list, inspect, export, gc or clear."""

import json
import shutil
import tarfile

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Entry, Store
from mono_jit.cli import main


def _spoil(path, how):
    if how == "flipped hsaco":
        blob = bytearray((path / "kernel.hsaco").read_bytes())
        blob[-1] ^= 0x01
        (path / "kernel.hsaco").write_bytes(bytes(blob))
    else:
        meta = json.loads((path / "meta.json").read_text())
        meta["hsaco"] = None
        (path / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(params=["flipped hsaco", "hsaco null"])
def shadowed(request, warm_cache, tmp_path):
    """(cli, key): a writable layer with three good entries under a read-only layer whose copy of
    one of them (the router) is bad."""
    readonly = tmp_path / "ro"
    shutil.copytree(warm_cache, readonly, symlinks=True)
    entry = next(e for e in Store(settings_at(readonly)).entries() if isinstance(e, Entry) and e.meta.template == "router")
    shutil.rmtree(readonly / "v1" / "gfx950" / "toolchains", ignore_errors=True)
    for other in (readonly / "v1" / "gfx950").glob("??/*"):
        if other.name != entry.key:
            shutil.rmtree(other)
    _spoil(entry.path, request.param)

    def cli(*args, code=0):
        result = CliRunner().invoke(main, [*args, "--cache-dir", str(warm_cache)], env={"MONO_JIT_CACHE_PATH": str(readonly)})
        assert result.exit_code == code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        return result

    return cli, entry.key


def test_verify_checks_each_copy_on_its_own(shadowed):
    cli, key = shadowed
    rows = json.loads(cli("verify", "--json", code=1).output)["entries"]
    assert sorted(r["ok"] for r in rows if r["key"] == key) == [False, True]  # the bad copy, the good one
    assert sum(r["ok"] for r in rows) == 3


def test_list_inspect_and_export_show_the_good_copy(shadowed, tmp_path):
    cli, key = shadowed
    listed = json.loads(cli("list", "--json").output)["entries"]
    assert sorted(r["layer"] for r in listed if r["key"] == key) == ["writable"] and len(listed) == 3
    assert json.loads(cli("inspect", key, "--json").output)["key"] == key
    bundle = tmp_path / "out.tar"
    cli("export", str(bundle))
    with tarfile.open(bundle) as tar:
        assert any(key in name for name in tar.getnames())


def test_gc_reaches_the_writable_copy(shadowed):
    cli, key = shadowed
    collected = json.loads(cli("gc", "--max-size", "0", "--json").output)
    assert key in collected["removed"] and len(collected["removed"]) == 3
    assert json.loads(cli("list", "--json").output)["entries"] == []


def test_clear_reaches_the_writable_copy(shadowed):
    cli, key = shadowed
    assert json.loads(cli("clear", "--json", "--yes").output)["removed"] == 3
    assert json.loads(cli("list", "--json").output)["entries"] == []
