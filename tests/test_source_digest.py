"""The cache key's source digest covers every file a template's build reads: each built-in
template's `source_files` equals the mono_jit modules its package and kernel module import,
transitively (found here by parsing their imports), and editing any of them changes the digest
(deepseek_v4.py, then named model.py, and resources.py were missing, so a width change kept old kernels)."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest

from mono_jit.templates import get
from mono_jit.templates.base import PACKAGE_DIR

# Packages whose __init__ only re-exports (or registers), which a build does not read.
NOT_FOLLOWED = {"mono_jit", "mono_jit.templates", "mono_jit.templates.registry"}


def _file_of(module: str) -> Path | None:
    path = PACKAGE_DIR.joinpath(*module.split(".")[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imports(module: str) -> set[str]:
    """mono_jit modules `module` imports (`from . import x` names count as modules)."""
    path = _file_of(module)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            found |= {target} | {f"{target}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.startswith("mono_jit") and _file_of(m) is not None}


def imported_sources(*roots: str) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module in NOT_FOLLOWED:
            continue
        seen.add(module)
        todo += _imports(module)
    return {str(_file_of(m).relative_to(PACKAGE_DIR)) for m in seen}


@pytest.mark.parametrize("name", ["k1", "router", "keytable"])
def test_source_files_are_what_the_build_imports(name):
    template = get(name)
    package = type(template).__module__
    assert set(template.source_files) == imported_sources(package, template.kernel_module_name())


def test_editing_any_source_file_changes_the_digest(tmp_path):
    template = get("k1")
    copy = tmp_path / "mono_jit"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = template.source_digest(copy)
    assert original == template.source_digest()
    for rel in template.source_files:
        path = copy / rel
        text = path.read_bytes()
        path.write_bytes(text + b"\n# edited\n")
        assert template.source_digest(copy) != original, f"{rel} is not in the key"
        path.write_bytes(text)
    assert {"deepseek_v4.py", "resources.py", "templates/sync_words.py"} <= set(template.source_files)
