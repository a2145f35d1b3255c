"""The files a template's build reads, derived from its imports, and their digest: a module a
build starts to import enters the cache key without anyone listing it.

From the module that defines the template class and its kernel module, every import naming a
module of the same top-level package is followed, transitively. `from package import name` reads
the package's ``__init__.py`` only when `name` is not a module of it (`from . import K1Template`
does, `from .. import schedule` reads schedule.py alone), so re-exporting packages such as
``mono_jit/__init__.py`` stay out of the key. A file's name in the key is its module's path
under the package's folder, wherever the file is installed (pyproject's package-dir puts
``mono_jit.cache`` in ``cache/`` of the source tree, a wheel in ``mono_jit/cache/``), so a
checkout and a wheel of one source key alike.

Imports are found by a scan of the statements that start a line (as every module here writes
them), not by parsing: parsing K2's files costs about 45 ms, half a warm grid load. Each file is
read and scanned once per process while its stat signature (size, mtime, inode) holds, and a
template's answer is reused while its files' signatures hold. A file modified in the last two
seconds is never memoised (an edit within the clock's granularity could keep its mtime).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
import time
from typing import Iterator

from mono_jit.cache.digest import sha256

# `from X import names` (names possibly in parentheses over several lines) or `import a.b as c, d`,
# after a newline: a literal first character lets the search skip to line starts (3x faster than ^).
_IMPORT = re.compile(
    r"\n[ \t]*(?:from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]*(\([^)]*\)|(?:[^\n\\]|\\\n)*)|import[ \t]+((?:[^\n\\]|\\\n)*))")
_COMMENT = re.compile(r"#[^\n]*")
FRESH_NS = 2_000_000_000

Stamp = tuple[int, int, int]  # size, mtime in ns, inode
Import = tuple[str, "str | None"]  # (absolute module, name imported from it or None)
_scans: dict[tuple[str, str], tuple[Stamp, bytes, tuple[Import, ...]]] = {}  # (path, module) -> scan
_answers: dict[tuple, tuple[dict[str, str], tuple[Stamp, ...], str]] = {}  # query -> (files, stamps, digest)


def _items(names: str) -> Iterator[str]:
    """The first word of each comma-separated item of an import's name list (comments dropped)."""
    text = _COMMENT.sub("", names).replace("\\\n", " ").strip().strip("()")
    for item in text.split(";", 1)[0].split(","):
        words = item.split()
        if words:
            yield words[0]


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def imported_names(text: str, module: str, is_package: bool) -> Iterator[Import]:
    """(absolute module, imported name or None) for each import statement in `text`, the source
    of `module`, relative imports resolved against its package. A line of prose that reads like
    an import yields a name that is no module of the package, which costs nothing."""
    package = module if is_package else module.rpartition(".")[0]
    for found in _IMPORT.finditer("\n" + text):
        source, names, plain = found.groups()
        if plain is not None:
            yield from ((name, None) for name in _items(plain) if _dotted(name))
            continue
        try:
            target = importlib.util.resolve_name(source, package) if source.startswith(".") else source
        except ImportError:  # more dots than packages: not code
            continue
        if _dotted(target):
            yield from ((target, None if name == "*" else name)
                        for name in _items(names) if name == "*" or name.isidentifier())


def _stamp(path: str) -> Stamp:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _settled(stamps: tuple[Stamp, ...]) -> bool:
    return max((mtime for _, mtime, _ in stamps), default=0) < time.time_ns() - FRESH_NS


def _scan(path: str, module: str, is_package: bool) -> tuple[Stamp, bytes, tuple[Import, ...]]:
    stamp = _stamp(path)
    known = _scans.get((path, module))
    if known is not None and known[0] == stamp:
        return known
    with open(path, "rb") as handle:
        data = handle.read()
    scan = (stamp, data, tuple(imported_names(data.decode("utf-8"), module, is_package)))
    if _settled((stamp,)):
        _scans[(path, module)] = scan
    return scan


def _placed_elsewhere(package: str, above: str) -> str | None:
    """The folder an installed package's finders place `package` in when it is not under its
    parent's folder (pyproject's package-dir), asked as the import system would once the parent
    is imported, without importing anything."""
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:  # it looks under `above`, which holds no such package
            continue
        try:
            spec = finder.find_spec(package, [above])  # type: ignore[call-arg]
        except (AttributeError, ImportError, TypeError, ValueError):
            continue
        if spec is not None:
            locations = list(spec.submodule_search_locations or ())
            found = len(locations) == 1 and os.path.isfile(os.path.join(locations[0], "__init__.py"))
            return locations[0] if found else None
    return None


