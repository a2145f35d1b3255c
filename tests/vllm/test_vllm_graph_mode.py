"""The README's `vllm serve` line makes vLLM 0.33.0 capture FULL decode graphs, and inside such a
capture the hook calls the runner; PIECEWISE graphs take vLLM's path.

Real vLLM: the line is read from README.md and parsed by `vllm serve`'s own argument parser
(`make_arg_parser`) into `AsyncEngineArgs`; its `CompilationConfig` then goes where the GPU
model runner takes it: the cudagraph mode resolved against the graph support of the attention
backends of the tiny model's real ROCm DeepSeek-V4 layers (`resolve_cudagraph_mode_and_sizes`),
the capture sizes vLLM sets (`VllmConfig._set_cudagraph_sizes`), the `CudagraphDispatcher`'s
keys and its dispatch of a uniform decode batch; the step runs the real layer under vLLM's
forward context in the runtime mode dispatched.

Not vLLM's: the capture itself (`torch.cuda.is_current_stream_capturing` answers True: CPU torch
has no graphs), and `VllmConfig.__post_init__`'s graph settings, which on this CPU platform turn
every graph off (no static graph mode on a CPU); on ROCm that post-init changes the mode only for
prefill context parallelism, a pooling or encoder-decoder model, a KV connector, or
`--enforce-eager` (mode NONE: every step eager, which the hook takes too, `test_vllm_hook.py`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import torch
from cpu_vllm import make_step, make_vllm_config, mark_fallback, record_declines, stub_weights

README = Path(__file__).resolve().parents[2] / "README.md"
ROWS = 8  # a decode batch of 8 requests, one token each: a capture size


def readme_serve_commands() -> list[tuple[dict[str, str], list[str]]]:
    """Every complete `vllm serve` command of the README (one with `...` in it is a sketch): its
    environment assignments and the arguments after `vllm serve`, continuation lines joined."""
    commands = []
    for line in README.read_text().replace("\\\n", " ").splitlines():
        if "vllm serve " not in line or "..." in line:
            continue
        words = shlex.split(line)
        at = words.index("serve")
        assert words[at - 1] == "vllm", line
        commands.append((dict(word.split("=", 1) for word in words[: at - 1]), words[at + 1:]))
    return commands


def readme_serve_line() -> tuple[dict[str, str], list[str]]:
    """The command of Serving through vLLM's **Serve** (the README's second; Set-up's is first)."""
    return readme_serve_commands()[1]


def engine_args(args: list[str]):
    """`vllm serve ARGS` as vLLM 0.33 parses them (its serve command then takes the positional
    model tag as the model)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    parsed.model = parsed.model_tag
    return AsyncEngineArgs.from_cli_args(parsed)


def dispatched_mode(tiny_model, compilation_config, rows: int):
    """The CUDA-graph runtime mode vLLM's dispatcher gives a uniform decode batch of `rows`
    requests, for `compilation_config` resolved as the GPU model runner resolves it against
    the tiny model's attention backends."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    layers = get_layers_from_vllm_config(tiny_model.config, AttentionLayerBase)
    support, backend = AttentionCGSupport.ALWAYS, None
    for layer in layers.values():
        attn_backend = layer.get_attn_backend()
        level = attn_backend.get_builder_cls().get_cudagraph_support(tiny_model.config,
                                                                     layer.get_kv_cache_spec(tiny_model.config))
        if level.value < support.value:
            support, backend = level, attn_backend.__name__
    # This CPU host gives the SWA layers vLLM's CPU metadata builder; on ROCm they get its
    # ROCm one: its graph support counts too.
    from vllm.models.deepseek_v4.amd.rocm import DeepseekV4ROCMAiterSparseSWAMetadataBuilder

    swa = next(layer for name, layer in layers.items() if name.endswith(".swa_cache"))
    rocm_swa = DeepseekV4ROCMAiterSparseSWAMetadataBuilder.get_cudagraph_support(
        tiny_model.config, swa.get_kv_cache_spec(tiny_model.config))
    if rocm_swa.value < support.value:
        support, backend = rocm_swa, DeepseekV4ROCMAiterSparseSWAMetadataBuilder.__name__
    assert support == AttentionCGSupport.UNIFORM_BATCH, (support, backend)  # FULL graphs for uniform batches
    cfg = make_vllm_config()
    object.__setattr__(cfg, "compilation_config", compilation_config)
    cfg.model_config.enforce_eager = False
    cfg._set_cudagraph_sizes()
    mode = compilation_config.resolve_cudagraph_mode_and_sizes(support, backend, 1,
                                                               max_num_reqs=cfg.scheduler_config.max_num_seqs)
    dispatcher = CudagraphDispatcher(cfg)
    dispatcher.initialize_cudagraph_keys(mode, 1)
    runtime_mode, batch = dispatcher.dispatch(rows, uniform_decode=True)
    assert batch.num_tokens == rows
    return mode, runtime_mode


