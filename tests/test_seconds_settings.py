"""Every setting and option that takes seconds refuses what is not a finite number of seconds
within its range (NaN fails every comparison, so a bare `value <= 0` let it through): one line
naming the value, at `mono-jit config` and before any work. No seconds setting takes "no limit":
each is bounded, so a lock wait or a peer wait always ends."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from mono_jit import api
from mono_jit.cli import main
from mono_jit.config import SECONDS_MAX, Settings
from mono_jit.errors import MonoJitError

SECONDS_SETTINGS = ("MONO_JIT_LOCK_TIMEOUT", "MONO_JIT_COMPILE_TIMEOUT", "MONO_JIT_REMOTE_TIMEOUT",
                    "MONO_JIT_PEER_WAIT")
NOT_SECONDS = ("nan", "NaN", "inf", "-inf", "infinity", "1e309", "1e300", str(SECONDS_MAX * 2))


@pytest.mark.parametrize("bad", NOT_SECONDS)
@pytest.mark.parametrize("var", SECONDS_SETTINGS)
def test_a_seconds_setting_refuses_what_is_not_a_bounded_finite_number(var, bad, tmp_path):
    with pytest.raises(MonoJitError, match=rf"^{var}='{bad}': expected .*seconds"):
        Settings({var: bad})
    result = CliRunner().invoke(main, ["config"], env={var: bad, "MONO_JIT_CACHE_DIR": str(tmp_path)})
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"mono-jit: error: {var}='{bad}': expected"), result.output


@pytest.mark.parametrize("var", SECONDS_SETTINGS)
def test_a_seconds_setting_takes_a_day_at_most_and_the_peer_wait_less(var):
    """One day is the longest wait any setting takes; K2's peer wait is i32 microseconds."""
    name = var.removeprefix("MONO_JIT_").lower()
    assert getattr(Settings({var: "1.5"}), name) == 1.5
    if var != "MONO_JIT_PEER_WAIT":
        assert getattr(Settings({var: str(SECONDS_MAX)}), name) == SECONDS_MAX
    assert math.isfinite(getattr(Settings({}), name))  # the defaults are bounded too


@pytest.mark.parametrize("bad", NOT_SECONDS + ("0.5", "0", "-1"))
@pytest.mark.parametrize("command", [["prebuild", "--template", "router", "--max-tokens", "1", "--ratio", "4"],
                                     ["verify", "--rebuild"]])
def test_timeout_options_refuse_what_is_not_a_bounded_finite_number(command, bad, tmp_path):
    result = CliRunner().invoke(main, [*command, "--timeout", bad, "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and f"'{bad}'" in result.output, result.output
    assert not (tmp_path / "cache").exists()  # refused before any work


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_the_api_refuses_a_timeout_that_is_not_a_bounded_finite_number(bad, tmp_path):
    settings = Settings({"MONO_JIT_CACHE_DIR": str(tmp_path / "cache")})
    with pytest.raises(MonoJitError, match="timeout.*expected"):
        api.prebuild(["router"], max_tokens=[1], ratios=[4], timeout=bad, settings=settings)
    with pytest.raises(MonoJitError, match="timeout.*expected"):
        api.verify(rebuild=True, timeout=bad, settings=settings)
    assert not (tmp_path / "cache").exists()


def test_the_vllm_plugin_stays_off_with_a_nan_peer_wait(monkeypatch, caplog):
    """Before, NaN passed and every rank died at its first K2 launch inside vLLM's forward."""
    import sys

    from mono_jit.vllm import register
    from mono_jit.vllm.finder import RunnerFinder

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, RunnerFinder)])
    monkeypatch.setenv("MONO_JIT_PEER_WAIT", "nan")
    register()
    assert not any(isinstance(f, RunnerFinder) for f in sys.meta_path)
    assert "MONO_JIT_PEER_WAIT='nan'" in caplog.text
