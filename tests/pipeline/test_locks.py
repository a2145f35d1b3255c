"""The compile locks under attack and faults: planted symlinks, shared or foreign lock folders,
odd umasks, killed holders, and two prebuilds taking keys in opposite orders."""

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Store
from mono_jit.cache.lock import single_flight
from mono_jit.cli import main
from mono_jit.errors import LockTimeout, MonoJitError

KEY = "ab" * 32
TESTS = Path(__file__).resolve().parent


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)
    return path


@pytest.mark.parametrize("planted", ["owner", "lock"])
def test_a_symlink_planted_in_the_lock_folder_is_never_written_through(tmp_path, planted):
    locks = private_dir(tmp_path / "locks")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (locks / f"{KEY}.{planted}").symlink_to(victim)
    try:
        with single_flight(locks, KEY, 5, "router(max_tokens=1)"):
            pass
    except MonoJitError as exc:  # a symlinked lock file is refused, in one line naming it
        assert planted == "lock" and "symlink" in str(exc) and f"{KEY}.lock" in str(exc)
        assert "\n" not in str(exc)
    else:
        assert planted == "owner"  # no second file is written beside the lock
    assert victim.read_text() == "precious\n"


def test_a_lock_folder_others_can_write_is_refused_in_one_line(tmp_path, monkeypatch):
    shared = tmp_path / "locks"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("MONO_JIT_LOCK_DIR", str(shared))
    result = CliRunner().invoke(main, ["prebuild", "--template", "router", "--ratio", "4", "--max-tokens", "1",
                                       "--jobs", "1", "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("mono-jit: error:")]
    assert len(errors) == 1 and "lock folder" in errors[0] and "world-writable" in errors[0], result.output
    assert "Traceback" not in result.output and not list((tmp_path / "cache").rglob("*.hsaco"))
    with pytest.raises(MonoJitError, match="world-writable"):  # resolve()'s path refuses it too
        with single_flight(shared, KEY, 5, "t"):
            pass
    with single_flight(shared, KEY, 5, "t", allow_shared=True):  # unless explicitly allowed
        pass
    foreign = private_dir(tmp_path / "foreign")
    os.chown(foreign, 54321, 54321)  # another user's folder (the tests run as root)
    with pytest.raises(MonoJitError, match="owned by uid 54321"):
        with single_flight(foreign, KEY, 5, "t"):
            pass


@pytest.mark.parametrize("umask", [0o002, 0o000])
def test_lock_folder_levels_are_private_whatever_the_umask(tmp_path, umask):
    settings = settings_at(tmp_path / "cache")
    old = os.umask(umask)
    try:
        Store(settings)
        with single_flight(settings.locks(), KEY, 5, "t"):
            pass
        Store(settings)  # the second run must accept what the first one created
    finally:
        os.umask(old)
    for level in (tmp_path / "cache" / "v1", settings.locks()):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level


HOLD = """
import sys, time
from pathlib import Path
from mono_jit.cache.lock import single_flight
with single_flight(Path(sys.argv[1]), sys.argv[2], 5, "router(max_tokens=1)"):
    print("LOCKED", flush=True)
    time.sleep(60)
"""


def test_a_killed_holder_is_never_named_as_the_holder(tmp_path):
    locks = private_dir(tmp_path / "locks")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(locks), KEY], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "LOCKED"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # Another process holds the lock now and has not said who it is yet.
    fd = os.open(locks / f"{KEY}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout) as info:
            with single_flight(locks, KEY, 0.3, "router(max_tokens=1)"):
                pass
    finally:
        os.close(fd)
    text = str(info.value)
    assert f"pid {holder.pid} " not in text and "unknown" in text, text
    with single_flight(locks, KEY, 5, "router(max_tokens=1)"):  # the kernel dropped the dead one's lock
        pass


def test_the_live_holder_is_named(tmp_path):
    locks = private_dir(tmp_path / "locks")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(locks), KEY], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        with pytest.raises(LockTimeout, match=f"held by pid {holder.pid} on "):
            with single_flight(locks, KEY, 0.3, "router(max_tokens=1)"):
                pass
    finally:
        holder.kill()
        holder.wait()


# One prebuild of keytable at two buckets. Once it holds the lock of its first key it waits (up
# to 15 s) until the other prebuild holds its own first key, so the two always reach the point
# where, at df4a61d, each waited for the other's lock until MONO_JIT_LOCK_TIMEOUT.
RACER = """
import json, sys, time
from pathlib import Path
from mono_jit.cache import Store
from mono_jit.config import Settings
from mono_jit.pipeline.prebuild import prebuild
from mono_jit.spec import Spec
from mono_jit.templates import get

mine, other = Path(sys.argv[1]), Path(sys.argv[2])
buckets = [int(b) for b in sys.argv[3].split(",")]
lookups = {}
real_lookup = Store.lookup

def lookup(self, key, arch):
    lookups[key] = lookups.get(key, 0) + 1
    if lookups[key] == 2 and not mine.exists():  # the re-check under this run's first lock
        mine.touch()
        deadline = time.monotonic() + 15
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return real_lookup(self, key, arch)

Store.lookup = lookup
started = time.monotonic()
summary, _ = prebuild([get("keytable")], [Spec(8, 4, 1024, m) for m in buckets], Settings(), jobs=2, timeout=300)
print(json.dumps({"compiled": summary.compiled, "hits": summary.hits, "failed": summary.failed,
                  "seconds": time.monotonic() - started}))
"""


@pytest.mark.slow
def test_two_prebuilds_in_opposite_orders_do_not_deadlock(tmp_path):
    env = {**os.environ, "MONO_JIT_CACHE_DIR": str(tmp_path / "cache"), "MONO_JIT_LOCK_TIMEOUT": "40"}
    a, b = tmp_path / "a-holds", tmp_path / "b-holds"
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(mine), str(other), order], env=env,
                              stdout=subprocess.PIPE, text=True)
             for mine, other, order in ((a, b, "1,2"), (b, a, "2,1"))]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    elapsed = time.monotonic() - started
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    assert all(not r["failed"] for r in results), results
    assert sorted((r["compiled"], r["hits"]) for r in results) == [(1, 1), (1, 1)], results
    assert elapsed < 35, f"{elapsed:.1f} s: the prebuilds waited for each other"
    assert all(p.returncode == 0 for p in procs)
