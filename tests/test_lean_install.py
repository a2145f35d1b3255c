"""A lean serving host: mono-jit's base dependencies only, no torch, no FlyDSL, no numpy. It
serves hits from a warm cache (resolve, list, verify) and says in one line what it cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# The base install's dependencies (pyproject) and theirs, by import name.
LEAN = ("platformdirs", "click", "msgpack", "elftools", "rich", "markdown_it", "mdurl", "pygments")


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory) -> Path:
    """A venv holding mono-jit (this checkout, as the dev venv installs it) and LEAN only."""
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    site = next((venv / "lib").glob("python*/site-packages"))
    for name in LEAN:
        (site / name).symlink_to(ours / name)
    editable = sorted(ours.glob("__editable__*mono_jit*"))
    assert editable, "mono-jit is not installed editable in the test venv"
    for path in editable + sorted(ours.glob("mono_jit-*.dist-info")):  # its entry points declare the templates
        (site / path.name).symlink_to(path)
    return venv / "bin" / "python"


def run(python: Path, code: str, cache: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env["MONO_JIT_CACHE_DIR"] = str(cache)
    return subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_lean_host_has_no_torch_and_no_flydsl(lean_python, tmp_path):
    out = run(lean_python, "import importlib.util as u; print([m for m in ('torch', 'flydsl', 'numpy') "
                           "if u.find_spec(m)])", tmp_path)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_lean_host_serves_hits_and_lists_and_verifies(lean_python, warm_cache):
    code = ("import json, sys\nfrom mono_jit import Spec, resolve\n"
            "r = resolve('router', Spec(tp=8, ratio=4, topk_width=1024, max_tokens=1))\n"
            "print(json.dumps({'compiled': r.compiled, 'bytes': len(r.hsaco),"
            " 'heavy': [m for m in ('torch', 'flydsl') if m in sys.modules]}))")
    out = run(lean_python, code, warm_cache)
    assert out.returncode == 0, out.stderr[-2000:]
    hit = json.loads(out.stdout)
    assert hit["compiled"] is False and hit["bytes"] > 0 and hit["heavy"] == []
    cli = "import sys; from mono_jit.cli import main; sys.argv = ['mono-jit', *{}]; main()"
    listed = run(lean_python, cli.format(["list", "--json"]), warm_cache)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["entries"]) == 3, listed.stderr[-2000:]
    verified = run(lean_python, cli.format(["verify"]), warm_cache)
    assert verified.returncode == 0 and "3 good, 0 bad" in verified.stdout, verified.stdout + verified.stderr


def test_a_lean_host_miss_says_it_cannot_compile_in_one_line(lean_python, warm_cache):
    code = ("from mono_jit import Spec, resolve\nfrom mono_jit.errors import MonoJitError\n"
            "try:\n    resolve('router', Spec(tp=8, ratio=4, topk_width=1024, max_tokens=2))\n"
            "except MonoJitError as exc:\n    print(exc)")
    out = run(lean_python, code, warm_cache)
    assert out.returncode == 0 and "cannot be compiled here" in out.stdout and "mono-jit[build]" in out.stdout, \
        out.stdout + out.stderr[-2000:]
    assert "--max-tokens 2 --arch gfx950 on a build machine" in out.stdout and "mono-jit import here" in out.stdout


def test_doctor_on_a_lean_host_says_it_serves_hits_only(lean_python, warm_cache):
    code = ("import sys; from mono_jit.cli import main; sys.argv = ['mono-jit', 'doctor', '--json']; main()")
    out = run(lean_python, code, warm_cache)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["toolchain"]["ok"] and "serves hits only" in checks["toolchain"]["detail"]
    assert checks["cache"]["ok"] and checks["cache"]["detail"]["entries"] == 3
