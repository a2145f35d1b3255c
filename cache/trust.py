"""Which cache paths may serve code: entries are executable GPU code, so every level from a root
to an entry's files is checked. Below the root nothing may be a symlink; no level may be
group/world-writable or owned by another non-root user, unless the user explicitly allows shared
roots (MONO_JIT_ALLOW_SHARED_ROOTS=1). The root itself may be a symlink (the user named it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mono_jit.errors import UntrustedRoot

from .fs import make_dirs

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def refusal(path: Path, st: os.stat_result, allow_shared: bool) -> str | None:
    """Why the cache level `path` (lstat'ed as `st`) may not serve code, or None if it may."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink (the cache refuses links below its root)"
    if allow_shared:
        return None
    if st.st_mode & _OTHERS_WRITE:
        return (f"{path} is group/world-writable (mode {stat.S_IMODE(st.st_mode):o}); chmod go-w it, "
                "or set MONO_JIT_ALLOW_SHARED_ROOTS=1 to accept it")
    if st.st_uid not in (0, os.getuid()):
        return (f"{path} is owned by uid {st.st_uid}, not by you ({os.getuid()}) or root; "
                "set MONO_JIT_ALLOW_SHARED_ROOTS=1 to accept it")
    return None


def examine(path: Path, allow_shared: bool, folder: bool = False) -> tuple[bool, str | None]:
    """(whether the cache level `path` exists, why it may not serve code or None), from one
    lstat; with `folder`, it must be a real folder."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False, None
    except OSError as exc:
        return True, f"{path} cannot be examined: {exc.strerror or exc}"
    reason = refusal(path, st, allow_shared)
    if reason is None and folder and not stat.S_ISDIR(st.st_mode):
        reason = f"{path} is not a folder"
    return True, reason


def check_root(path: Path, allow_shared: bool) -> None:
    """Raise UntrustedRoot if the root `path` (followed) or its v1 folder (never a link) could
    be written by others."""
    reason = refusal(path, path.stat(), allow_shared) or examine(path / "v1", allow_shared, folder=True)[1]
    if reason is not None:
        raise UntrustedRoot(f"cache root refused: {reason}")


def make_private_root(path: Path) -> None:
    """Create the writable root (and any missing parent) 0700 whatever the umask."""
    make_dirs(path)
