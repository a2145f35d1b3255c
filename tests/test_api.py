"""The CLI is a thin face over the Python API: each command calls one
mono_jit.api function, cli/ reaches into no build, compile, toolchain or worker internals, the
API does what the commands do, `from mono_jit import resolve` is always the function, and the
docs/usage.md's API snippet runs as written."""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit import api
from mono_jit.cli import main
from mono_jit.errors import MonoJitError
from mono_jit.spec import Spec

REPO = Path(__file__).resolve().parent.parent
INTERNALS = ("mono_jit.pipeline.job", "mono_jit.pipeline.compile", "mono_jit.pipeline.workers", "mono_jit.pipeline.toolchain", "mono_jit.pipeline.prebuild",
             "mono_jit.commands.verify", "mono_jit.commands.explain", "mono_jit.commands.listing", "mono_jit.cache.bundle",
             "mono_jit.cache.gc", "mono_jit.cache.layer", "mono_jit.cache.key", "mono_jit.cache.stats")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("name", ["build_cmds.py", "store_cmds.py", "info_cmds.py", "main.py", "options.py",
                                  "context.py", "progress.py"])
def test_the_cli_reaches_into_no_internals(name):
    reached = sorted(m for m in _imports(REPO / "cli" / name) if m.startswith(INTERNALS))
    assert reached == [], f"cli/{name} imports {reached}: call mono_jit.api instead"


COMMANDS = [
    (("prebuild", "--template", "router"), "prebuild"), (("verify", "--rebuild"), "verify"),
    (("explain", "--template", "router"), "explain"), (("list",), "list_entries"), (("inspect", "abcd"), "find_entry"),
    (("gc", "--dry-run"), "gc"), (("clear", "--yes"), "clear"), (("export", "b.tar"), "export"),
    (("import", __file__), "import_bundle"), (("doctor",), "doctor"), (("stats",), "stats"),
]


@pytest.mark.parametrize("args, function", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_each_command_calls_its_api_function(monkeypatch, tmp_path, args, function):
    calls = []

    def recorder(*a, **kw):
        calls.append((a, kw))
        raise MonoJitError(f"{function} was called")

    monkeypatch.setattr(api, function, recorder)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(tmp_path / "c")])
    assert result.exit_code == 1 and f"mono-jit: error: {function} was called" in result.output, result.output
    assert len(calls) == 1 and calls[0][1]["settings"].writable_root == tmp_path / "c"
    if function == "verify":
        assert calls[0][1]["rebuild"] is True and calls[0][1]["progress"] is not None


class Recorder:
    """A mono_jit.progress.Progress that keeps what it hears."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.events: list[tuple[str, str]] = []

    def planned(self, total: int) -> None:
        self.total = total

    def finished(self, event: str, label: str, detail: str) -> None:
        self.events.append((event, label))


@pytest.mark.slow
def test_the_api_prebuilds_verifies_with_rebuild_and_explains_without_the_cli(warm_cache):
    settings = settings_at(warm_cache)
    heard = Recorder()
    built = api.prebuild(["router", "keytable"], ratios=[4], max_tokens=[1], settings=settings, progress=heard)
    assert built.ok and (built.hits, built.compiled, built.jobs) == (2, 0, 2) and heard.total == 2
    assert sorted(event for event, _ in heard.events) == ["hit", "hit"]
    heard = Recorder()
    checked = api.verify(rebuild=True, settings=settings, progress=heard)
    assert checked.bad == 0 and [row["identical"] for row in checked.rows] == [True] * 3
    assert heard.total == 3 and [event for event, _ in heard.events] == ["identical"] * 3
    assert api.explain("router", Spec(8, 4, 1024, 1), settings=settings).status == "hit"
    assert api.stats(settings=settings).counters["hits"] == 2
    assert [r["template"] for r in api.list_entries(["router"], settings=settings).entries] == ["router"]
    assert api.find_entry(checked.rows[0]["key"][:12], settings=settings).key == checked.rows[0]["key"]
    assert api.doctor(settings=settings).ok


def test_resolve_from_the_package_is_the_function_even_after_its_module_was_imported():
    code = ("import sys, types, mono_jit\nheavy = sorted(m for m in sys.modules if m.startswith(('mono_jit.api', "
            "'mono_jit.pipeline.resolve', 'mono_jit.cache')))\nimport mono_jit.pipeline.resolve\nfrom mono_jit import resolve\n"
            "from mono_jit.pipeline.resolve import resolve_many\nprint(heavy, callable(resolve), resolve.__module__, "
            "callable(resolve_many), type(mono_jit) is types.ModuleType)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] True mono_jit.pipeline.resolve True True", out.stdout


def readme_api_snippet() -> str:
    """docs/usage.md's "The Python API" code block, as the page has it (so the test cannot drift)."""
    text = (REPO / "docs" / "usage.md").read_text()
    after = text[text.index("The Python API:"):].split("\n")[1:]
    block = itertools.takewhile(lambda line: not line or line.startswith("    "),
                                itertools.dropwhile(lambda line: not line.startswith("    "), after))
    return textwrap.dedent("\n".join(block)).strip() + "\n"


@pytest.mark.slow
def test_the_readme_api_snippet_runs_as_written(warm_cache, tmp_path):
    snippet = readme_api_snippet()
    assert snippet.startswith("from mono_jit import Spec, api\n") and "api.verify(rebuild=True)" in snippet
    script = tmp_path / "api_snippet.py"
    script.write_text(snippet)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env["MONO_JIT_CACHE_DIR"] = str(warm_cache)
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "miss not in any layer", done.stdout
    assert lines[-1] == "[('toolchain', True), ('cache', True), ('templates', True)]", done.stdout
