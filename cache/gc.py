"""Eviction from the writable layer by the last-used stamp: by age, then down to a size cap.
Read-only layers are never touched. Stale temp folders of crashed writers are cleared too."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .store import Entry, Store, last_used

STALE_TMP_SECONDS = 24 * 3600


@dataclass
class GcReport:
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def collect(store: Store, *, max_bytes: int | None, older_than: float | None, dry_run: bool = False) -> GcReport:
    """Remove writable entries unused for `older_than` seconds, then the least recently used
    until the layer holds at most `max_bytes`."""
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
    if not dry_run:
        _clear_stale_tmp(store.writable.base / "tmp", now)
    return report


def _clear_stale_tmp(tmp: Path, now: float) -> None:
    if not tmp.is_dir():
        return
    for child in tmp.iterdir():
        try:
            if now - child.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(child, ignore_errors=True)
        except OSError:
            continue
