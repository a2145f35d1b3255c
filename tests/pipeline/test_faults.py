"""Faults a careless operator meets: full, read-only and file-blocked disks during prebuild and
resolve(), a script without a __main__ guard, offline misses. Compiles are answered
from the golden cache's bytes where the fault, not the compile, is under test."""

import errno
import itertools
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from golden_pool import PREBUILD
from mono_jit.pipeline.job import BuildJob
from mono_jit.cache import Entry, Store
from mono_jit.cli import main
from mono_jit.errors import MonoJitError, OfflineMiss
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec, deployment_grid
from mono_jit.templates import get
from mono_jit.pipeline.toolchain import resolve_toolchain

def fail_fsync(monkeypatch, code):
    """Every fsync fails with `code` (where a full disk usually shows: delayed allocation)."""
    def fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)


def prebuild_cli(root, code=1):
    """`mono-jit prebuild --json` of the three keys: (summary, the failure lines on stderr)."""
    result = CliRunner().invoke(main, [*PREBUILD, "--json", "--cache-dir", str(root)])
    assert result.exit_code == code, (result.output, result.exception)
    assert "Traceback" not in result.output
    failed = [line for line in result.stderr.splitlines() if line.startswith("failed ")]
    summary = json.loads(result.stdout)
    assert len(failed) == summary["failed"] and all("\n" not in f["error"] for f in summary["failures"])
    return summary, failed


def counts(summary):
    return summary["compiled"], summary["hits"], summary["failed"]


def good_entries(root):
    return [e for e in Store(settings_at(root)).entries() if isinstance(e, Entry)]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_or_read_only_disk_stops_prebuild_cleanly(golden_pool, tmp_path, monkeypatch, code):
    root = tmp_path / "cache"
    with monkeypatch.context() as patch:
        fail_fsync(patch, code)
        summary, failed = prebuild_cli(root)
    assert counts(summary) == (0, 0, 3)  # the first build says why, the other two were not attempted
    assert os.strerror(code) in failed[0] and str(root) in failed[0], failed[0]
    assert sum("not attempted" in line for line in failed) == 2, failed
    assert good_entries(root) == []  # nothing half-written is served
    summary, _ = prebuild_cli(root, code=0)  # the disk has room again: everything is built
    assert counts(summary) == (3, 0, 0)
    assert len(good_entries(root)) == 3


def test_a_file_in_the_way_fails_its_build_and_the_others_go_on(golden_pool, warm_cache, tmp_path):
    root = tmp_path / "cache"
    entries = good_entries(warm_cache)
    router = next(e for e in entries if e.meta.template == "router")
    blocked = sum(e.key[:2] == router.key[:2] for e in entries)  # keys that share the router's folder
    blocker = root / "v1" / "gfx950" / router.key[:2]
    blocker.parent.mkdir(parents=True, mode=0o700)
    for level in (root, root / "v1", blocker.parent):
        os.chmod(level, 0o700)
    blocker.write_text("not a folder\n")
    summary, failed = prebuild_cli(root)
    assert counts(summary) == (3 - blocked, 0, blocked)
    assert any("router" in line and str(blocker) in line for line in failed), failed
    blocker.unlink()
    summary, _ = prebuild_cli(root, code=0)
    assert counts(summary) == (blocked, 3 - blocked, 0)


def test_resolve_reports_disk_errors_in_one_line(golden_pool, tmp_path, monkeypatch):
    settings = settings_at(tmp_path / "cache")
    with monkeypatch.context() as patch:
        fail_fsync(patch, errno.ENOSPC)
        with pytest.raises(MonoJitError) as info:
            resolve("router", Spec(8, 4, 1024, 1), settings=settings)
    text = str(info.value)
    assert "No space left" in text and str(tmp_path / "cache") in text and "\n" not in text, text
    assert resolve("router", Spec(8, 4, 1024, 1), settings=settings).compiled  # room again: it builds
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(MonoJitError) as info:  # a cache root below a file
        resolve("router", Spec(8, 4, 1024, 1), settings=settings_at(blocked / "cache"))
    assert str(blocked) in str(info.value) and "\n" not in str(info.value)


