"""Fixtures for tests against vLLM 0.33.0's real classes on a CPU host.

Real: `DeepseekV4DecoderLayer` (built through its `__init__`, so the real
`MonoDecodeLayer.create` runs), the hook's `__call__` / `_decode_step`, `set_forward_context`,
the ROCm attention-metadata dataclasses and a 1-rank gloo TP group from vLLM's own set-up.
Faked, each in one place:

- `vllm_host` (session, autouse): `VLLM_TARGET_DEVICE=cpu`; a fake `amdsmi` naming a gfx950, so
  `vllm.platforms.rocm` imports and `get_cdna_version()` is 4; `torch.cuda.Event` a no-op (the
  indexer makes one in `__init__`); `torch.cuda.is_current_stream_capturing` -> False (it raises
  on CPU torch; `_mono_runner` calls it).
- `cpu_vllm.patch_deployment` / the `deployment` fixture: what `create()` reads from a GPU,
  AITER or a quantised checkpoint, set to an MI355X TP8 deployment.
- the runner module `vllm.models.deepseek_v4.amd.mono.runner` (the in-tree one needs FlyDSL
  and AITER): `runner_module` is a recording stand-in unless a test parametrises it (indirect)
  with a module or a zero-argument factory of one (e.g. mono-jit's); `served_runner` serves it.

Layers have tiny widths (hidden 1280, the smallest AITER's fused mHC + norm takes) with V4-Pro's
routing (384 experts, top-6, x2.5), layer kinds (0, 1 HCA; 2 CSA; 3 HCA; 4 CSA; 0-2 hash) and a
1M-token context; vLLM allocates weights with `torch.empty`, so 384 experts cost nothing until
touched. A tiny bf16 layer cannot pass `MonoDecodeLayer.weights()` (FP8 / MXFP4 layers cannot be
built on a CPU): tests hand the hook its weights with `cpu_vllm.stub_weights`.

The whole folder skips, with the reason, when vLLM is not installed.
"""

from __future__ import annotations

import socket
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from cpu_vllm import (
    LAYER_KINDS,
    RUNNER,
    VLLM_MISSING,
    Step,
    build_layer,
    fake_amdsmi,
    forward_context,
    make_vllm_config,
    no_cuda_event,
    patch_deployment,
    stand_in_runner_module,
)

HERE = Path(__file__).parent
_timings: dict[str, float] = {}
_measured: dict[str, float] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test of this folder, with the reason, when vLLM is not installed."""
    if VLLM_MISSING is None:
        return
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))


def pytest_terminal_summary(terminalreporter) -> None:
    """One line with the heavy fixtures' wall times (the folder's budget is about 60 s)."""
    if _timings:
        terminalreporter.write_line(
            "vLLM fixtures: " + ", ".join(f"{k} {v:.2f} s" for k, v in _timings.items())
        )
    if _measured:
        terminalreporter.write_line(
            "measured (worst case): " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(_measured.items()))
        )


@pytest.fixture
def measured() -> Callable[[str, float], None]:
    """measured(name, value): keep the worst (largest) value of `name` over the session's tests,
    printed in the summary: the figures behind a test's stated bounds."""

    def note(name: str, value: float) -> None:
        _measured[name] = max(value, _measured.get(name, value))

    return note


