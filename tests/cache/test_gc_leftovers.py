"""Leftovers of killed runs (temp folders, toolchain staging, temp files of the probe memo and of
toolchain records) and old quarantined entries are listed by `gc --dry-run` and removed by `gc`
once older than an hour; young ones, the newest quarantined entries and every entry stay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from cache_settings import SMALL_SPECS, settings_at
from mono_jit.cache import Store
from mono_jit.cache.gc import collect
from mono_jit.cli import main
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.templates import get

HOURS = 3600


def _age(path: Path, seconds: float) -> None:
    """Set the mtime of `path` and everything under it `seconds` into the past."""
    when = time.time() - seconds
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.utime(os.path.join(folder, name), (when, when), follow_symlinks=False)
    os.utime(path, (when, when), follow_symlinks=False)


def _plant(base: Path, relative: str, seconds: float, *, folder: bool) -> Path:
    path = base / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "kernel.hsaco").write_bytes(b"x" * 100)
    else:
        path.write_text("{}")
    _age(path, seconds)
    return path


def _killed_import(root: Path, tmp_path: Path) -> Path:
    """A real killed run: a process staging an import, killed with SIGKILL; its staging folder."""
    script = ("import os, sys, time\n"
              "from mono_jit.config import Settings\n"
              "from mono_jit.cache import Store\n"
              "from mono_jit.cache import bundle\n"
              "store = Store(Settings({**os.environ, 'MONO_JIT_CACHE_DIR': sys.argv[1]}))\n"
              "bundle._remove_tree = lambda path: None\n"
              "folder = bundle._staging_folder(store)\n"
              "print(folder, flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True)
    folder = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert folder.is_dir()
    return folder


def test_gc_lists_then_removes_old_leftovers_and_keeps_the_rest(warm_cache, tmp_path):
    base = warm_cache / "v1"
    old = [
        _plant(base, "tmp/0123456789abcdef-4242-deadbeef", 2 * HOURS, folder=True),  # a killed publish
        _plant(base, "toolchain/.tmp-" + "a" * 32, 2 * HOURS, folder=True),  # a killed staging
        _plant(base, "toolchain/.probes.json.4242.abcdef", 2 * HOURS, folder=False),
        _plant(base, "gfx950/toolchains/.0123456789abcdef.json.4242.abcdef", 2 * HOURS, folder=False),
    ]
    killed = _killed_import(warm_cache, tmp_path)
    _age(killed, 2 * HOURS)
    old.append(killed)
    young = [
        _plant(base, "tmp/fedcba9876543210-4343-cafebabe", 60, folder=True),  # a run at work now
        _plant(base, "toolchain/.probes.json.4343.fedcba", 60, folder=False),
    ]
    quarantined = [_plant(base, f"quarantine/{i:064x}-{1000 + i}-abcdef", (20 - i) * HOURS, folder=True)
                   for i in range(8)]
    old += quarantined[:3]  # the three oldest go; the newest five stay for diagnosis

    report = collect(Store(settings_at(warm_cache)), max_bytes=None, older_than=None, dry_run=True)
    assert sorted(report.leftovers) == sorted(map(str, old)) and report.leftover_bytes == 5 * 100 + 2 * 2
    assert all(p.exists() for p in old)  # a dry run removes nothing

    cache = ["--cache-dir", str(warm_cache)]
    listed = CliRunner().invoke(main, ["gc", "--dry-run", "--older-than", "30d", "--json", *cache])
    assert listed.exit_code == 0 and sorted(json.loads(listed.output)["leftovers"]) == sorted(map(str, old))
    text = CliRunner().invoke(main, ["gc", "--dry-run", *cache]).output  # leftovers only: no entry is evicted
    assert all(f"would remove leftover {p}" in text for p in old) and "would remove 0 entries" in text

    done = CliRunner().invoke(main, ["gc", "--older-than", "30d", *cache])
    assert done.exit_code == 0, done.output
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in young + quarantined[3:])
    summary, _ = prebuild([get("router"), get("keytable")], SMALL_SPECS, settings_at(warm_cache), jobs=1, timeout=600)
    assert (summary.hits, summary.compiled, summary.failed) == (3, 0, [])  # nothing of value was lost


def test_gc_never_follows_a_symlinked_leftover(warm_cache, tmp_path):
    """A planted symlink among the leftovers is removed as a link; its target is untouched."""
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("precious")
    link = warm_cache / "v1" / "tmp" / "planted"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "keep")
    _age(link, 2 * HOURS)
    report = collect(Store(settings_at(warm_cache)), max_bytes=None, older_than=None)
    assert str(link) in report.leftovers and not os.path.lexists(link)
    assert (outside / "keep" / "file").read_text() == "precious"
