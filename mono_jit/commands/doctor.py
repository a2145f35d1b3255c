"""`mono-jit doctor`: health checks of this host: the toolchain (FlyDSL, ld.lld, device
bitcode), the cache layers and their entries, the registered templates; each check ok with its
detail or failed with why.

Works on a lean serving host (no FlyDSL): the toolchain check then says it serves hits only."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable

from mono_jit.cache import Entry, Store

from ..config import Settings
from ..errors import MonoJitError

LEAN_HOST = "no FlyDSL here: this host serves hits only; install mono-jit's wheel with its build extra to compile"


def cannot_compile_here() -> str | None:
    """Why this host cannot compile (a lean serving install), or None when it has FlyDSL."""
    return LEAN_HOST if importlib.util.find_spec("flydsl") is None else None


@dataclass
class Checks:
    """Named checks run in order; a check that raises MonoJitError or OSError fails with its message."""

    rows: list[dict] = field(default_factory=list)  # {check, ok, detail}

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        try:
            detail = fn()
        except (MonoJitError, OSError) as exc:
            self.rows.append({"check": name, "ok": False, "detail": str(exc)})
            return None
        self.rows.append({"check": name, "ok": True, "detail": detail})
        return detail

    @property
    def ok(self) -> bool:
        return all(row["ok"] for row in self.rows)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checks": self.rows}


def doctor(settings: Settings, deep: bool = False) -> Checks:
    """Run the checks: toolchain, cache, templates (and with `deep`, FlyDSL's files against its RECORD)."""
    from ..templates import all_templates, problems
    from ..pipeline.toolchain import flydsl_files_modified, resolve_toolchain

    checks = Checks()

    @functools.cache
    def walk() -> tuple[Store, list]:
        """The store and every layer's copies, verified once for both checks that read them."""
        store = Store(settings)
        return store, list(store.entries())

    def toolchain() -> Any:
        lean = cannot_compile_here()
        if lean is not None:
            return lean
        tc = resolve_toolchain(settings)
        entries = [e for e in walk()[1] if isinstance(e, Entry)]
        matching = sum(e.meta.toolchain == tc.fingerprint for e in entries)
        if entries and not matching:
            raise MonoJitError(f"none of the {len(entries)} cache entries was built by this toolchain "
                               f"({', '.join(f'{k}={v}' for k, v in tc.fingerprint.items())}): every lookup here "
                               "misses; run mono-jit prebuild (mono-jit explain shows which factor differs)")
        return {"ld_lld_path": str(tc.linker.path), "bitcode": str(tc.bitcode_dir), **tc.fingerprint,
                "entries_built_by_it": matching}

    def cache() -> dict:
        store, items = walk()
        bad = [str(item[0]) for item in items if not isinstance(item, Entry)]
        if bad:
            raise MonoJitError(f"{len(bad)} bad entries: {', '.join(bad[:3])}")
        return {"layers": [str(layer.root) for layer in store.layers], "entries": len(items)}

    def flydsl_files() -> str:
        if cannot_compile_here() is not None:
            return "not run: no FlyDSL here"
        modified = flydsl_files_modified()
        if modified:
            raise MonoJitError(f"{len(modified)} FlyDSL files differ from RECORD: {', '.join(modified[:3])}")
        return "every file matches RECORD"

    checks.run("toolchain", toolchain)
    checks.run("cache", cache)
    def templates():
        broken = problems()  # plug-ins that failed to import or register: named, not hidden
        if broken:
            raise MonoJitError(" | ".join(broken.values()))
        return sorted(all_templates())

    checks.run("templates", templates)
    if deep:
        checks.run("flydsl_files", flydsl_files)
    return checks
