"""One-line errors and one vocabulary: a bad path, a malformed
setting or an empty option is one line naming the value and what was expected."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mono_jit.cli import main
from mono_jit.config import Settings
from mono_jit.errors import MonoJitError


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_export_into_a_missing_folder_is_one_line(warm_cache, tmp_path):
    code, out = invoke("export", str(tmp_path / "missing" / "b.tar.gz"), "--cache-dir", str(warm_cache))
    assert code == 1 and out.count("\n") == 1 and out.startswith("mono-jit: error: ") and "missing" in out, out


def test_a_cache_dir_that_is_a_file_is_refused_by_name(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("MONO_JIT_CACHE_DIR", str(afile))
    code, out = invoke("list")
    assert code == 1 and "MONO_JIT_CACHE_DIR" in out and "not a folder" in out and out.count("\n") == 1, out


@pytest.mark.parametrize("word, value", [("1", True), ("ON", True), ("yes", True), ("0", False), ("off", False)])
def test_flags_take_the_usual_words(word, value):
    assert Settings({"MONO_JIT_OFFLINE": word}).offline is value


def test_a_flag_that_is_no_known_word_is_an_error_not_silently_off():
    with pytest.raises(MonoJitError, match=r"MONO_JIT_OFFLINE='enabled': expected one of 1, true"):
        Settings({"MONO_JIT_OFFLINE": "enabled"})
    result = CliRunner().invoke(main, ["config"], env={"MONO_JIT_OFFLINE": "enabled"})  # the CLI: one line
    assert result.exit_code == 1 and "MONO_JIT_OFFLINE='enabled'" in result.output


def test_the_peer_wait_is_thirty_seconds_unless_set_and_refused_out_of_k2s_range():
    """K2 takes the wait as i32 microseconds: 0.000001 to 2147.48 s; anything else is refused by name."""
    assert Settings({}).peer_wait == 30.0
    assert Settings({"MONO_JIT_PEER_WAIT": "2147.4"}).peer_wait == 2147.4
    for bad in ("2148", "0", "-1", "1e-7"):
        with pytest.raises(MonoJitError, match=rf"MONO_JIT_PEER_WAIT='{bad}': expected"):
            Settings({"MONO_JIT_PEER_WAIT": bad})
    result = CliRunner().invoke(main, ["config"], env={"MONO_JIT_PEER_WAIT": "1h"})  # the CLI: one line
    assert result.exit_code == 1 and "MONO_JIT_PEER_WAIT='1h'" in result.output
    assert result.output.count("\n") == 1, result.output


def test_an_empty_template_list_is_a_usage_error(tmp_path):
    code, out = invoke("prebuild", "--template", ",", "--cache-dir", str(tmp_path / "c"))
    assert code == 2 and "--template" in out and "expected at least one name" in out, out


def test_clear_json_needs_yes_and_removes_nothing_without_it(warm_cache):
    code, out = invoke("clear", "--json", "--cache-dir", str(warm_cache))
    assert code == 2 and "--yes" in out
    assert len(json.loads(invoke("list", "--json", "--cache-dir", str(warm_cache))[1])["entries"]) == 3


def test_a_malformed_setting_keeps_the_vllm_plugin_off_without_an_error():
    code = ("import sys, mono_jit.vllm as p\nfrom mono_jit.vllm.finder import RunnerFinder\np.register()\n"
            "print(any(isinstance(f, RunnerFinder) for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code], env={"MONO_JIT_VLLM": "maybe", "PATH": "/usr/bin"},
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False" and "plug-in is off" in out.stderr, out.stderr


def test_prebuild_off_a_terminal_logs_one_line_per_job(warm_cache):
    code, out = invoke("prebuild", "--template", "router,keytable", "--ratio", "4,128", "--max-tokens", "1",
                       "--cache-dir", str(warm_cache))
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert len(lines) == 3 and all(" hit " in line for line in lines), out
    assert lines[-1].startswith("[3/3] hit "), out


def test_list_shows_stale_entries_as_such(warm_cache, monkeypatch):
    from mono_jit.templates import get

    router = get("router")
    monkeypatch.setattr(type(router), "source_digest", lambda self, *a: "0" * 64)  # router's sources changed
    code, out = invoke("list", "--json", "--cache-dir", str(warm_cache))
    assert code == 0, out
    status = sorted((r["template"], r["status"]) for r in json.loads(out)["entries"])
    assert status == [("keytable", "ok"), ("keytable", "ok"), ("router", "stale")], status
    code, text = invoke("list", "--cache-dir", str(warm_cache))
    assert text.count("STALE") == 1 and "3 entries" in text, text
