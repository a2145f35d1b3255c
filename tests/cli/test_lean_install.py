"""mono-jit as a serving image gets it: the README's wheel, built by its command from the
checkout and installed into a fresh venv with no checkout on the path. A lean serving host
(mono-jit's base dependencies only: no torch, no FlyDSL, no numpy) serves hits from a warm
cache (resolve, list, verify) and says in one line what it cannot do; a host with the extras
serves an image layer's hits, checks the whole grid and runs `selftest` from the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from mono_jit.cli import main

ROOT = Path(__file__).resolve().parents[2]
# The README's recipe: the wheel built once in the checkout, then installed where it serves.
BUILD_WHEEL = ".venv/bin/python -m pip wheel --no-deps -w dist ."
WHEEL = "mono_jit-0.1.0-py3-none-any.whl"
INSTALLS = (f"pip install 'dist/{WHEEL}[build]'", f"pip install dist/{WHEEL}")
# The base install's dependencies (pyproject) and theirs, by import name.
LEAN = ("platformdirs", "click", "msgpack", "elftools", "rich", "markdown_it", "mdurl", "pygments")
OURS = Path(sysconfig.get_paths()["purelib"])  # this test venv's packages


def test_the_readme_gives_the_commands_tested_here():
    readme = (ROOT / "README.md").read_text()
    assert BUILD_WHEEL in readme and all(command in readme for command in INSTALLS)
    assert "pip install mono-jit" not in readme.replace("`pip install mono-jit` would", "")


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """What a copy of the checkout leaves out: tools' folders anywhere, and setuptools' build/ at
    the root (mono_jit/pipeline/ is a package)."""
    left = set(shutil.ignore_patterns(".venv", ".git", "dist", "*.egg-info", "__pycache__", ".pytest_cache")(
        folder, names))
    return left | ({"build"} & set(names) if Path(folder) == ROOT else set())


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """The README's wheel, built by its command in a copy of the checkout (the build leaves no
    build/ folder in this one)."""
    source = tmp_path_factory.mktemp("checkout") / "mono-jit"
    shutil.copytree(ROOT, source, ignore=_not_copied)
    command = [sys.executable, *BUILD_WHEEL.split()[1:]]  # the set-up's python is the one running this test
    built = subprocess.run(command, cwd=source, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return source / "dist" / WHEEL


def installed(folder: Path, wheel: Path) -> Path:
    """A fresh venv at `folder` with the wheel installed (no dependencies): its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return python


def site_packages(python: Path) -> Path:
    return next((python.parent.parent / "lib").glob("python*/site-packages"))


@pytest.fixture(scope="module")
def lean_python(built_wheel, tmp_path_factory) -> Path:
    """A venv holding the wheel and LEAN only."""
    python = installed(tmp_path_factory.mktemp("lean") / "venv", built_wheel)
    for name in LEAN:
        (site_packages(python) / name).symlink_to(OURS / name)
    return python


@pytest.fixture(scope="module")
def wheel_python(built_wheel, tmp_path_factory) -> Path:
    """A venv holding the wheel, with every dependency and extra (build, emulate) reached through
    this test venv's folder on its path (its .pth files, the editable checkout's among them, are
    not read: the wheel's mono_jit is the one imported)."""
    python = installed(tmp_path_factory.mktemp("wheel") / "venv", built_wheel)
    (site_packages(python) / "test-venv-packages.pth").write_text(f"{OURS}\n")
    return python


def outside(cache: Path) -> Path:
    """A folder to run in that is not the checkout (`python -c` puts its folder on the path)."""
    return next(folder for folder in cache.parents if folder.is_dir())


