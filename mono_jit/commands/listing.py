"""What the cache holds: one row per served entry (status ok or stale), the size of each layer,
and an entry found by a key prefix. `mono-jit list` and `inspect` print these."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mono_jit.cache import Entry, Store
from mono_jit.cache.meta import EntryMeta
from mono_jit.cache.store import last_used

from ..errors import MonoJitError
from ..templates import get


class KeyPrefixError(MonoJitError, ValueError):
    """A key prefix that is not hex, too short, or matches no entry or several."""


def label(meta: EntryMeta) -> str:
    """'template(field=value, ...)' of an entry, as a BuildJob labels it."""
    return meta.label


def status(entry: Entry) -> str:
    """"ok", or "stale" when the installed template's sources differ from those that built it
    (a lookup never reaches it again: gc collects it), or "unknown template"."""
    try:
        installed = get(entry.meta.template).source_digest()
    except MonoJitError:
        return "unknown template"
    return "ok" if entry.meta.source_digest == installed else "stale"


def row(entry: Entry) -> dict:
    """One entry as `list` shows it; every field always present, with one type."""
    kernel = entry.meta.kernels[0]
    return {"key": entry.key, "template": entry.meta.template, "label": label(entry.meta),
            "spec": entry.meta.spec, "arch": entry.arch, "path": str(entry.path),
            "layer": "writable" if entry.layer.writable else "read-only", "bytes": entry.meta.hsaco.size,
            "disk_bytes": entry.size, "vgpr": kernel.vgpr, "agpr": kernel.agpr, "sgpr": kernel.sgpr,
            "lds": kernel.lds, "scratch": kernel.scratch, "compile_seconds": float(entry.meta.compile_seconds),
            "last_used": time.strftime("%Y-%m-%d %H:%M", time.localtime(last_used(entry.path))),
            "status": status(entry)}


@dataclass
class Listing:
    """The served entries (optionally of some templates only) and the disk they take."""

    entries: list[dict] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)  # {root, writable, entries, bytes}

    @property
    def total_bytes(self) -> int:
        return sum(layer["bytes"] for layer in self.layers)

    def as_dict(self) -> dict:
        return {"entries": self.entries, "layers": self.layers, "total_bytes": self.total_bytes}


def listing(store: Store, templates: tuple[str, ...] | None = None) -> Listing:
    """Every served entry (read-only layers first), filtered by template names when given, and
    each layer's entry count and bytes on disk (of every served entry, whatever the filter)."""
    out = Listing()
    per_layer: dict[Path, dict[str, Any]] = {
        layer.root: {"root": str(layer.root), "writable": layer.writable, "entries": 0, "bytes": 0}
        for layer in store.layers}
    for entry in store.served():
        rowed = row(entry)
        per_layer[entry.layer.root]["entries"] += 1
        per_layer[entry.layer.root]["bytes"] += rowed["disk_bytes"]
        if templates is None or entry.meta.template in templates:
            out.entries.append(rowed)
    out.layers = list(per_layer.values())
    return out


def find(store: Store, prefix: str) -> Entry:
    """The one served entry whose key starts with `prefix` (at least 4 hex digits)."""
    if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
        raise KeyPrefixError(f"{prefix!r}: expected a key or a hex prefix of at least 4 characters")
    matches = [e for e in store.served() if e.key.startswith(prefix)]
    if len(matches) != 1:
        raise KeyPrefixError(f"key prefix {prefix!r} matches {len(matches)} entries; give more characters"
                             if matches else f"key prefix {prefix!r} matches no entry (mono-jit list shows the keys)")
    return matches[0]
