"""A folder on a read-only file system for the tests of what mono-jit does there: a tmpfs filled
by the caller, then remounted read-only (needs root, or CAP_SYS_ADMIN; the test skips saying
why where a mount cannot be made)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@contextlib.contextmanager
def read_only_mount(folder: Path, fill: Callable[[Path], None]) -> Iterator[Path]:
    """`folder` as a tmpfs that `fill` writes into, then read-only until the block ends."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: a read-only file system cannot be made")
    folder.mkdir(parents=True, exist_ok=True)
    made = _mount("-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", str(folder))
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {made.stderr.strip()}")
    try:
        fill(folder)
        frozen = _mount("-o", "remount,ro", str(folder))
        if frozen.returncode != 0:
            pytest.skip(f"cannot remount the tmpfs read-only: {frozen.stderr.strip()}")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
