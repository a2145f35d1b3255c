"""`mono-jit selftest --emulate`: the cache's kernels on the emulated gfx950 against their
references, one report a kernel, exit 1 when any disagrees or cannot run."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from mono_jit.cli import main

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")


def _selftest(cache, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["selftest", "--emulate", "--cache-dir", str(cache), *args])
    return result.exit_code, result.stdout, result.output


def test_the_cached_router_and_keytable_run_on_the_emulator_and_match(warm_cache, monkeypatch):
    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")  # the warm cache holds them: nothing compiles
    code, out, text = _selftest(warm_cache, "--template", "router,keytable", "--max-tokens", "1", "--json")
    assert code == 0, text
    report = json.loads(out)
    assert report["schema"] == "mono-jit-selftest/1" and report["ok"] and report["emulated"]
    kernels = report["kernels"]
    # router reads only max_tokens: one kernel for both ratios; keytable one a ratio
    assert [(k["template"], k["spec"]["ratio"]) for k in kernels] == [("router", 4), ("keytable", 4),
                                                                       ("keytable", 128)]
    for kernel in kernels:
        assert kernel["ok"] and kernel["problem"] is None and kernel["error"] <= kernel["bound"]
        assert kernel["wave_instructions"] > 1000 and kernel["bytes_read"] > 0 and kernel["seconds"] > 0


def test_a_kernel_that_disagrees_with_its_reference_fails_by_name(warm_cache, monkeypatch):
    """The router's reference moved by 10 %: the launch itself is fine, the comparison is not."""
    from mono_jit.selfcheck import cases

    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")
    real = cases.route
    monkeypatch.setattr(cases, "route", lambda *a: (real(*a)[0], real(*a)[1] * torch.tensor(1.1)))
    code, _, text = _selftest(warm_cache, "--template", "router", "--max-tokens", "1", "--ratio", "4")
    assert code == 1, text
    assert "FAIL router tp=8, ratio=4" in text and "Mismatched elements" in text
    assert "0 of 1 kernels match" in text and "Traceback" not in text


def test_a_kernel_missing_from_an_offline_cache_fails_and_the_others_still_run(warm_cache, monkeypatch):
    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")
    code, out, _ = _selftest(warm_cache, "--template", "router", "--max-tokens", "1,2", "--ratio", "4", "--json")
    assert code == 1
    kernels = json.loads(out)["kernels"]
    assert [k["ok"] for k in kernels] == [True, False]
    assert "offline" in kernels[1]["problem"].lower() and kernels[1]["wave_instructions"] == 0


@pytest.mark.slow
def test_k2_runs_on_eight_emulated_ranks_and_is_reported_as_the_others(k2_cache, monkeypatch):
    """HCA at bucket 1 (a hash layer: odd buckets take one) from the session's K2 cache: one
    kernel line with its figure (out's mean error) and the 8 ranks' counters."""
    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")
    code, out, text = _selftest(k2_cache, "--template", "k2", "--max-tokens", "1", "--ratio", "128", "--json")
    assert code == 0, text
    (kernel,) = json.loads(out)["kernels"]
    assert kernel["template"] == "k2" and kernel["spec"]["topk_width"] == 8192 and kernel["ok"], kernel
    assert kernel["measure"] == "out's mean abs error" and kernel["error"] <= kernel["bound"] == 3e-3
    assert kernel["wave_instructions"] > 8 * 10 ** 6 and kernel["bytes_read"] > 0


def test_k2_on_a_gpu_is_refused_with_the_reason(warm_cache, monkeypatch):
    """One process drives one GPU: K2's 8 ranks run only emulated."""
    from mono_jit.runtime.backends import EmulatorBackend

    monkeypatch.setattr("mono_jit.selfcheck.gpu.hip_runtime", lambda found: found.append(object()) or {})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.device_fits", lambda hip, index: {})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.load_every_kernel", lambda hip, settings: {})
    monkeypatch.setattr("mono_jit.selfcheck.device.DeviceBackend", lambda device: EmulatorBackend())
    result = CliRunner().invoke(main, ["selftest", "--template", "k2", "--cache-dir", str(warm_cache)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "K2 needs 8 GPUs: its launch check runs on 8 emulated ranks, with --emulate" in result.output


def test_selftest_on_a_gpu_runs_the_launch_checks_that_come_with_the_package(warm_cache, monkeypatch):
    """The GPU path without a GPU: HIP, the device and the loads stubbed, and the device backend
    replaced by the emulator's, so the launch checks (mono_jit.selfcheck) run as they would on an
    MI355X; no source checkout's tests/ is looked for."""
    from mono_jit.runtime.backends import EmulatorBackend

    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")
    monkeypatch.setattr("mono_jit.selfcheck.gpu.hip_runtime", lambda found: found.append(object()) or {})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.device_fits",
                        lambda hip, index: {"arch": "gfx950", "compute_units": 256})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.load_every_kernel", lambda hip, settings: {"loaded": 3})
    devices = []
    monkeypatch.setattr("mono_jit.selfcheck.device.DeviceBackend", lambda device: devices.append(device) or
                        EmulatorBackend())
    result = CliRunner().invoke(main, ["selftest", "--device", "3", "--template", "router,keytable", "--max-tokens",
                                       "1", "--cache-dir", str(warm_cache), "--json"])
    assert result.exit_code == 0, result.output
    checks = json.loads(result.stdout)["checks"]
    assert [c["check"] for c in checks] == ["hip", "device", "kernels", "launch checks"] and all(c["ok"] for c in checks)
    assert checks[-1]["detail"] == "3 kernels match their references on the device" and devices == [3, 3, 3]


def test_a_kernel_that_differs_on_the_device_fails_the_launch_checks_by_name(warm_cache, monkeypatch):
    from mono_jit.runtime.backends import EmulatorBackend
    from mono_jit.selfcheck import cases

    monkeypatch.setenv("MONO_JIT_OFFLINE", "1")
    monkeypatch.setattr("mono_jit.selfcheck.gpu.hip_runtime", lambda found: found.append(object()) or {})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.device_fits", lambda hip, index: {})
    monkeypatch.setattr("mono_jit.selfcheck.gpu.load_every_kernel", lambda hip, settings: {})
    monkeypatch.setattr("mono_jit.selfcheck.device.DeviceBackend", lambda device: EmulatorBackend())
    real = cases.route
    monkeypatch.setattr(cases, "route", lambda *a: (real(*a)[0], real(*a)[1] * torch.tensor(1.1)))
    result = CliRunner().invoke(main, ["selftest", "--template", "router", "--max-tokens", "1", "--ratio", "4",
                                       "--cache-dir", str(warm_cache)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "BAD launch checks: 1 of 1 kernels differ from their references on the device: router tp=8, ratio=4" \
        in result.output
