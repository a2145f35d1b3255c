"""numba's `njit` with its on-disk cache in a folder named by a digest of the emulator's sources.

numba's `cache=True` reuses a function's machine code while the function's own file keeps its
modification time and size, but the module globals the code reads (field numbers and flags from
`decode`, operation ids from `ops`, helpers from `numerics`, layouts from `state`) are compiled in
as constants. An edit to one of those files alone would run stale machine code with no error.
Every interpreter function is therefore defined through `njit` below: while it is defined,
numba's user cache folder (`numba.config.CACHE_DIR`, read by numba's locator when the function
is created) points at `<base>/mono-jit-emulator-<digest>`, where the digest covers every `.py`
file of this package. Any edit there moves the whole interpreter to a fresh folder.

The base is the `NUMBA_CACHE_DIR` the user set, else this package's `__pycache__` when it is
writable, else numba's per-user cache folder. Folders of earlier sources are left in place for
the user to delete.
"""

from __future__ import annotations

import hashlib
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numba
from numba.misc.appdirs import AppDirs

PACKAGE = Path(__file__).resolve().parent


def sources_digest(package: Path = PACKAGE) -> str:
    """sha256 over the paths and bytes of the package's `.py` files, its subpackages' (the
    clock's) included (16 hex digits)."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def _base() -> Path:
    """Where the keyed folders live: NUMBA_CACHE_DIR, the package's __pycache__, or the user's."""
    if numba.config.CACHE_DIR:
        return Path(numba.config.CACHE_DIR)
    in_tree = PACKAGE / "__pycache__"
    if _writable(in_tree):
        return in_tree
    return Path(AppDirs(appname="numba", appauthor=False).user_cache_dir)


CACHE_DIR = _base() / f"mono-jit-emulator-{sources_digest()}"


@contextmanager
def _numba_cache_dir(folder: Path) -> Iterator[None]:
    """numba's user cache folder set to `folder` for the functions defined inside, then restored
    (so other libraries' numba functions in the process keep their own)."""
    before = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(folder)
    try:
        yield
    finally:
        numba.config.CACHE_DIR = before


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit(**options)` whose cache (with `cache=True`) lives in CACHE_DIR."""
    def define(function: Callable[..., Any]) -> Any:
        with _numba_cache_dir(CACHE_DIR):
            return numba.njit(**options)(function)
    return define
