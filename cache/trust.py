"""Which cache roots may serve code: entries are executable GPU code, so a root that others can
write to (group/world-writable, or owned by another non-root user) is refused unless the user
explicitly allows shared roots (MONO_JIT_ALLOW_SHARED_ROOTS=1)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mono_jit.errors import UntrustedRoot


def check_root(path: Path, allow_shared: bool) -> None:
    """Raise UntrustedRoot if `path` (and its v1 folder, if any) could be written by others."""
    if allow_shared:
        return
    for folder in (path, path / "v1"):
        try:
            st = folder.stat()
        except FileNotFoundError:
            continue
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UntrustedRoot(
                f"cache root {folder} is group/world-writable (mode {stat.S_IMODE(st.st_mode):o}); "
                "chmod go-w it, or set MONO_JIT_ALLOW_SHARED_ROOTS=1 to accept it"
            )
        if st.st_uid not in (0, os.getuid()):
            raise UntrustedRoot(
                f"cache root {folder} is owned by uid {st.st_uid}, not by you ({os.getuid()}) or root; "
                "set MONO_JIT_ALLOW_SHARED_ROOTS=1 to accept it"
            )


def make_private_root(path: Path) -> None:
    """Create the writable root 0700 (parents with the default mode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
