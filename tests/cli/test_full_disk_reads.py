"""A full disk under read-only commands: `list` and `stats` merge the counters in memory and
write nothing (`-v` says so); a command that must write (`stats --zero`, `export`) fails in one
line naming the path and the fix, leaving no temporary file behind."""

from __future__ import annotations

import errno
import os
import re

import pytest
from click.testing import CliRunner

from mono_jit.cache.stats import Counters, record
from mono_jit.cli import main


def full_disk(monkeypatch):
    """Every fsync fails as on a full disk (delayed allocation), with no path in the error."""
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.fixture
def counted(warm_cache):
    """The warm cache with one delta of counts not yet merged (a serving process's, at its exit)."""
    record(warm_cache / "v1", Counters(hits=5, misses=2, compiled=2))
    return warm_cache


def stats_files(cache):
    """The counter files (the empty lock file a merge opens aside)."""
    return sorted(n for n in os.listdir(cache / "v1" / "stats") if n != "merge.lock")


@pytest.mark.parametrize("command", [["list"], ["stats"], ["list", "--json"], ["stats", "--json"]])
def test_a_read_only_command_works_on_a_full_disk(counted, monkeypatch, command):
    before = stats_files(counted)
    full_disk(monkeypatch)
    result = CliRunner().invoke(main, [*command, "--cache-dir", str(counted)])
    assert result.exit_code == 0 and result.stderr == "", (result.output, result.exception)
    assert re.search(r'"hits": 5\b|\b5 hits|hits +5\n', result.stdout), result.stdout
    assert stats_files(counted) == before  # the delta stays for a merge that can write; no temp file


def test_with_v_it_says_the_counters_were_not_written(counted, monkeypatch):
    full_disk(monkeypatch)
    result = CliRunner().invoke(main, ["-v", "stats", "--cache-dir", str(counted)])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "not written" in line]
    assert len(said) == 1 and str(counted / "v1" / "stats") in said[0] and "No space left" in said[0], result.stderr


def test_zeroing_the_counters_on_a_full_disk_names_the_path_and_the_fix(counted, monkeypatch):
    before = stats_files(counted)
    full_disk(monkeypatch)
    result = CliRunner().invoke(main, ["stats", "--zero", "--cache-dir", str(counted)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert str(counted / "v1" / "stats") in result.output and "free space there" in result.output, result.output
    assert stats_files(counted) == before


def test_an_export_onto_a_full_disk_names_the_path_and_the_fix(warm_cache, tmp_path, monkeypatch):
    def full(path, *args, **kwargs):
        path.write_bytes(b"part of a bundle")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("mono_jit.cache.bundle.write_file", full)
    out = tmp_path / "b.tar.gz"
    result = CliRunner().invoke(main, ["export", str(out), "--cache-dir", str(warm_cache)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert str(out) in result.output and "No space left" in result.output, result.output
    assert "free space there, or write the bundle to another disk" in result.output, result.output
    assert os.listdir(tmp_path) == [warm_cache.name]
