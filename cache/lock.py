"""Single flight across processes: one compile per key however many processes want it.

A per-key ``filelock`` on local storage (flock: the kernel drops it when its holder dies, so no
stale locks). The holder writes who it is beside the lock; waiters log that every 10 s and give
up after a bounded time with an error naming the lock and its holder. Callers check the store,
take the lock, then check again before compiling.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from mono_jit.errors import LockTimeout

LOG_EVERY = 10.0
_log = logging.getLogger(__name__)


def _holder(owner: Path) -> str:
    try:
        return owner.read_text().strip() or "an unknown process"
    except OSError:
        return "an unknown process"


@contextmanager
def single_flight(lock_dir: Path, key: str, timeout: float, what: str) -> Iterator[None]:
    """Hold the lock of `key` for the body; `what` names the build in messages."""
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = lock_dir / f"{key}.lock"
    owner = lock_dir / f"{key}.owner"
    lock = FileLock(str(path))
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            lock.acquire(timeout=max(0.0, min(LOG_EVERY, remaining)))
            break
        except Timeout:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"gave up after {timeout:g} s waiting for {path}, held by {_holder(owner)} "
                    f"(compiling {what}); raise MONO_JIT_LOCK_TIMEOUT or check that process"
                ) from None
            _log.warning("waiting for %s to finish compiling %s (lock %s)", _holder(owner), what, path)
    try:
        owner.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}: {what}\n")
        yield
    finally:
        try:
            owner.unlink()
        except OSError:
            pass
        lock.release()
