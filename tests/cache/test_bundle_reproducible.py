"""Bundles that can be pinned: two exports of one cache are the same bytes,
whatever the files' times, the bundle's name or the moment; `export` prints the bundle's
sha256 (and puts it in --json), and `import --sha256` accepts that digest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from mono_jit.cli import main


def _cli(root: Path, *args: str):
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(root)])
    assert result.exit_code == 0, result.output
    return result


def _age_every_file(root: Path, seconds: float) -> None:
    """Every file and folder of the cache made older; symlinks are left alone, not followed (the
    staged ROCm root links to the system's ld.lld and bitcode, whose times are not ours)."""
    for path in (root / "v1").rglob("*"):
        if path.is_symlink():
            continue
        st = path.stat()
        os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


@pytest.mark.parametrize("suffix", ["tar.gz", "tar"])
def test_two_exports_of_one_cache_are_byte_identical_and_print_their_sha256(warm_cache, tmp_path, suffix):
    first, second = tmp_path / f"one.{suffix}", tmp_path / "elsewhere" / f"other-name.{suffix}"
    second.parent.mkdir()
    printed = _cli(warm_cache, "export", str(first)).stdout
    _age_every_file(warm_cache, 86400 * 3 + 17)
    reported = json.loads(_cli(warm_cache, "export", str(second), "--json").stdout)
    assert first.read_bytes() == second.read_bytes()
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert re.search(rf"^sha256 {digest}\b", printed, re.M), printed
    assert reported["sha256"] == digest and reported["entries"] == 3, reported
    imported = json.loads(_cli(tmp_path / "fresh", "import", "--sha256", digest, str(second), "--json").stdout)
    assert imported == {"schema": "mono-jit-import/1", "imported": 3, "present": 0}


def test_a_bundle_carries_nothing_of_the_machine_user_or_moment(warm_cache, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    _cli(warm_cache, "export", str(bundle))
    head = bundle.read_bytes()[:10]
    assert head[:3] == b"\x1f\x8b\x08" and head[3] == 0, head  # no FNAME / FCOMMENT / FEXTRA flags
    assert head[4:8] == b"\0\0\0\0", head  # no gzip timestamp
    with tarfile.open(bundle) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names[0] == "manifest.json" and names[1:] == sorted(names[1:]) and len(names) == 7, names
    for m in members:
        assert (m.type, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname, m.pax_headers) == \
            (tarfile.REGTYPE, 0o644, 0, 0, 0, "", "", {}), m.name
