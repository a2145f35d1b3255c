"""Every file a comment or docstring names is in the repository, so a reader can follow it.

A path is a name with a folder (`templates/k2/attention_layout.py`) or a document (`settings.md`); it is
found if some file of the repository ends with it (the package installs `cache/` and `cli/` as
`mono_jit.cache` and `mono_jit.cli`). Other projects' sources are cited on purpose: a
`path:line` citation, or a code path in a paragraph that names the project (vLLM, AITER,
FlyDSL, Triton, tinygrad, MGPUSim, LLVM, the in-tree or upstream mono), is theirs. A document
(`.md`) must always be ours: a note outside the repository cannot be followed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("mono_jit", "cache", "cli", "tests", "bench", "scripts", "examples")
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:md|py|toml|sh|json|txt|yaml|yml|cfg))(?![\w/-])")
EXTERNAL = re.compile(r"vLLM|AITER|FlyDSL|Triton|tinygrad|MGPUSim|LLVM|in-tree|upstream", re.IGNORECASE)
INSTALLED_AS = {"cache/": "mono_jit/cache/", "cli/": "mono_jit/cli/"}


def _repository_files() -> set[str]:
    files = {p.relative_to(ROOT).as_posix() for folder in SCANNED + ("docs",) for p in (ROOT / folder).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    files |= {p.name for p in ROOT.iterdir() if p.is_file()}
    return files | {INSTALLED_AS[f[:f.index("/") + 1]] + f[f.index("/") + 1:]
                    for f in files if f[:f.find("/") + 1] in INSTALLED_AS}


def _comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def _paragraph(text: str, start: int, end: int) -> str:
    begin = text.rfind("\n\n", 0, start) + 1
    finish = text.find("\n\n", end)
    return text[begin:len(text) if finish < 0 else finish]


def dangling(source: str, files: set[str]) -> list[tuple[int, str]]:
    """The paths `source`'s comments and docstrings name that are neither in `files` nor cited
    from another project, with their lines."""
    found = []
    for line, text in _comments_and_docstrings(source):
        for match in PATH.finditer(text):
            path = match.group(1)
            if "/" not in path and not path.endswith(".md"):
                continue  # a bare module name: too common to tell ours from another project's
            if any(f == path or f.endswith("/" + path) for f in files):
                continue
            cited = re.match(r":\d", text[match.end():match.end() + 2]) is not None
            if not path.endswith(".md") and (cited or EXTERNAL.search(_paragraph(text, *match.span()))):
                continue
            found.append((line, path))
    return found


def test_every_path_a_comment_or_docstring_names_is_in_the_repository():
    files = _repository_files()
    missing = [f"{source.relative_to(ROOT)}:{line}: {path}"
               for folder in SCANNED for source in sorted((ROOT / folder).rglob("*.py"))
               for line, path in dangling(source.read_text(encoding="utf-8"), files)]
    assert not missing, "comments and docstrings name files not in the repository:\n" + "\n".join(missing)


def test_the_scan_finds_a_missing_note_and_spares_citations_of_other_projects():
    files = {"mono_jit/spec.py", "docs/settings.md", "mono_jit/cache/meta.py"}
    source = ('"""Read docs/settings.md and spec.py; meta.py is in cache/meta.py."""\n'
              "# vLLM: models/deepseek_v4/amd/model.py builds it\n"
              "# see models/deepseek_v4/amd/model.py:608 for the limit\n"
              "# as vllm-integration.md says\n"
              "# tests/test_gone.py checks it\n")
    assert dangling(source, files) == [(4, "vllm-integration.md"), (5, "tests/test_gone.py")]