def readme_python_snippet() -> str:
    """The README's "From Python" code block, as the README has it (so the test cannot drift)."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    after = text[text.index("From Python"):].split("\n")[1:]
    block = itertools.takewhile(lambda line: not line or line.startswith("    "),
                                itertools.dropwhile(lambda line: not line, after))
    return textwrap.dedent("\n".join(block)).strip() + "\n"


@pytest.mark.slow
def test_the_readme_snippet_runs_as_a_plain_script(tmp_path):
    snippet = readme_python_snippet()
    assert "from mono_jit import Spec, resolve" in snippet and "resolve(" in snippet
    script = tmp_path / "snippet.py"
    script.write_text('print("MAIN RAN", flush=True)\n' + snippet
                      + 'print("COMPILED" if r.compiled else "HIT", len(r.hsaco))\n')
    env = {**os.environ, "MONO_JIT_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    assert lines.count("MAIN RAN") == 1, done.stdout  # the compile worker never re-ran the script
    assert lines[1].startswith("COMPILED "), done.stdout


def _command_keys(command: str, fingerprint: dict) -> set[str]:
    """The keys `mono-jit prebuild ...` would build, from its options (planned, not compiled)."""
    words = shlex.split(command)
    assert words[:2] == ["mono-jit", "prebuild"], command
    opts = dict(zip(words[2::2], words[3::2]))
    assert set(opts) == {"--template", "--tp", "--ratio", "--max-model-len", "--max-tokens", "--arch"}, command
    specs = deployment_grid(int(opts["--tp"]), int(opts["--max-model-len"]), [int(opts["--max-tokens"])],
                            [int(opts["--ratio"])], opts["--arch"])
    return {BuildJob.plan(get(opts["--template"]), spec, fingerprint).key for spec in specs}


@pytest.mark.parametrize("spec", [Spec(8, 128, 2048, 2), Spec(8, 128, 8192, 64), Spec(8, 4, 1024, 16)])
def test_the_offline_miss_names_the_command_that_fills_its_key(tmp_path, spec):
    settings = settings_at(tmp_path / "cache", MONO_JIT_OFFLINE="1")
    fingerprint = resolve_toolchain(settings).fingerprint
    with pytest.raises(OfflineMiss) as info:
        resolve("keytable", spec, settings=settings)
    text = str(info.value)
    command = text.split("fill it with: ", 1)[1].split("  (", 1)[0]
    missed = BuildJob.plan(get("keytable"), spec, fingerprint).key
    assert missed.startswith(text.split("(key ", 1)[1][:16])
    assert _command_keys(command, fingerprint) == {missed}, command


def test_an_offline_miss_writes_nothing(tmp_path):
    root = tmp_path / "cache"
    with pytest.raises(OfflineMiss):
        resolve("router", Spec(8, 4, 1024, 2), settings=settings_at(root, MONO_JIT_OFFLINE="1"))
    assert not root.exists(), sorted(str(p) for p in root.rglob("*"))


def test_offline_lookups_of_a_cache_write_nothing_in_it(warm_cache):
    """A hit and a corrupt entry, offline: the entry is skipped, not quarantined; no byte of the
    cache changes."""
    def snapshot():
        return {str(p): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
                for p in sorted(warm_cache.rglob("*"))}

    settings = settings_at(warm_cache, MONO_JIT_OFFLINE="1")
    hsaco = next(warm_cache.rglob("kernel.hsaco"))
    data = bytearray(hsaco.read_bytes())
    data[-1] ^= 0xFF  # a corrupt entry: offline, it must be skipped, not quarantined
    hsaco.write_bytes(bytes(data))
    before = snapshot()
    for spec in (Spec(8, 128, 8192, 1), Spec(8, 4, 1024, 1)):
        for name in ("router", "keytable"):
            try:
                resolve(name, spec, settings=settings)
            except OfflineMiss:
                pass
    assert snapshot() == before


def test_hits_from_a_read_only_layer_need_no_writable_folder(warm_cache, tmp_path):
    """An unwritable HOME (here: the writable root would sit below a file, which even root cannot
    create): pure hits still serve from MONO_JIT_CACHE_PATH; a miss is a one-line error."""
    blocker = tmp_path / "home-file"
    blocker.write_text("")
    settings = settings_at(blocker / "cache", MONO_JIT_CACHE_PATH=str(warm_cache))
    assert not resolve("router", Spec(8, 4, 1024, 1), settings=settings).compiled
    with pytest.raises(MonoJitError) as info:
        resolve("router", Spec(8, 4, 1024, 2), settings=settings)
    assert "\n" not in str(info.value) and str(blocker) in str(info.value)
