"""The declarations of the `mono_jit.templates` entry-point group, read from the installed
distributions' metadata (built-in templates and plug-ins alike).

Read here rather than through importlib.metadata: importing and scanning it takes about 0.1 s
in a fresh process and imports zipfile and shutil, on the cache-hit path of every serving
process. The rules are the packaging spec's: each ``*.dist-info`` / ``*.egg-info`` folder on
sys.path, the first distribution of a (normalised) name wins, ``entry_points.txt`` is INI.
Nothing is imported: a declaration is a name and a ``module:attribute`` string.
"""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

GROUP = "mono_jit.templates"
_METADATA_SUFFIXES = (".dist-info", ".egg-info")
_memo: dict[tuple[str, ...], tuple["Declaration", ...]] = {}


class Declaration(NamedTuple):
    """One entry point of the group: `name = module:attribute` in `distribution`'s metadata."""

    name: str
    value: str
    distribution: str

    @property
    def source(self) -> str:
        """Where it comes from, for messages: 'mono-jit (mono_jit.templates.k1:K1Template)'."""
        return f"{self.distribution} ({self.value})"

    def target(self) -> tuple[str, str]:
        """(module, attribute path) of the value; an extras suffix ('[x]') is ignored."""
        module, _, attribute = self.value.split("[", 1)[0].strip().partition(":")
        return module.strip(), attribute.strip()


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_group(text: str, distribution: str) -> list[Declaration]:
    """The declarations of GROUP in an entry_points.txt (INI: [group] then `name = value`)."""
    if GROUP not in text:  # most distributions declare other groups only: no line to read
        return []
    found, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == GROUP
        elif inside and "=" in line:
            name, _, value = line.partition("=")
            found.append(Declaration(name.strip(), value.strip(), distribution))
    return found


def _scan(path: tuple[str, ...]) -> tuple[Declaration, ...]:
    seen: set[str] = set()
    found: list[Declaration] = []
    for folder in path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:  # a zip archive, a missing folder: no metadata folders to read
            continue
        for entry in names:
            if not entry.endswith(_METADATA_SUFFIXES):
                continue
            distribution = _normalise(entry.rsplit(".", 1)[0].split("-", 1)[0])
            if distribution in seen:
                continue
            seen.add(distribution)
            try:
                with open(os.path.join(folder or ".", entry, "entry_points.txt"), encoding="utf-8") as file:
                    text = file.read()
            except OSError:
                continue
            found += parse_group(text, distribution)
    return tuple(found)


def declarations() -> tuple[Declaration, ...]:
    """Every declaration of GROUP on the current sys.path, in sys.path order (memoised per path)."""
    path = tuple(sys.path)
    if path not in _memo:
        _memo[path] = _scan(path)
    return _memo[path]
