"""`mono-jit prebuild --check`: the deployment's whole default grid resolved
offline from the layers, with FlyDSL unimportable, each miss printed with why, exit 1 on any
miss, --json; it builds, fetches and writes nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_settings import joined_grid, settings_at
from mono_jit import api
from mono_jit.cli import main
from mono_jit.pipeline.deployment import default_templates
from mono_jit.pipeline.prebuild import plan
from mono_jit.spec import deployment_grid
from mono_jit.templates import get
from mono_jit.pipeline.toolchain import resolve_toolchain

# The CLI in a process where FlyDSL cannot be imported (a lean serving image); it fails if
# anything of FlyDSL, MLIR or the compile side was loaded all the same.
NO_FLYDSL = """
import sys
sys.modules["flydsl"] = None  # import flydsl raises ModuleNotFoundError; find_spec says None
from mono_jit.cli import main
try:
    main(sys.argv[1:])
finally:
    loaded = [m for m in sys.modules if m.startswith(("flydsl.", "_mlir", "mono_jit.pipeline.compile", "mono_jit.pipeline.workers",
                                                      "mono_jit.pipeline.prebuild", "mono_jit.cache.lock"))]
    assert not loaded, loaded
"""


def _lean_check(root: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(MONO_JIT_CACHE_DIR=str(root), **settings)
    return subprocess.run([sys.executable, "-c", NO_FLYDSL, "prebuild", "--check", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def grid_cache(k1_cache, k2_cache, tmp_path) -> Path:
    """The deployment's whole default grid (k1 and k2, TP8, 1M context, every bucket) in one cache."""
    return joined_grid(k1_cache, k2_cache, tmp_path / "grid")


def _files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


def test_the_whole_default_grid_hits_without_flydsl_and_one_missing_entry_fails_by_name(grid_cache):
    before = _files(grid_cache)
    full = _lean_check(grid_cache, "--json")
    assert full.returncode == 0, full.stderr
    report = json.loads(full.stdout)
    assert report["schema"] == "mono-jit-prebuild-check/1" and report["ok"] is True
    assert (report["builds"], report["hits"], report["misses"]) == (21, 21, 0)
    assert {r["template"] for r in report["rows"]} == {"k1", "k2"}
    assert _files(grid_cache) == before  # nothing written, touched or stamped

    gone = next(r for r in report["rows"] if r["template"] == "k2" and r["spec"]["max_tokens"] == 16)
    shutil.rmtree(gone["path"])
    missed = _lean_check(grid_cache)
    assert missed.returncode == 1, missed.stdout + missed.stderr
    lines = missed.stdout.splitlines()
    assert lines[0] == f"miss {gone['label']}" and "no cache layer" in lines[1] and "FlyDSL" in lines[1], lines
    assert lines[-1].startswith("21 builds: 20 hits, 1 misses"), lines
    assert "Traceback" not in missed.stderr


def test_the_check_covers_exactly_what_prebuild_builds_and_names_every_miss(warm_cache):
    settings = settings_at(warm_cache)
    templates = [get(name) for name in default_templates(settings)]
    jobs, failures = plan(templates, deployment_grid(), resolve_toolchain(settings).fingerprint)
    assert not failures
    before = _files(warm_cache)
    report = api.check_grid(settings=settings)  # the warm cache holds router and keytable only
    assert sorted(r["label"] for r in report.rows) == sorted(job.label for job in jobs)
    assert len(report.misses) == len(jobs) == 21 and not report.ok
    assert all("not in the cache" in r["reason"] and "mono-jit prebuild --template" in r["reason"]
               for r in report.misses), report.misses[0]
    assert _files(warm_cache) == before  # no lock taken, nothing compiled or written


def test_the_check_hits_a_named_grid_and_refuses_build_options(warm_cache, tmp_path):
    ok = _lean_check(warm_cache, "--template", "router,keytable", "--max-tokens", "1")
    assert ok.returncode == 0 and ok.stdout.strip() == \
        "3 builds: 3 hits, 0 misses (looked up offline; nothing compiled, fetched or written)", ok.stdout + ok.stderr
    for option in (("--image-layer", str(tmp_path / "layer")), ("--jobs", "2")):
        result = CliRunner().invoke(main, ["prebuild", "--check", *option, "--cache-dir", str(warm_cache)])
        assert result.exit_code == 2 and f"{option[0]} does not apply" in result.output, result.output
    assert not (tmp_path / "layer").exists()


def test_the_readme_serving_stage_checks_an_image_layer_with_no_writable_folder(warm_cache, tmp_path):
    grid = ["--template", "router,keytable", "--max-tokens", "1"]
    layer = tmp_path / "opt-mono-jit"
    built = CliRunner().invoke(main, ["prebuild", *grid, "--image-layer", str(layer), "--cache-dir", str(warm_cache)])
    assert built.exit_code == 0, built.output
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    served = _lean_check(blocker / "cache", *grid, MONO_JIT_CACHE_PATH=str(layer), MONO_JIT_OFFLINE="1",
                         HOME=str(blocker))
    assert served.returncode == 0 and served.stdout.startswith("3 builds: 3 hits"), served.stdout + served.stderr
    assert _lean_check(blocker / "cache", "--template", "router", "--max-tokens", "1,2",
                       MONO_JIT_CACHE_PATH=str(layer)).returncode == 1
