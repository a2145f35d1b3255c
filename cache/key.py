"""The cache key: sha256 of the canonical JSON of every factor that can change the bytes.

Factors: store format, template name and source digest, the spec fields the template reads,
arch, the toolchain fingerprint (FlyDSL version and files, ld.lld version, device bitcode) and
the compile options. No absolute paths and no environment beyond these, so a cache built on one
machine hits on another with the same toolchain. The factors are stored with each entry, so a
miss can be explained field by field.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from .digest import sha256

FORMAT_VERSION = 1
# Fixed by compile_environment(): debug info off keeps the bytes free of paths and identical
# across processes; FlyDSL 0.5's pipeline is otherwise fixed (ROCDL O=2).
COMPILE_OPTIONS = {"debug_info": False}


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def key_factors(template_name: str, source_digest: str, spec: dict, arch: str, toolchain: dict) -> dict:
    return {
        "format": FORMAT_VERSION,
        "template": {"name": template_name, "source_digest": source_digest},
        "spec": spec,
        "arch": arch,
        "toolchain": toolchain,
        "options": COMPILE_OPTIONS,
    }


def cache_key(factors: Mapping[str, Any]) -> str:
    return sha256(canonical_json(factors).encode()).hexdigest()


def build_identity(factors: Mapping[str, Any]) -> str:
    """The build a key stands for, whatever toolchain built it: the hash of every factor but the
    toolchain (store format, template and source digest, spec, arch, compile options). Derived
    from an entry's stored factors, which its key covers, so no entry can claim an identity its
    factors disagree with."""
    return cache_key({name: value for name, value in factors.items() if name != "toolchain"})


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b': value} view of nested factors, for diffs."""
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for name, value in data.items():
            out.update(flatten(value, f"{prefix}{name}."))
        return out
    return {prefix.rstrip("."): data}


def diff(wanted: Mapping[str, Any], have: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(factor, wanted value, stored value) for every factor that differs."""
    a, b = flatten(wanted), flatten(have)
    return [(name, a.get(name), b.get(name)) for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]
