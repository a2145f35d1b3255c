"""A build's bytes depend on its inputs only (issue 35 item 3). FlyDSL's LLVM orders some
operands by memory address, so compile workers run without address-space randomisation, with
one hash seed, and each job in a fresh fork of a loaded worker (pipeline/repeatable.py): the same
job starts from the same memory in every worker, whatever ran there before."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cache_settings import settings_at
from heap_probe import address_after_leak
from mono_jit import api
from mono_jit.pipeline.miss import compile_pool
from mono_jit.pipeline.repeatable import ADDR_NO_RANDOMIZE
from mono_jit.pipeline.toolchain import resolve_toolchain
from mono_jit.pipeline.workers import WorkerPool

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="personality(2) is Linux's")


def _run(pool: WorkerPool, jobs: list[tuple]) -> dict:
    return {o.job_id: o for o in pool.run(jobs)}


@linux_only
def test_a_compile_worker_runs_without_address_randomisation_and_with_one_hash_seed():
    with WorkerPool(1, dict(os.environ), Path.read_text, 30) as pool:
        persona = _run(pool, [(0, (Path("/proc/self/personality"),))])[0].value
    with WorkerPool(1, {**os.environ, "PYTHONHASHSEED": "random"}, os.getenv, 30) as pool:
        seed = _run(pool, [(0, ("PYTHONHASHSEED",))])[0].value
    assert int(persona, 16) & ADDR_NO_RANDOMIZE
    assert seed == "0"


@linux_only
def test_a_job_starts_from_the_same_heap_whatever_ran_before_and_in_every_worker():
    """Before: one process ran every job, so each job's blocks landed past the previous job's,
    and each worker's heap started at a random address."""
    addresses = []
    for _ in range(2):
        with WorkerPool(1, dict(os.environ), address_after_leak, 30) as pool:
            outcomes = _run(pool, [(n, (1 << 16,)) for n in range(3)])
        addresses += [outcomes[n].value for n in range(3)]
    assert len(set(addresses)) == 1, addresses


@linux_only
def test_a_job_starts_from_the_same_heap_whatever_its_caller_imports_from(tmp_path, monkeypatch):
    """The worker imports through the caller's sys.path, so a crowded folder first on it changes
    what the worker's main heap holds (before the job thread: a script in /tmp built another K2)."""
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for n in range(3000):
        (crowded / f"module_{n}.txt").touch()
    addresses = []
    for prepend in (False, True):
        with monkeypatch.context() as patch:
            if prepend:
                patch.syspath_prepend(str(crowded))
            with WorkerPool(1, dict(os.environ), address_after_leak, 30) as pool:
                addresses.append(_run(pool, [(0, (1 << 16,))])[0].value)
    assert addresses[0] == addresses[1], addresses


def test_a_job_that_crashes_its_child_fails_as_a_crash_and_the_next_job_runs():
    with WorkerPool(1, dict(os.environ), os.abort, 30) as pool:
        crashed = _run(pool, [(0, ())])[0]
    with WorkerPool(1, dict(os.environ), os.getpid, 30) as pool:
        pids = _run(pool, [(n, ()) for n in range(2)])
    assert (crashed.status, crashed.value) == ("crash", f"the compile worker died (exit code {-signal.SIGABRT})")
    assert pids[0].status == pids[1].status == "ok" and pids[0].value != pids[1].value  # a child per job


def test_a_job_past_its_timeout_is_killed_with_its_worker_and_the_next_job_runs():
    started = time.monotonic()
    with WorkerPool(1, dict(os.environ), time.sleep, 1) as pool:
        outcomes = _run(pool, [(0, (60,)), (1, (0,))])
        workers = [w.process.pid for w in pool._workers]
    assert (outcomes[0].status, outcomes[1].status) == ("timeout", "ok")
    assert time.monotonic() - started < 30
    for pid in workers:  # no sleeping job child outlives its worker
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


# What the issue saw flip: before, about one fresh worker in six built another code object, and
# `verify --rebuild` failed about half the time. CI prebuilds it, verifies it with a rebuild and
# rebuilds it in one more fresh worker (three compiles, about 35 s of CPU); REPEATABLE_REBUILDS=10
# rebuilds it in the ten fresh workers at once (about 70 s on 2 cores).
FLIPPED = {"arch": "gfx950", "max_tokens": 64, "ratio": 128, "topk_width": 8192, "tp": 8}


@pytest.mark.slow
def test_k2_at_64_rows_ratio_128_prebuilt_then_rebuilt_in_fresh_workers_gives_one_sha256(tmp_path):
    settings = settings_at(tmp_path / "cache")
    built = api.prebuild(["k2"], max_tokens=[64], ratios=[128], jobs=1, settings=settings)
    checked = api.verify(rebuild=True, jobs=1, settings=settings)
    count = int(os.environ.get("REPEATABLE_REBUILDS", "1"))
    with compile_pool(resolve_toolchain(settings), "gfx950", count, 900) as pool:
        outcomes = _run(pool, [(n, ("k2", FLIPPED)) for n in range(count)])
        workers = len(pool._workers)
    assert built.compiled == 1 and built.ok, built.failures
    assert checked.bad == 0 and [row["identical"] for row in checked.rows] == [True], checked.rows
    assert workers == count and all(o.status == "ok" for o in outcomes.values()), [o.value for o in outcomes.values()]
    entry = checked.rows[0]["rebuilt_sha256"]
    assert {hashlib.sha256(o.value["hsaco"]).hexdigest() for o in outcomes.values()} == {entry}
