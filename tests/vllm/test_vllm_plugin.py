"""The plug-in's import finder without vLLM installed: a stand-in `vllm` package with only a
version, so these run in the base test command (tests/vllm/ has the tests against vLLM's
real classes)."""

from __future__ import annotations

import importlib
import logging
import sys
import types

import pytest

import mono_jit.vllm as plugin
from mono_jit.runtime import hip as hip_module
from mono_jit.runtime.hip import HipError
from mono_jit.runtime.runner import MonoRunner
from mono_jit.vllm.finder import RUNNER_MODULE, RunnerFinder

PARENTS = ["vllm", "vllm.models", "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.amd",
           "vllm.models.deepseek_v4.amd.mono"]


@pytest.fixture
def fake_vllm(monkeypatch):
    """Stand-in packages down to vLLM's mono package, a clean meta path, no served module yet."""
    for name in PARENTS:
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    sys.modules["vllm"].__version__ = "0.33.0"
    monkeypatch.delitem(sys.modules, RUNNER_MODULE, raising=False)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, RunnerFinder)])
    monkeypatch.setenv("MONO_JIT_BACKEND", "reference")
    return sys.modules["vllm"]


def finders() -> int:
    return sum(isinstance(f, RunnerFinder) for f in sys.meta_path)


def test_register_installs_one_finder_however_often_it_runs(fake_vllm):
    plugin.register()
    plugin.register()
    assert finders() == 1
    served = importlib.import_module(RUNNER_MODULE)
    assert served.MonoRunner is MonoRunner and served.BLOCKS == 256 and served.MAX_TOKENS == 64
    assert {"AttnWeights", "MonoLayerWeights"} <= set(vars(served))


def test_the_off_switch_leaves_vllms_module_alone(fake_vllm, monkeypatch):
    monkeypatch.setenv("MONO_JIT_VLLM", "0")
    plugin.register()
    assert finders() == 0


def test_another_vllm_version_defers_to_vllms_own_module(fake_vllm, monkeypatch, caplog):
    fake_vllm.__version__ = "0.34.0"
    monkeypatch.setattr(RunnerFinder, "_warned", False)
    plugin.register()
    with pytest.raises(ModuleNotFoundError):  # the stand-in vLLM has no file of its own to defer to
        importlib.import_module(RUNNER_MODULE)
    assert "written for vLLM 0.33.0, not 0.34.0" in caplog.text


def test_the_version_warning_reaches_vllms_handlers(fake_vllm, monkeypatch):
    """vLLM configures its `vllm` logger only: the one line saying why mono-jit stood aside must
    go out through its handlers, or a user never sees it."""
    lines: list[str] = []

    class Recorder(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    ours, theirs = logging.getLogger("mono_jit"), logging.getLogger("vllm")
    monkeypatch.setattr(theirs, "handlers", [Recorder()])
    monkeypatch.setattr(theirs, "level", logging.INFO)
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    fake_vllm.__version__ = "0.34.0"
    monkeypatch.setattr(RunnerFinder, "_warned", False)
    plugin.register()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(RUNNER_MODULE)
    assert any("written for vLLM 0.33.0, not 0.34.0" in line for line in lines)


def test_a_host_without_hip_refuses_with_an_import_error_vllm_reports(fake_vllm, monkeypatch):
    monkeypatch.setenv("MONO_JIT_BACKEND", "hip")

    def no_runtime(cls):
        raise HipError("no HIP runtime (libamdhip64) can be loaded: libamdhip64.so: cannot open shared object file")

    monkeypatch.setattr(hip_module.Hip, "get", classmethod(no_runtime))
    plugin.register()
    with pytest.raises(ImportError, match="mono-jit: no HIP runtime"):
        importlib.import_module(RUNNER_MODULE)


def test_register_imports_nothing_heavy():
    import subprocess

    code = ("import sys, mono_jit.vllm as p; p.register(); "
            "print(sorted(m for m in ('torch', 'flydsl', 'vllm', 'mono_jit.runtime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
