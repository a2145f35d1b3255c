"""The cache key's source digest covers every file a template's build reads: each built-in
template's sources are the modules of mono_jit its class's module and kernel module import,
transitively (found here by parsing them with `ast` and asking the import system, independently
of templates/sources.py's scan), with no list kept by hand, and editing any of them, K2's
included, changes the digest (deepseek_v4.py and hsaco/resources.py were once missing from a hand
list, so a width change kept old kernels)."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest

from mono_jit.templates import all_templates
from mono_jit.templates.base import PACKAGE_DIR
from mono_jit.templates.sources import imported_names

BUILT_INS = sorted(name for name, t in all_templates().items() if type(t).__module__.startswith("mono_jit.templates."))


def _spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def _imports(module: str) -> set[str]:
    """The mono_jit modules `module`'s import statements read: `from p import n` reads module
    p.n when there is one, else p (for a name defined in p)."""
    spec = _spec(module)
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.ImportFrom):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            if target.split(".")[0] == "mono_jit":
                is_package = bool(_spec(target).submodule_search_locations)
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    found.add(submodule if is_package and _spec(submodule) else target)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] == "mono_jit"}


def imported_sources(*roots: str) -> dict[str, Path]:
    """name in the key (the module's path under mono_jit/) -> file, for `roots` and what they import."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += _imports(module)
    files = {}
    for module in seen:
        spec = _spec(module)
        parts = module.split(".")[1:] + (["__init__"] if spec.submodule_search_locations else [])
        files["/".join(parts) + ".py"] = Path(spec.origin)
    return files


def _oracle(name: str) -> dict[str, Path]:
    template = all_templates()[name]
    return imported_sources(type(template).__module__, template.kernel_module_name())


def test_every_builtin_is_checked():
    assert {"k1", "k2", "router", "keytable"} <= set(BUILT_INS)


@pytest.mark.parametrize("name", BUILT_INS)
def test_a_builtins_sources_are_what_its_build_imports_with_no_hand_list(name):
    template = all_templates()[name]
    assert type(template).source_files is None  # derived; a hand list is a plug-in's option
    derived = template.sources()
    assert derived == {rel: str(path) for rel, path in sorted(_oracle(name).items())}
    assert {"deepseek_v4.py", "hsaco/resources.py", "templates/base.py", f"templates/{name}/kernel.py"} <= set(derived)


def _copy_of_the_package(tmp_path: Path, files: dict[str, Path]) -> Path:
    """mono_jit/ copied, with the packages installed from beside it (cache/) placed in it, as a
    wheel places them."""
    copy = tmp_path / "mono_jit"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, path in files.items():
        if not (copy / rel).is_file():
            shutil.copytree(path.parent, (copy / rel).parent, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize("name", BUILT_INS)
def test_editing_any_file_the_build_imports_changes_the_digest(tmp_path, name):
    template = all_templates()[name]
    files = _oracle(name)
    copy = _copy_of_the_package(tmp_path, files)
    original = template.source_digest(copy)
    assert original == template.source_digest()
    for rel in files:
        path = copy / rel
        text = path.read_bytes()
        path.write_bytes(text + b"\n# edited\n")
        assert template.source_digest(copy) != original, f"{rel} is not in the key"
        path.write_bytes(text)
    assert template.source_digest(copy) == original


def test_a_module_a_template_starts_to_import_enters_its_key_with_no_list_touched(tmp_path):
    template = all_templates()["k2"]
    copy = _copy_of_the_package(tmp_path, _oracle("k2"))
    (copy / "templates/k2/extra_table.py").write_text("ROWS = 4\n")
    layout = copy / "templates/k2/moe_layout.py"
    text = layout.read_text()
    anchor = "\nfrom .attention_layout import"
    assert anchor in text
    layout.write_text(text.replace(anchor, "\nfrom . import extra_table" + anchor, 1))
    assert "templates/k2/extra_table.py" in template.sources(copy)
    before = template.source_digest(copy)
    (copy / "templates/k2/extra_table.py").write_text("ROWS = 8\n")
    assert template.source_digest(copy) != before


SCANNED = '''"""Prose that reads like code:
from the cache import nothing
import this and that
"""
from __future__ import annotations
import os.path as osp, sys
from . import (alpha,  # a comment
               beta as b)
from .. import gamma, \\
    delta
from ..deep import *
from ....far import zeta
def late():
    from .inner.most import epsilon
'''


def test_the_scan_finds_each_import_statement_and_resolves_it():
    found = list(imported_names(SCANNED, "top.pkg.mod", is_package=False))
    assert ("top.pkg", "alpha") in found and ("top.pkg", "beta") in found
    assert ("top", "gamma") in found and ("top", "delta") in found
    assert ("top.deep", None) in found
    assert all(name != "zeta" for _, name in found)  # four dots from top.pkg.mod climb past the top: not code
    assert ("top.pkg.inner.most", "epsilon") in found
    assert ("os.path", None) in found and ("sys", None) in found
    assert ("this", None) in found  # prose naming no module of the package costs nothing
    assert all(module != "the" for module, _ in found)
