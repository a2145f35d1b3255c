"""Hit / miss / compile counters of the writable cache, as ccache keeps them (``ccache -s``).

Counters live in ``<writable>/v1/stats/``, safe under any number of concurrent processes:
- a lookup only adds to this process's counts in memory (``count``): the hit path touches no
  file. The process writes them once, at exit (``flush``, run by atexit; ``merge`` flushes
  first, so a process that reads its own counters sees them), as one new file
  ``delta-<pid>-<random>.json`` per writable layer, written under a temporary name and renamed
  into place (a reader never sees half of one; no lock is taken). Deltas are not fsynced:
  counters need no durability, and a delta lost in a crash only undercounts;
- ``merge`` folds the deltas into ``total.json`` under an flock. The new total names the deltas
  it absorbed before they are deleted, so a merge killed between the two steps never counts a
  delta twice (the next merge deletes an absorbed delta without adding it). ``zero`` is a merge
  that drops what it absorbs.
A read-only store (offline lookups, an unwritable HOME) records nothing: offline writes nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mono_jit.record import Record

from .fs import make_dirs, read_regular, write_new

if TYPE_CHECKING:
    from .store import Store

COUNTERS = ("hits", "misses", "compiled", "failed")
STATS_DIR = "stats"
TOTAL_NAME = "total.json"
LOCK_NAME = "merge.lock"
DELTA_PREFIX = "delta-"
TMP_PREFIX = ".tmp-"
FILE_CAP = 1 << 20
_FILE_MODE = 0o600

# This process's counts not yet written, by the v1 folder of their writable layer.
_pending: dict[Path, "Counters"] = {}


class Counters:
    """Counts of cache lookups: hits, misses, and of the misses how many compiled or failed (a
    plain class, mutable: a hit defines it, and a dataclass would cost more than the hit)."""

    __slots__ = COUNTERS

    def __init__(self, hits: int = 0, misses: int = 0, compiled: int = 0, failed: int = 0) -> None:
        self.hits, self.misses, self.compiled, self.failed = hits, misses, compiled, failed

    def __repr__(self) -> str:
        return f"Counters({', '.join(f'{k}={v}' for k, v in self.as_dict().items())})"

    def add(self, other: "Counters") -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def any(self) -> bool:
        return any(getattr(self, name) for name in COUNTERS)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}

    @classmethod
    def parse(cls, data: object) -> "Counters | None":
        """Counters from a parsed file, or None if it is not a map of non-negative integers."""
        if not isinstance(data, dict):
            return None
        values = {name: data.get(name, 0) for name in COUNTERS}
        if not all(type(v) is int and v >= 0 for v in values.values()):
            return None
        return cls(**values)


class Totals(Record):
    """What `mono-jit stats` shows: the merged counters and since when they count."""

    counters: Counters
    since: str | None = None  # ISO time of the last zeroing, None if never zeroed
    absorbed: tuple[str, ...] = ()  # delta names folded in (see the module docstring)


def _folder(base: Path) -> Path:
    return base / STATS_DIR


def _unique() -> str:
    return f"{os.getpid()}-{os.urandom(4).hex()}"


def _write_atomically(folder: Path, name: str, payload: dict, *, durable: bool) -> None:
    """`payload` as the file `name` in `folder`, by a rename; a failed write leaves no temporary file."""
    tmp = folder / f"{TMP_PREFIX}{_unique()}"
    try:
        write_new(tmp, (json.dumps(payload, sort_keys=True) + "\n").encode(), _FILE_MODE, durable=durable)
        os.replace(tmp, folder / name)
    except OSError:
        _unlink(tmp)
        raise


def count(base: Path, counts: Counters) -> None:
    """Add `counts` to this process's counts for the writable layer whose v1 folder is `base`,
    in memory only: they reach the disk at ``flush`` (at the latest, when the process exits)."""
    if not counts.any():
        return
    _pending.setdefault(base, Counters()).add(counts)


def count_in(store: Store, counts: Counters) -> None:
    """``count`` for the writable layer of `store`; a store that writes nothing counts nothing."""
    if store.writable.writable:
        count(store.writable.base, counts)


def flush() -> None:
    """Write this process's pending counts, one delta file per layer, and forget them. A layer
    whose root is gone (a test's temporary folder) or cannot be written loses its counts: a
    counter never fails the process that counts."""
    pending = list(_pending.items())
    _pending.clear()
    for base, counts in pending:
        if base.parent.is_dir():
            try:
                record(base, counts)
            except OSError:
                pass


def record(base: Path, counts: Counters) -> None:
    """Write `counts` now as one delta of the counters of the layer whose v1 folder is `base`
    (not fsynced: see the module docstring)."""
    if not counts.any():
        return
    folder = _folder(base)
    make_dirs(folder)
    _write_atomically(folder, f"{DELTA_PREFIX}{_unique()}.json", counts.as_dict(), durable=False)


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_regular(path, FILE_CAP))
    except (OSError, ValueError, RecursionError):
        return None


def _deltas(folder: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n.startswith(DELTA_PREFIX) and n.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _total(folder: Path) -> Totals:
    data = _read_json(folder / TOTAL_NAME)
    if not isinstance(data, dict):
        return Totals(Counters())
    counters = Counters.parse(data.get("counters")) or Counters()
    since = data.get("since") if isinstance(data.get("since"), str) else None
    absorbed = [n for n in data.get("absorbed", []) if isinstance(n, str)] if isinstance(data.get("absorbed"), list) \
        else []
    return Totals(counters, since, tuple(absorbed))


def read(base: Path) -> Totals:
    """The totals without merging (for a store that may not write): total.json plus the deltas
    it has not absorbed, plus this process's pending counts."""
    folder = _folder(base)
    totals = _total(folder)
    if base in _pending:
        totals.counters.add(_pending[base])
    for name in _deltas(folder):
        if name not in totals.absorbed:
            totals.counters.add(Counters.parse(_read_json(folder / name)) or Counters())
    return totals


def merge(base: Path, *, zero: bool = False) -> Totals:
    """Fold every delta, this process's pending counts first, into total.json (with `zero`,
    drop them and the total) and return the totals; nothing is written when there is no stats
    folder and nothing to zero. The total is fsynced (once per merge, off every lookup's path):
    it stands for the deltas the merge deletes. On a full or read-only disk the totals are merged
    in memory and nothing is written (logged at INFO: `-v`), so a read-only command still works;
    a zeroing then fails with a MonoJitError naming the folder and the fix."""
    flush()
    folder = _folder(base)
    if not folder.is_dir() and not zero:
        return Totals(Counters())
    try:
        return _merge_into_total(folder, zero)
    except OSError as exc:
        from mono_jit.errors import MonoJitError

        from .fs import FULL_DISK, disk_problem

        if zero:
            raise MonoJitError(disk_problem(exc, "cannot zero the counters", folder)) from None
        if exc.errno not in FULL_DISK:
            raise
        import logging

        logging.getLogger(__name__).info("counters merged in memory, not written: %s",
                                         disk_problem(exc, "cannot write them", folder))
        return read(base)


def _merge_into_total(folder: Path, zero: bool) -> Totals:
    """merge's work under the folder's flock: total.json rewritten, absorbed deltas deleted."""
    import fcntl  # only a merge locks

    make_dirs(folder)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                 _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        totals = _total(folder)
        names = _deltas(folder)
        for name in names:
            if name in totals.absorbed:  # a killed merge counted it already
                _unlink(folder / name)
        fresh = [n for n in names if n not in totals.absorbed]
        if zero:
            totals = Totals(Counters(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), tuple(fresh))
        else:
            for name in fresh:
                totals.counters.add(Counters.parse(_read_json(folder / name)) or Counters())
            totals = totals._replace(absorbed=tuple(fresh))
        if fresh or zero or totals.absorbed:
            _write_atomically(folder, TOTAL_NAME, {"counters": totals.counters.as_dict(), "since": totals.since,
                                                   "absorbed": totals.absorbed}, durable=True)
        for name in fresh:
            _unlink(folder / name)
        return totals
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


atexit.register(flush)
# A forked child starts with nothing pending: its parent writes the counts it inherited.
os.register_at_fork(after_in_child=_pending.clear)
