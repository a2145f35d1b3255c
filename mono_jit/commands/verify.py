"""`mono-jit verify`: check every copy of every entry as a load would (size, sha256, ELF
header, key), and with rebuild, recompile each good one on the compile pool of a miss (pipeline/miss.py)
and require byte-identical code (determinism); nothing rebuilt is published.

Bad copies in the writable layer are reported, not moved: a load quarantines them."""

from __future__ import annotations

from dataclasses import dataclass, field

from mono_jit.cache import Entry, Store

from ..config import Settings
from .listing import label
from ..progress import Progress


@dataclass
class VerifyReport:
    """One row per copy: {key, label, path, layer, ok, error, rebuilt_sha256, identical} (every
    field always present; the last two None without rebuild)."""

    rows: list[dict] = field(default_factory=list)
    rebuild: bool = False

    @property
    def bad(self) -> int:
        return sum(not r["ok"] for r in self.rows)

    def as_dict(self) -> dict:
        return {"entries": self.rows, "good": len(self.rows) - self.bad, "bad": self.bad, "rebuild": self.rebuild}


def _row(item: Entry | tuple, store: Store) -> dict:
    if isinstance(item, Entry):
        return {"key": item.key, "label": label(item.meta), "path": str(item.path),
                "layer": "writable" if item.layer.writable else "read-only", "ok": True, "error": None,
                "rebuilt_sha256": None, "identical": None}
    path, reason = item
    writable = store.writable.writable and path.is_relative_to(store.writable.root)
    return {"key": path.name, "label": None, "path": str(path), "layer": "writable" if writable else "read-only",
            "ok": False, "error": reason, "rebuilt_sha256": None, "identical": None}


def verify(store: Store, *, rebuild: bool, jobs: int, timeout: float, progress: Progress) -> VerifyReport:
    """Every copy in every layer checked; with `rebuild`, each good copy recompiled and compared."""
    items = list(store.entries())
    report = VerifyReport([_row(item, store) for item in items], rebuild)
    good = {item.key: item for item in items if isinstance(item, Entry)}
    if rebuild and good:
        fresh = _rebuild_hashes(list(good.values()), store.settings, jobs, timeout, progress)
        for row in report.rows:
            if row["ok"]:
                digest = fresh[row["key"]]
                row["identical"] = digest == good[row["key"]].meta.hsaco.sha256
                row["rebuilt_sha256"] = digest if len(digest) == 64 else None
                row["ok"] = row["identical"]
                if not row["identical"]:
                    row["error"] = digest if row["rebuilt_sha256"] is None else f"rebuilt bytes differ ({digest})"
    return report


def _rebuild_hashes(entries: list[Entry], settings: Settings, jobs: int, timeout: float,
                    progress: Progress) -> dict[str, str]:
    """Recompile each entry's template and spec in workers: {key: sha256 of the new bytes, or
    'rebuild failed: ...'}, each reported to `progress` as it finishes."""
    import hashlib

    from ..pipeline.miss import compile_pool
    from ..pipeline.toolchain import resolve_toolchain

    toolchain = resolve_toolchain(settings)
    progress.planned(len(entries))
    out: dict[str, str] = {}
    by_arch: dict[str, list[Entry]] = {}
    for entry in entries:
        by_arch.setdefault(entry.arch, []).append(entry)
    for arch, group in by_arch.items():
        labels = {entry.key: label(entry.meta) for entry in group}
        expected = {entry.key: entry.meta.hsaco.sha256 for entry in group}
        items = [(entry.key, (entry.meta.template, entry.meta.build_spec)) for entry in group]
        with compile_pool(toolchain, arch, jobs, timeout) as pool:
            for outcome in pool.run(items):
                key = outcome.job_id
                if outcome.status == "ok":
                    out[key] = hashlib.sha256(outcome.value["hsaco"]).hexdigest()
                    event = "identical" if out[key] == expected[key] else "differs"
                    progress.finished(event, labels[key], f"{outcome.seconds:.1f}s")
                else:
                    first = (str(outcome.value).strip().splitlines() or [outcome.status])[0]
                    out[key] = f"rebuild failed ({outcome.status}): {first}"
                    progress.finished("failed", labels[key], out[key])
    return out
