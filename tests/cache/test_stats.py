"""Hit / miss / compile counters (as ccache's `-s`): counted by resolve and
prebuild, exact under concurrent writers and mergers, never counted twice after a killed merge,
reset by `stats --zero`, not written by an offline store; `list` and `stats` show them with the
total size. A lookup counts in memory only: no file and no fsync on the hit path, one delta per
process at its exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cache_settings import SMALL_SPECS, settings_at
from mono_jit.cache import Entry, Store, stats
from mono_jit.cache.stats import Counters
from mono_jit.cli import main
from mono_jit.errors import OfflineMiss
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec


def cli(root, *args, code=0):
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(root)])
    assert result.exit_code == code, result.output
    return result


def counters(root) -> dict:
    return json.loads(cli(root, "stats", "--json").stdout)["counters"]


def test_resolve_counts_hits_and_misses_and_stats_zero_resets(warm_cache):
    settings = settings_at(warm_cache)
    resolve("router", Spec(8, 4, 1024, 1), settings=settings)
    resolve("keytable", Spec(8, 4, 1024, 1), settings=settings)
    assert counters(warm_cache) == {"hits": 2, "misses": 0, "compiled": 0, "failed": 0}
    with pytest.raises(OfflineMiss):  # offline writes nothing, counters included
        resolve("router", Spec(8, 4, 1024, 2), settings=settings_at(warm_cache, MONO_JIT_OFFLINE="1"))
    assert counters(warm_cache)["misses"] == 0
    zeroed = json.loads(cli(warm_cache, "stats", "--zero", "--json").stdout)
    assert zeroed["counters"] == {"hits": 0, "misses": 0, "compiled": 0, "failed": 0} and zeroed["since"]
    assert zeroed["schema"] == "mono-jit-stats/1" and zeroed["entries"] == 3


def test_prebuild_counts_and_list_shows_counters_and_total_size(warm_cache):
    cli(warm_cache, "prebuild", "--template", "router,keytable", "--max-tokens", "1")
    listed = json.loads(cli(warm_cache, "list", "--json").stdout)
    assert listed["counters"] == {"hits": 3, "misses": 0, "compiled": 0, "failed": 0}
    sizes = sum(e.size for e in Store(settings_at(warm_cache)).entries() if isinstance(e, Entry))
    assert listed["total_bytes"] == sizes == sum(row["disk_bytes"] for row in listed["entries"])
    text = cli(warm_cache, "list").stdout
    assert text.splitlines()[-1].startswith("3 entries; ") and "3 hits, 0 misses, 0 compiled" in text, text
    shown = cli(warm_cache, "stats").stdout
    assert "lookups      3 (100.0% hits)" in shown and "entries      3 (" in shown, shown


def test_a_hit_writes_no_file_and_the_process_writes_its_counts_once_unsynced(warm_cache, monkeypatch):
    settings = settings_at(warm_cache)
    resolve("router", Spec(8, 4, 1024, 1), settings=settings)  # the root's folders exist from here on
    stats.merge(warm_cache / "v1")
    created, synced = [], []
    real_open = os.open

    def watched_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            created.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watched_open)
    monkeypatch.setattr(os, "fsync", synced.append)
    for spec in (*SMALL_SPECS, *SMALL_SPECS):
        resolve("router", spec, settings=settings)
    assert created == [] and synced == []  # four hits: no file made, nothing synced
    stats.flush()  # what atexit runs
    deltas = list((warm_cache / "v1" / "stats").glob("delta-*"))
    assert len(deltas) == 1 and synced == [], (deltas, synced)
    assert json.loads(deltas[0].read_text())["hits"] == 4
    stats.flush()  # nothing left to write
    assert len(list((warm_cache / "v1" / "stats").glob("delta-*"))) == 1


LOOKUPS = """
import sys
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
for _ in range(int(sys.argv[1])):
    for ratio, width in ((4, 1024), (128, 8192)):
        resolve("router", Spec(8, ratio, width, 1))
"""


def test_concurrent_processes_each_write_one_delta_at_exit_and_lose_no_count(warm_cache):
    stats.merge(warm_cache / "v1", zero=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env["MONO_JIT_CACHE_DIR"] = str(warm_cache)
    procs = [subprocess.Popen([sys.executable, "-c", LOOKUPS, "25"], env=env) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert len(list((warm_cache / "v1" / "stats").glob("delta-*"))) == 4  # one per process
    assert counters(warm_cache) == {"hits": 200, "misses": 0, "compiled": 0, "failed": 0}


WRITER = """
import sys
from pathlib import Path
from mono_jit.cache.stats import Counters, merge, record
base, rounds = Path(sys.argv[1]), int(sys.argv[2])
for i in range(rounds):
    record(base, Counters(hits=1, misses=2, compiled=1))
    if i % 7 == 0:
        merge(base)
"""


def test_concurrent_writers_and_mergers_lose_and_double_nothing(tmp_path):
    base = tmp_path / "v1"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(base), "60"]) for _ in range(6)]
    assert [w.wait(timeout=120) for w in writers] == [0] * 6
    total = stats.merge(base).counters
    assert total.as_dict() == {"hits": 360, "misses": 720, "compiled": 360, "failed": 0}
    assert [n for n in os.listdir(base / "stats") if n.startswith("delta-")] == []


def test_a_merge_killed_after_writing_the_total_counts_nothing_twice(tmp_path, monkeypatch):
    base = tmp_path / "v1"
    for _ in range(3):
        stats.record(base, Counters(hits=1))

    def killed(path):
        raise KeyboardInterrupt  # the process dies between the total's rename and the deletes

    with monkeypatch.context() as patch:
        patch.setattr(stats, "_unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            stats.merge(base)
    assert stats.read(base).counters.hits == 3  # the absorbed deltas are not added again
    stats.record(base, Counters(hits=1))
    assert stats.merge(base).counters.hits == 4
    assert stats.merge(base).counters.hits == 4


def test_malformed_counter_files_are_skipped_not_fatal(tmp_path):
    base = tmp_path / "v1"
    stats.record(base, Counters(hits=2))
    (base / "stats" / "delta-bad.json").write_text('{"hits": -5}')
    (base / "stats" / "delta-worse.json").write_text("not json")
    assert stats.merge(base).counters.hits == 2
