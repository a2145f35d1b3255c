"""The mono-jit CLI: argument errors, --json output, and the full round trip."""

import json

import pytest
from click.testing import CliRunner

from mono_jit.cli import main


def run(*args, code=0):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    return result


@pytest.mark.parametrize("args, option", [
    (["prebuild", "--max-tokens", "1,x"], "--max-tokens"),
    (["prebuild", "--max-tokens", "100"], "max_tokens=100"),
    (["prebuild", "--ratio", "8"], "ratio=8"),
    (["prebuild", "--tp", "3"], "tp=3"),
    (["prebuild", "--template", "nope"], "--template"),
    (["prebuild", "--jobs", "0"], "--jobs"),
    (["prebuild", "--arch", "gfx942"], "--arch"),
    (["gc", "--max-size", "lots"], "--max-size"),
    (["gc", "--older-than", "soon"], "--older-than"),
    (["inspect", "zz"], "KEY"),
])
def test_bad_arguments_exit_2_naming_the_option(args, option):
    result = run(*args, code=2)
    assert option in result.output


@pytest.mark.slow
def test_round_trip(warm_cache, tmp_path):
    cache = ["--cache-dir", str(warm_cache)]
    summary = json.loads(run("prebuild", "--max-tokens", "1", "--tp", "8", "--json", *cache,
                             "--template", "router,keytable").stdout)
    assert summary["compiled"] == 0 and summary["failed"] == 0 and summary["hits"] == 3
    assert {"key", "template", "spec", "path"} <= set(summary["entries"][0])
    listed = json.loads(run("list", "--json", *cache).stdout)["entries"]
    assert len(listed) == 3
    run("verify", *cache)
    key = listed[0]["key"]
    assert json.loads(run("inspect", key[:12], "--json", *cache).stdout)["key"] == key
    bundle = tmp_path / "cache.tar.gz"
    run("export", str(bundle), *cache)
    assert json.loads(run("clear", "--json", "--yes", *cache).stdout)["removed"] == 3
    assert json.loads(run("list", "--json", *cache).stdout)["entries"] == []
    assert json.loads(run("import", str(bundle), "--json", *cache).stdout)["imported"] == 3
    verified = json.loads(run("verify", "--rebuild", "--json", *cache).stdout)
    assert verified["bad"] == 0 and all(row["identical"] for row in verified["entries"])


def test_explain_reports_hit_and_factor_differences(warm_cache):
    cache = ["--cache-dir", str(warm_cache)]
    hit = json.loads(run("explain", "--template", "router", "--max-tokens", "1", "--json", *cache).stdout)
    assert hit["status"] == "hit" and hit["schema"] == "mono-jit-explain/1"
    miss = json.loads(run("explain", "--template", "router", "--max-tokens", "2", "--json", *cache).stdout)
    assert miss["status"] == "miss" and miss["miss_kind"] == "not in any layer"
    assert [d["factor"] for d in miss["differences"]] == ["spec.max_tokens"]


def test_gc_by_size_and_config_and_doctor(warm_cache):
    cache = ["--cache-dir", str(warm_cache)]
    dry = json.loads(run("gc", "--max-size", "1K", "--dry-run", "--json", *cache).stdout)
    assert len(dry["removed"]) == 3 and dry["dry_run"]
    assert len(json.loads(run("list", "--json", *cache).stdout)["entries"]) == 3
    run("gc", "--older-than", "1d", *cache)
    assert len(json.loads(run("list", "--json", *cache).stdout)["entries"]) == 3
    settings = {row["name"]: row for row in json.loads(run("config", "--json").stdout)["settings"]}
    assert settings["offline"]["source"] == "default" and settings["cache_dir"]["source"] == "env"
    doctor = json.loads(run("doctor", "--json", *cache).stdout)
    assert doctor["ok"], doctor


def _hip_loadable() -> bool:
    from mono_jit.runtime.hip import Hip, HipError

    try:
        Hip.get()
    except HipError:
        return False
    return True


@pytest.mark.skipif(_hip_loadable(), reason="this host has a HIP runtime: selftest checks the GPU instead")
def test_selftest_without_a_gpu_says_why_in_one_check_and_exits_1(warm_cache):
    out = run("selftest", "--json", "--cache-dir", str(warm_cache), code=1)
    report = json.loads(out.stdout)
    assert not report["ok"] and [c["check"] for c in report["checks"]] == ["hip"]
    assert "libamdhip64" in report["checks"][0]["detail"] and "Traceback" not in out.output
    assert "no GPU here (no HIP runtime): the device, the kernel loads and the launch checks were not run; " \
           "mono-jit selftest --emulate runs the same launch checks" in out.stderr, out.stderr
    assert "tests" not in out.stderr.replace("tests ", "")  # no source checkout's tests/ looked for