@contextmanager
def _timed(name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    _timings[name] = time.perf_counter() - start


@pytest.fixture(scope="session", autouse=True)
def vllm_host() -> Iterator[None]:
    """The CPU host made to look like what vLLM's ROCm modules import on (module docstring);
    undone at the end of the session. Skipped tests never set it up (skip marks apply first)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_TARGET_DEVICE", "cpu")
        assert "vllm.platforms.rocm" not in sys.modules, "imported before the fake amdsmi"
        platforms = sys.modules.get("vllm.platforms")
        assert getattr(platforms, "_current_platform", None) is None, \
            "vLLM resolved its platform before VLLM_TARGET_DEVICE=cpu: a test outside tests/vllm imported vLLM"
        mp.setitem(sys.modules, "amdsmi", fake_amdsmi())
        mp.setattr(torch.cuda, "Event", no_cuda_event())
        mp.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        yield


@pytest.fixture(scope="session")
def md(vllm_host) -> types.ModuleType:
    """`vllm.models.deepseek_v4.amd.mono_decode` (importing it and the ROCm model: ~5 s). Every
    fixture that touches vLLM depends on this one, so on `vllm_host` first."""
    with _timed("import"):
        import vllm.models.deepseek_v4.amd.model  # noqa: F401  (and vllm.platforms.rocm)
        from vllm.models.deepseek_v4.amd import mono_decode
    return mono_decode


@pytest.fixture(scope="session")
def model_module(md) -> types.ModuleType:
    """`vllm.models.deepseek_v4.amd.model` (`DeepseekV4DecoderLayer`)."""
    from vllm.models.deepseek_v4.amd import model

    return model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tp_group(md):
    """vLLM's TP group of this one process (`GroupCoordinator`): `init_distributed_environment`
    on a loopback gloo store, then `ensure_model_parallel_initialized(1, 1)`. Its `.cpu_group`
    is what `_mono_runner` hands the runner."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with _timed("tp group"), set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        ps.ensure_model_parallel_initialized(1, 1)
    yield ps.get_tp_group()
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.fixture(autouse=True)
def fresh_runner(md, monkeypatch) -> None:
    """`mono_decode._runner` (the process's one runner) is None at the start of every test and
    put back afterwards."""
    monkeypatch.setattr(md, "_runner", None)


@pytest.fixture
def deployment(md, monkeypatch) -> pytest.MonkeyPatch:
    """`patch_deployment` for this test; returns the monkeypatch, so a test can undo a fact."""
    patch_deployment(monkeypatch)
    return monkeypatch


@dataclass
class TinyModel:
    """The session's tiny model: its config (monokernel on) and layers 0-4 (`LAYER_KINDS`),
    built with `patch_deployment` in force, so each holds its `MonoDecodeLayer` (`.mono`)."""

    config: Any
    layers: dict[int, Any]


@pytest.fixture(scope="session")
def tiny_model(md, tp_group) -> TinyModel:
    """The real layers the tests share (built once per session)."""
    with _timed("tiny layers"), pytest.MonkeyPatch.context() as mp:
        patch_deployment(mp)
        mp.setitem(sys.modules, RUNNER, types.SimpleNamespace(BLOCKS=256))  # create() reads it
        cfg = make_vllm_config()
        layers = {i: build_layer(cfg, i) for i in LAYER_KINDS}
    return TinyModel(cfg, layers)


@pytest.fixture
def runner_module(request, md) -> types.ModuleType:
    """The module to serve as vLLM's runner module: `stand_in_runner_module()`, or, when a test
    parametrises this fixture indirectly, its parameter (a module, or a zero-argument factory
    of one)."""
    param = getattr(request, "param", None)
    if param is None:
        return stand_in_runner_module()
    return param if isinstance(param, types.ModuleType) else param()


@pytest.fixture
def served_runner(runner_module, monkeypatch) -> types.ModuleType:
    """`runner_module` importable as vLLM's `...amd.mono.runner`, for this test only."""
    monkeypatch.setitem(sys.modules, RUNNER, runner_module)
    return runner_module


@pytest.fixture
def run_step(tiny_model) -> Callable[..., Any]:
    """`run_step(layer, step, mode="FULL")`: the real `layer.forward(*step.args())` inside vLLM's
    forward context (`cpu_vllm.forward_context`) of the tiny model's config."""

    def run(layer, step: Step, mode: str = "FULL"):
        with forward_context(tiny_model.config, step, mode):
            return layer(*step.args())

    return run
