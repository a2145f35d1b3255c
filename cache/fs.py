"""Filesystem primitives the cache trusts: folders made with explicit modes whatever the umask,
files read only when they are regular files under a size cap and never through a symlink, new
files created exclusively. Every level of the cache goes through these, so a planted symlink, a
FIFO, a link to /dev/zero or a umask of 000 / 002 cannot change what the cache reads or writes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Iterable

DIR_MODE = 0o700  # private levels: the writable root and everything under it
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(OSError):
    """A path the cache refuses to read: a symlink, not a regular file, or over its size cap."""


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """Create `path` and its missing parents, each missing level with exactly `mode` (chmod after
    mkdir: mkdir's mode is reduced by the umask). Existing levels are left as they are."""
    missing = []
    level = path
    while not level.exists():
        missing.append(level)
        if level.parent == level:
            break
        level = level.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            continue  # a racing process made it; its mode is its maker's business
        os.chmod(folder, mode)


def read_regular(path: Path, cap: int) -> bytes:
    """The bytes of `path` if it is a regular file (not a symlink, FIFO or device) of at most
    `cap` bytes; UnsafeFile otherwise, OSError when it cannot be opened."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", 40):
            raise UnsafeFile(f"{path} is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > cap:
            raise UnsafeFile(f"{path} is {st.st_size} bytes, over the cap of {cap}")
        chunks, left = [], st.st_size + 1  # one byte more, so a file that grew is caught
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > cap:
            raise UnsafeFile(f"{path} grew past the cap of {cap} bytes while read")
        return data
    finally:
        os.close(fd)


def write_new(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Create `path` exclusively (never through a symlink, never over an existing file) with
    exactly `mode`, write `data` and (when `durable`) fsync it."""
    fd = os.open(path, _NEW_FLAGS, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_new_stream(path: Path, chunks: Iterable[bytes], mode: int = 0o600) -> int:
    """write_new for data that arrives in chunks, so it is never all in memory; returns the
    number of bytes written."""
    fd = os.open(path, _NEW_FLAGS, mode)
    written = 0
    try:
        os.fchmod(fd, mode)
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            written += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


CACHE_ELSEWHERE = "point MONO_JIT_CACHE_DIR at another disk"
_DISK_ADVICE = {
    errno.ENOSPC: "the disk is full: free space there, or {elsewhere}",
    errno.EDQUOT: "the disk quota is used up: free space there, or {elsewhere}",
    errno.EROFS: ("the file system is read-only: point MONO_JIT_CACHE_DIR at a writable folder "
                  "(a read-only copy is served through MONO_JIT_CACHE_PATH)"),
    errno.ENOTDIR: "a part of that path is a file, not a folder: move it away",
    errno.EEXIST: "something else is in the way at that path: move it away",
    errno.EACCES: "no permission there: fix its owner or mode, or point MONO_JIT_CACHE_DIR elsewhere",
    errno.EPERM: "no permission there: fix its owner or mode, or point MONO_JIT_CACHE_DIR elsewhere",
}
FULL_DISK = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})  # every further write fails too


def disk_problem(exc: OSError, doing: str, where: Path, elsewhere: str = CACHE_ELSEWHERE) -> str:
    """One line for a failed cache write: what was being done, on which path (`where`, the folder
    written to, when the error names none: a failed write or fsync does not), the system's error
    and what to do about it (never a traceback); `elsewhere`: where else to write, when the disk
    is full (default: another cache folder)."""
    path = exc.filename if exc.filename is not None else where
    if exc.filename2 is not None:  # a rename: both ends
        path = f"{path} -> {exc.filename2}"
    reason = exc.strerror or str(exc) or type(exc).__name__
    advice = _DISK_ADVICE.get(exc.errno or 0, "check that path and the disk").format(elsewhere=elsewhere)
    return f"{doing}: {path}: {reason}; {advice}"


def remove(path: Path) -> None:
    """Delete a folder tree, or the file or link in a folder's place, never following a link
    (rmtree does not follow links inside the tree); nothing when it is already gone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        import shutil  # only a removal needs it (the hit path imports fs)

        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)

