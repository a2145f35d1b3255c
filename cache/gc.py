"""Eviction from the writable layer by the last-used stamp: by age, then down to a size cap.
Read-only layers are never touched. Leftovers of killed or failed runs are cleared too: temp
folders (``v1/tmp/*``), toolchain staging (``v1/toolchain/.tmp-*``), temp files of the probe memo,
of toolchain records and of the counters (``v1/stats/.tmp-*``), and quarantined entries beyond the newest few (kept for diagnosis)."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from .fs import remove
from .store import Entry, Store, last_used

LEFTOVER_SECONDS = 3600.0  # nothing the cache writes stays a temp file or folder this long
QUARANTINE_KEEP = 5  # the newest quarantined entries stay, whatever their age


@dataclass
class GcReport:
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    leftovers: list[str] = field(default_factory=list)  # paths of leftovers removed (or, dry, to remove)
    leftover_bytes: int = 0

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def collect(store: Store, *, max_bytes: int | None, older_than: float | None, dry_run: bool = False) -> GcReport:
    """Remove writable entries unused for `older_than` seconds, then the least recently used
    until the layer holds at most `max_bytes`; then the leftovers (see the module docstring)."""
    now = time.time()
    entries = [e for e in store.entries() if isinstance(e, Entry) and e.layer.writable]
    entries.sort(key=lambda e: last_used(e.path))
    sizes = {e.key: e.size for e in entries}
    total = sum(sizes.values())
    report = GcReport()
    for entry in entries:
        too_old = older_than is not None and now - last_used(entry.path) > older_than
        too_big = max_bytes is not None and total > max_bytes
        if too_old or too_big:
            if not dry_run:
                store.remove(entry.path)
            report.removed.append(entry.key)
            report.freed_bytes += sizes[entry.key]
            total -= sizes[entry.key]
        else:
            report.kept += 1
            report.kept_bytes += sizes[entry.key]
    for path in leftovers(store.writable.base, now):
        report.leftovers.append(str(path))
        report.leftover_bytes += _tree_bytes(path)
        if not dry_run:
            remove(path)
    return report


def leftovers(base: Path, now: float) -> list[Path]:
    """What killed or failed runs left under the writable `base` (<root>/v1) more than
    LEFTOVER_SECONDS ago, and quarantined entries beyond the newest QUARANTINE_KEEP."""
    found = [*_listed(base / "tmp", "*"), *_listed(base / "toolchain", ".tmp-*"),
             *_listed(base / "toolchain", ".probes.json.*"), *_listed(base / "stats", ".tmp-*")]
    for records in sorted(base.glob("gfx*/toolchains")):
        found += _listed(records, ".*.json.*")
    stale = [p for p in found if now - _newest_mtime(p) > LEFTOVER_SECONDS]
    quarantined = sorted(_listed(base / "quarantine", "*"), key=_newest_mtime, reverse=True)
    stale += [p for p in quarantined[QUARANTINE_KEEP:] if now - _newest_mtime(p) > LEFTOVER_SECONDS]
    return stale


def _listed(folder: Path, pattern: str) -> list[Path]:
    """Children of `folder` matching `pattern`, if `folder` is a real folder (not a symlink)."""
    if folder.is_symlink() or not folder.is_dir():
        return []
    return sorted(folder.glob(pattern))


def _newest_mtime(path: Path) -> float:
    """The newest mtime in the tree at `path` (never following a symlink): a run still writing
    into an old folder keeps it young."""
    try:
        newest = path.lstat().st_mtime
    except OSError:
        return time.time()  # vanished or unreadable: not ours to judge now
    if path.is_symlink() or not path.is_dir():
        return newest
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            except OSError:
                continue
    return newest


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files in the tree at `path` (never following a symlink)."""
    if path.is_symlink() or not path.is_dir():
        return _file_bytes(path)
    return sum(_file_bytes(Path(folder) / name) for folder, _, files in os.walk(path) for name in files)


def _file_bytes(path: Path) -> int:
    try:
        st = path.lstat()
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