def capture_step(tiny_model, run_step, monkeypatch, runtime_mode) -> tuple[list, list]:
    """An eager warm-up step (vLLM warms every graph size up before capturing it), then the
    step captured in `runtime_mode`: (the fallback calls, the hook's declines) of the capture."""
    layer = tiny_model.layers[4]
    stub_weights(monkeypatch, layer)
    run_step(layer, make_step(layer, ROWS), "NONE")
    fallback = mark_fallback(monkeypatch, layer)
    declines = record_declines(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    run_step(layer, make_step(layer, ROWS), str(runtime_mode))
    return fallback, declines


@pytest.mark.parametrize("index", [0, 1])
def test_the_readme_serve_lines_parse_to_full_decode_graphs_with_monokernel(index):
    commands = readme_serve_commands()
    assert len(commands) == 2, commands  # Set-up's and Serving through vLLM's
    env, args = commands[index]
    engine = engine_args(args)
    from vllm.config import CUDAGraphMode

    assert env == {"VLLM_ROCM_USE_AITER": "1"}
    assert engine.model == "deepseek-ai/DeepSeek-V4-Pro" and engine.monokernel
    assert engine.tensor_parallel_size == 8 and engine.kv_cache_dtype == "fp8" and not engine.enforce_eager
    assert engine.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_the_readme_configuration_reaches_the_runner_in_a_capture(tiny_model, served_runner, run_step,
                                                                   monkeypatch):
    from vllm.config import CUDAGraphMode

    _, args = readme_serve_line()
    mode, runtime_mode = dispatched_mode(tiny_model, engine_args(args).compilation_config, ROWS)
    assert mode == CUDAGraphMode.FULL_DECODE_ONLY and runtime_mode == CUDAGraphMode.FULL
    fallback, declines = capture_step(tiny_model, run_step, monkeypatch, runtime_mode)
    assert fallback == [] and declines == []
    assert len(served_runner.calls.built) == 1 and len(served_runner.calls.forwards) == 2  # warm-up, capture


def test_piecewise_graphs_take_vllms_path_in_a_capture(tiny_model, served_runner, run_step, monkeypatch):
    """PIECEWISE on this model (not torch.compiled) is vLLM's breakable capture: the decode
    batch dispatches PIECEWISE, and the hook declines it."""
    from vllm.config import CUDAGraphMode

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    _, args = readme_serve_line()
    args = [a for a in args if not a.startswith("{") and a != "--compilation-config"]
    mode, runtime_mode = dispatched_mode(tiny_model, engine_args([*args, "-cc.cudagraph_mode=PIECEWISE"])
                                         .compilation_config, ROWS)
    assert mode == CUDAGraphMode.PIECEWISE and runtime_mode == CUDAGraphMode.PIECEWISE
    fallback, declines = capture_step(tiny_model, run_step, monkeypatch, runtime_mode)
    assert declines == ["PIECEWISE step"] and len(fallback) == 1
    assert len(served_runner.calls.forwards) == 1  # the eager warm-up only