class _Tree:
    """Where the modules of the top-level package `top` live: under `root` (the package's
    folder, or the folder holding a top-level module), or where its finders place a subpackage."""

    def __init__(self, top: str, root: str):
        self.top = top
        self.root = root
        self.top_is_package = hasattr(sys.modules.get(top), "__path__")
        self._folders: dict[str, str | None] = {top: root if self.top_is_package else None}

    def folder(self, package: str) -> str | None:
        """The folder of `package`'s modules, or None if it is not a package of this tree."""
        if package not in self._folders:
            parent, _, last = package.rpartition(".")
            above = self.folder(parent) if parent else None
            found = None
            if above is not None:
                inside = os.path.join(above, last)
                if os.path.isfile(os.path.join(inside, "__init__.py")):
                    found = inside
                elif not os.path.isfile(inside + ".py"):
                    found = _placed_elsewhere(package, above)
            self._folders[package] = found
        return self._folders[package]

    def file(self, module: str) -> tuple[str, str, bool] | None:
        """(name in the key, path, is a package) of `module`, or None if it is not this tree's."""
        if not self.top_is_package:
            path = os.path.join(self.root, f"{module}.py")
            return (f"{module}.py", path, False) if module == self.top and os.path.isfile(path) else None
        if module != self.top and not module.startswith(self.top + "."):
            return None
        rel = module.split(".")[1:]
        package = self.folder(module)
        if package is not None:
            return "/".join([*rel, "__init__.py"]), os.path.join(package, "__init__.py"), True
        above = self.folder(module.rpartition(".")[0])
        if above is None or not os.path.isfile(os.path.join(above, f"{rel[-1]}.py")):
            return None
        return "/".join(rel) + ".py", os.path.join(above, f"{rel[-1]}.py"), False


def _walk(tree: _Tree, starts: tuple[str, ...]) -> dict[str, tuple[str, Stamp, bytes]]:
    """name in the key -> (path, stamp, bytes) of every module `starts` import, transitively."""
    files: dict[str, tuple[str, Stamp, bytes]] = {}
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        located = tree.file(module)
        if located is None:
            continue
        rel, path, is_package = located
        stamp, data, imports = _scan(path, module, is_package)
        files[rel] = (path, stamp, data)
        for target, name in imports:
            submodule = f"{target}.{name}"
            if name is not None and tree.folder(target) is not None and tree.file(submodule) is not None:
                todo.append(submodule)  # its package's __init__ is not read for it
            else:
                todo.append(target)
    return files


def _answer(top: str, root: str, starts: tuple[str, ...], listed: tuple[str, ...]
            ) -> tuple[dict[str, str], tuple[Stamp, ...], str]:
    query = (top, root, starts, listed)
    known = _answers.get(query)
    if known is not None:
        try:
            if tuple(map(_stamp, known[0].values())) == known[1]:
                return known
        except OSError:  # a file went away: derive again
            pass
    found = _walk(_Tree(top, root), starts)
    for rel in listed:
        path = os.path.join(root, rel)
        with open(path, "rb") as handle:
            found[rel] = (path, _stamp(path), handle.read())
    hasher = sha256()
    for rel, (_, _, data) in sorted(found.items()):
        hasher.update(rel.encode() + b"\0" + data + b"\0")
    answer = ({rel: found[rel][0] for rel in sorted(found)}, tuple(found[rel][1] for rel in sorted(found)),
              hasher.hexdigest())
    if _settled(answer[1]):
        _answers[query] = answer
    return answer


def files_read(top: str, root: str, starts: tuple[str, ...], listed: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file of the top-level package `top` (its folder: `root`) that the modules `starts`
    import, transitively, themselves included, and the files `listed` by hand (relative to
    `root`): name in the key -> path on disk, sorted by name."""
    return _answer(top, root, starts, listed)[0]


def digest(top: str, root: str, starts: tuple[str, ...], listed: tuple[str, ...] = ()) -> str:
    """sha256 over (name, bytes) of each of `files_read(top, root, starts, listed)`, by name."""
    return _answer(top, root, starts, listed)[2]
