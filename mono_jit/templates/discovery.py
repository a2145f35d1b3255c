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

from mono_jit.record import Record

GROUP = "mono_jit.templates"
_METADATA_SUFFIXES = (".dist-info", ".egg-info")
_memo: dict[tuple[str, ...], tuple["Declaration", ...]] = {}


class Declaration(Record):
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


def _read_text(path: str) -> str | None:
    """A file's text (UTF-8, undecodable bytes replaced), or None when it cannot be read. Raw
    os.open / os.read: this runs for every installed distribution at every process start, and
    open()'s text layer costs twice as much."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # most distributions declare no entry points
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:  # a folder of that name, an I/O error: nothing declared
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _scan(path: tuple[str, ...]) -> tuple[Declaration, ...]:
    seen: set[str] = set()
    found: list[Declaration] = []
    for folder in path:
        try:
            entries = sorted(n for n in os.listdir(folder or ".") if n.endswith(_METADATA_SUFFIXES))
        except OSError:  # a zip archive, a missing folder: no metadata folders to read
            continue
        for entry in entries:
            distribution = _normalise(entry.rsplit(".", 1)[0].split("-", 1)[0])
            if distribution in seen:
                continue
            seen.add(distribution)
            text = _read_text(os.path.join(folder or ".", entry, "entry_points.txt"))
            if text is not None:
                found += parse_group(text, distribution)
    return tuple(found)


def declarations() -> tuple[Declaration, ...]:
    """Every declaration of GROUP on the current sys.path, in sys.path order (memoised per path)."""
    path = tuple(sys.path)
    if path not in _memo:
        _memo[path] = _scan(path)
    return _memo[path]
