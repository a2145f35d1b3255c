"""Single flight across processes: one compile per key however many processes want it.

Each key has a lock file ``<lock folder>/<key>.lock`` taken with flock: the kernel drops the lock
when its holder dies, so no lock outlives its holder. The folder is created 0700 at every missing
level and trust-checked like a cache root (whoever can write it can plant symlinks there or hold
every lock forever); lock files are opened without following symlinks and must be regular files;
the holder writes who it is inside the locked file itself, so there is no second file to plant a
symlink at. Waiters log the holder every 10 s, name it only while that process is alive (else it
is unknown) and give up after a bounded time with an error naming the lock. Callers check the
store, take the lock, then check again before compiling; a caller holding one lock never waits
for another (``KeyLock.try_acquire``), so two processes can never wait for each other.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mono_jit.errors import LockTimeout, MonoJitError, UntrustedRoot

from .fs import make_dirs
from .trust import refusal

LOG_EVERY = 10.0
POLL_EVERY = 0.05
IDENTITY_CAP = 1024  # bytes of the holder's identity line read back
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_log = logging.getLogger(__name__)


def check_lock_dir(folder: Path, allow_shared: bool) -> None:
    """The trust rule of cache levels (trust.refusal), for the lock folder: one others can write to
    (group / world-writable, or owned by another non-root user) is refused unless shared roots are
    allowed."""
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise MonoJitError(f"lock folder {folder} is not a folder; move it away or set MONO_JIT_LOCK_DIR elsewhere")
    reason = refusal(folder, st, allow_shared)
    if reason is not None:
        raise UntrustedRoot(f"lock folder refused: {reason}")


def prepare_lock_dir(folder: Path, allow_shared: bool) -> Path:
    """`folder`, created 0700 at every missing level whatever the umask, once it passes the trust check."""
    make_dirs(folder)
    check_lock_dir(folder, allow_shared)
    return folder


def _open_lock_file(path: Path) -> int:
    """A descriptor of the lock file, never through a symlink and only if it is a regular file
    with one link (so it cannot be another file of the system under a second name)."""
    try:
        fd = os.open(path, _OPEN_FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise MonoJitError(f"lock file {path} is a symlink, refused; remove it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise MonoJitError(f"lock file {path} is not a plain file ({stat.filemode(st.st_mode)}, "
                           f"{st.st_nlink} links), refused; remove it")
    return fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


def describe_holder(identity: str, host: str) -> str:
    """Who holds a lock, from the identity line in its file: that line while its process is alive
    on this host, else "an unknown process" (a killed holder's line outlives it)."""
    words = identity.split()
    if len(words) >= 4 and words[0] == "pid" and words[1].isdigit() and words[2] == "on":
        if words[3] != host:
            return f"{identity} (on another host: not checked)"
        if _alive(int(words[1])):
            return identity
    return "an unknown process"


class KeyLock:
    """The lock of one key in a prepared lock folder (prepare_lock_dir)."""

    def __init__(self, folder: Path, key: str, what: str) -> None:
        self.path = folder / f"{key}.lock"
        self.what = what  # the build, for messages
        self._fd: int | None = _open_lock_file(self.path)
        self._held = False

    def try_acquire(self) -> bool:
        """Take the lock if it is free, without waiting; True when taken."""
        try:
            fcntl.flock(self._descriptor(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._held = True
        self._record()
        return True

    def acquire(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the lock, logging the holder every LOG_EVERY seconds."""
        started = time.monotonic()
        next_log = started + LOG_EVERY
        while not self.try_acquire():
            now = time.monotonic()
            if now - started >= timeout:
                holder = self.holder()
                self.close()
                raise LockTimeout(
                    f"gave up after {timeout:g} s waiting for {self.path}, held by {holder} "
                    f"(compiling {self.what}); raise MONO_JIT_LOCK_TIMEOUT or check that process"
                )
            if now >= next_log:
                _log.warning("waiting for %s to finish compiling %s (lock %s)", self.holder(), self.what, self.path)
                next_log = now + LOG_EVERY
            time.sleep(POLL_EVERY)

    def holder(self) -> str:
        """The live holder's identity, or "an unknown process"."""
        try:
            raw = os.pread(self._descriptor(), IDENTITY_CAP, 0)
        except OSError:
            raw = b""
        return describe_holder(raw.decode("utf-8", "replace").strip(), socket.gethostname())

    def close(self) -> None:
        """Release the lock if held (clearing the identity first) and close the file."""
        if self._fd is None:
            return
        if self._held:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass  # a stale identity is only a hint: describe_holder checks the process is alive
        os.close(self._fd)  # closing the last descriptor drops the flock
        self._fd, self._held = None, False

    def _descriptor(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: lock already closed")
        return self._fd

    def _record(self) -> None:
        """Write who holds the lock into the locked file (a hint for waiters: never fatal)."""
        line = (f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}: "
                f"{self.what}\n").encode()
        try:
            os.ftruncate(self._descriptor(), 0)
            os.pwrite(self._descriptor(), line, 0)
        except OSError:
            pass


@contextmanager
def single_flight(lock_dir: Path, key: str, timeout: float, what: str,
                  allow_shared: bool = False) -> Iterator[None]:
    """Hold the lock of `key` for the body; `what` names the build in messages."""
    lock = KeyLock(prepare_lock_dir(lock_dir, allow_shared), key, what)
    try:
        lock.acquire(timeout)
        yield
    finally:
        lock.close()