def run(python: Path, code: str, cache: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -c code` outside the checkout, with only `env` of mono-jit's settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_") and k != "PYTHONPATH"}
    clean["MONO_JIT_CACHE_DIR"] = str(cache)
    return subprocess.run([str(python), "-c", code], env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=300, cwd=outside(cache))


def mono_jit(python: Path, cache: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed `mono-jit` script of `python`'s venv."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_") and k != "PYTHONPATH"}
    return subprocess.run([str(python.parent / "mono-jit"), *args],
                          env={**clean, "MONO_JIT_CACHE_DIR": str(cache), **(env or {})}, capture_output=True,
                          text=True, timeout=300, cwd=outside(cache))


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
    assert out.returncode == 0 and "cannot be compiled here" in out.stdout and "build extra" in out.stdout, \
        out.stdout + out.stderr[-2000:]
    assert "--max-tokens 2 --arch gfx950 on a build machine" in out.stdout and "mono-jit import here" in out.stdout


def test_doctor_on_a_lean_host_says_it_serves_hits_only(lean_python, warm_cache):
    code = ("import sys; from mono_jit.cli import main; sys.argv = ['mono-jit', 'doctor', '--json']; main()")
    out = run(lean_python, code, warm_cache)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    checks = {c["check"]: c for c in json.loads(out.stdout)["checks"]}
    assert checks["toolchain"]["ok"] and "serves hits only" in checks["toolchain"]["detail"]
    assert checks["cache"]["ok"] and checks["cache"]["detail"]["entries"] == 3


# -- the wheel -----------------------------------------------------------------------------------

def test_the_wheel_holds_every_package_of_the_source_and_declares_its_extras(built_wheel):
    names = zipfile.ZipFile(built_wheel).namelist()
    folders = {"mono_jit": ROOT / "mono_jit", "mono_jit/cache": ROOT / "cache", "mono_jit/cli": ROOT / "cli"}
    for installed_as, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            package = f"{installed_as}/{init.parent.relative_to(folder).as_posix()}".rstrip("/.")
            assert f"{package}/__init__.py" in names, f"{package} is not in the wheel"
    metadata = zipfile.ZipFile(built_wheel).read("mono_jit-0.1.0.dist-info/METADATA").decode()
    assert all(f"Provides-Extra: {extra}" in metadata for extra in ("build", "emulate"))
    assert not any(name.startswith(("tests/", "bench/")) for name in names)


@pytest.fixture
def image_layer(warm_cache, tmp_path) -> dict[str, str]:
    """A serving image's settings: the warm cache published as an image layer, offline, and no
    writable cache folder (a file where it would go)."""
    layer = tmp_path / "opt-mono-jit"
    built = CliRunner().invoke(main, ["prebuild", "--template", "router,keytable", "--ratio", "4,128",
                                      "--max-tokens", "1", "--image-layer", str(layer), "--cache-dir", str(warm_cache)])
    assert built.exit_code == 0, built.output
    (tmp_path / "no-home").write_text("")
    return {"MONO_JIT_CACHE_PATH": str(layer), "MONO_JIT_OFFLINE": "1"}


def test_the_installed_wheel_serves_an_image_layer_with_no_checkout_on_the_path(wheel_python, image_layer,
                                                                                tmp_path):
    cache = tmp_path / "no-home" / "cache"
    where = run(wheel_python, "import mono_jit; print(mono_jit.__file__)", cache, image_layer)
    assert where.stdout.startswith(str(wheel_python.parent.parent)), where.stdout + where.stderr
    check = mono_jit(wheel_python, cache, "prebuild", "--check", "--template", "router,keytable", "--max-tokens", "1",
                     env=image_layer)
    assert check.returncode == 0 and check.stderr == "", check.stdout + check.stderr
    assert check.stdout.startswith("3 builds: 3 hits, 0 misses"), check.stdout
    listed = mono_jit(wheel_python, cache, "list", "--json", env=image_layer)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["entries"]) == 3, listed.stderr
    hit = run(wheel_python, "from mono_jit import Spec, resolve\n"
                            "print(resolve('keytable', Spec(8, 128, 8192, 1)).compiled)", cache, image_layer)
    assert hit.returncode == 0 and hit.stdout == "False\n", hit.stderr[-2000:]


@pytest.mark.slow
def test_selftest_runs_from_the_installed_wheel(wheel_python, image_layer, tmp_path):
    """No GPU here: selftest says what it could not check (never looking for a source checkout's
    tests); --emulate runs the launch checks that come with the wheel."""
    cache = tmp_path / "no-home" / "cache"
    device = mono_jit(wheel_python, cache, "selftest", env=image_layer)
    assert device.returncode == 1 and "Traceback" not in device.stderr, device.stderr
    assert device.stdout.startswith("BAD hip: no HIP runtime") and "selftest --emulate runs the same launch checks" \
        in device.stderr, device.stdout + device.stderr
    emulated = mono_jit(wheel_python, cache, "selftest", "--emulate", "--template", "router", "--max-tokens", "1",
                        "--ratio", "4", env=image_layer)
    assert emulated.returncode == 0, emulated.stdout + emulated.stderr[-2000:]
    assert emulated.stdout.rstrip().endswith("1 of 1 kernels match their references on the emulator")
