"""explain, inspect, list and verify on a lean host (no torch, FlyDSL or numpy):
they work from the toolchains recorded in the layers and say what they cannot do there."""

from __future__ import annotations

import json

from test_lean_install import built_wheel, lean_python, run  # noqa: F401 (the fixtures)

CLI = "import sys; from mono_jit.cli import main; sys.argv = ['mono-jit', *{}]; main()"


def mono_jit(python, cache, *args):
    return run(python, CLI.format(list(args)), cache)


def test_explain_on_a_lean_host_uses_the_recorded_toolchains_and_says_so(lean_python, warm_cache):
    hit = mono_jit(lean_python, warm_cache, "explain", "--template", "router", "--json")
    assert hit.returncode == 0, hit.stderr[-2000:]
    report = json.loads(hit.stdout)
    assert report["status"] == "hit" and report["toolchain"].startswith("recorded in the layers (1)")
    miss = mono_jit(lean_python, warm_cache, "explain", "--template", "router", "--max-tokens", "2")
    assert miss.returncode == 0 and miss.stdout.startswith("miss (not in any layer): router("), miss.stdout
    assert "note: keys computed with the toolchains recorded in the layers" in miss.stderr, miss.stderr


def test_inspect_and_list_on_a_lean_host_say_it_cannot_compile(lean_python, warm_cache):
    listed = mono_jit(lean_python, warm_cache, "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    data = json.loads(listed.stdout)
    assert "serves hits only" in data["cannot_compile"] and len(data["entries"]) == 3
    key = data["entries"][0]["key"]
    shown = mono_jit(lean_python, warm_cache, "inspect", key[:10])
    assert shown.returncode == 0 and f"key        {key}" in shown.stdout, shown.stderr[-2000:]
    assert "note: no FlyDSL here: this host serves hits only" in shown.stderr
    assert "verify --rebuild cannot recompile this entry here" in shown.stderr


def test_verify_rebuild_on_a_lean_host_is_one_line(lean_python, warm_cache):
    out = mono_jit(lean_python, warm_cache, "verify", "--rebuild")
    assert out.returncode == 1 and out.stdout == "", out.stdout
    assert out.stderr == ("mono-jit: error: verify with rebuild recompiles every entry: no FlyDSL here: this host "
                          "serves hits only; install mono-jit's wheel with its build extra to compile\n"), out.stderr
