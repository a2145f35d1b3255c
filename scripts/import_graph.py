"""Print mono-jit's internal import graph: for each module, the package modules it imports.

Reads the sources (no import is executed): cache/ and cli/ are the installed
mono_jit.cache / mono_jit.cli. `--areas` folds modules into their folders (templates/k2,
runtime, cache, ...) and prints which areas each area imports, with the module pairs that
reach into a template's folder from another template folder or the shared templates/. Imports inside functions (taken only when the
function runs) are marked "(lazy)".

    python scripts/import_graph.py [--areas] [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

FOLDERS = {"mono_jit": "mono_jit", "cache": "mono_jit.cache", "cli": "mono_jit.cli"}


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name -> source file."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, bool]:
    """The package modules `name` imports -> whether only inside a function (lazy)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    lazy_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
    typing_only = {id(n) for i in ast.walk(tree) if isinstance(i, ast.If) and "TYPE_CHECKING" in ast.unparse(i.test)
                   for n in ast.walk(i)}
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                lazy = id(node) in lazy_nodes
                found[target] = found.get(target, True) and lazy
    return found


def area_of(root: Path, path: Path) -> str:
    """A module's folder: mono_jit/templates/k2/kernel.py -> templates/k2, cache/oci/tier.py ->
    cache/oci; the top-level modules of mono_jit/ -> mono_jit."""
    folder = path.parent.relative_to(root).parts
    return "/".join(folder[1:] if folder[0] == "mono_jit" else folder) or "mono_jit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areas", action="store_true", help="fold modules into their folders")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    modules = module_names(args.root)
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    if not args.areas:
        for name, targets in graph.items():
            shown = [t.removeprefix("mono_jit.") + (" (lazy)" if lazy else "") for t, lazy in sorted(targets.items())]
            print(f"{name.removeprefix('mono_jit.') or 'mono_jit'}: {', '.join(shown) or '-'}")
        return
    area = {name: area_of(args.root, path) for name, path in modules.items()}.__getitem__
    areas: dict[str, set[str]] = defaultdict(set)
    crossings = []
    for name, targets in graph.items():
        for target in targets:
            if area(target) != area(name):
                areas[area(name)].add(area(target))
            if area(name).startswith("templates") and area(target).startswith("templates/") \
                    and area(name) != area(target):
                crossings.append(f"{name.removeprefix('mono_jit.')} -> {target.removeprefix('mono_jit.')}")
    for name in sorted(areas):
        print(f"{name}: {', '.join(sorted(areas[name]))}")
    print("between template folders:" if crossings else "between template folders: none")
    for line in sorted(crossings):
        print(f"  {line}")


if __name__ == "__main__":
    main()
