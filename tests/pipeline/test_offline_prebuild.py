"""`MONO_JIT_OFFLINE=1` keeps lookups (resolve, serving) from compiling; `mono-jit prebuild` is
the command its miss error names, so it still compiles, and says so in one line."""

from __future__ import annotations

from click.testing import CliRunner

from golden_pool import PREBUILD
from mono_jit.cli import main

NOTE = ("mono-jit: note: MONO_JIT_OFFLINE=1 keeps lookups (resolve, serving) from compiling, not prebuild: "
        "3 builds compiled here\n")


def test_a_prebuild_that_compiles_under_offline_says_so_in_one_line(golden_pool, tmp_path):
    result = CliRunner().invoke(main, [*PREBUILD, "--cache-dir", str(tmp_path / "c")], env={"MONO_JIT_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    assert result.stderr.endswith(NOTE) and result.stderr.count("OFFLINE") == 1, result.stderr
    again = CliRunner().invoke(main, [*PREBUILD, "--cache-dir", str(tmp_path / "c")], env={"MONO_JIT_OFFLINE": "1"})
    assert again.exit_code == 0 and "OFFLINE" not in again.stderr, again.stderr  # all hits: nothing to say


def test_a_prebuild_without_offline_has_no_such_note(golden_pool, tmp_path):
    result = CliRunner().invoke(main, [*PREBUILD, "--cache-dir", str(tmp_path / "c")], env={"MONO_JIT_OFFLINE": "0"})
    assert result.exit_code == 0 and "OFFLINE" not in result.stderr, result.stderr
