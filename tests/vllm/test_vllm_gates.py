"""`MonoDecodeLayer.create`, vLLM 0.33.0's real gates, reached through the real
`DeepseekV4DecoderLayer.__init__` with the real `KernelConfig` / `ParallelConfig`: off without
`--monokernel`, a `ValueError` naming the reason for a deployment that cannot run the kernels
(vLLM's startup refusal), None (the original path) for a layer the kernels do not take.

The runner module is `runner_module` (a stand-in with `BLOCKS = 256` unless parametrised): these
tests hold for any module the plug-in serves that imports and says 256 CTAs."""

from __future__ import annotations

import sys

import pytest
from cpu_vllm import HCA_WIDTH, LAYER_KINDS, NUM_LAYERS, RUNNER, build_layer, make_vllm_config


@pytest.fixture
def build(tp_group):
    """`build(index, **config)`: a fresh real layer of a fresh tiny-model config."""

    def make(index: int = 4, **config):
        return build_layer(make_vllm_config(**config), index)

    return make


def test_off_without_monokernel(build, monkeypatch):
    """No `--monokernel`: no hook, and the runner module is never imported (here it cannot
    be: None in sys.modules makes any import of it fail)."""
    monkeypatch.setitem(sys.modules, RUNNER, None)
    assert build(monokernel=False).mono is None


@pytest.mark.parametrize("index", sorted(LAYER_KINDS))
def test_accepts_mi355x_tp8(build, deployment, served_runner, md, index):
    layer = build(index)
    assert isinstance(layer.mono, md.MonoDecodeLayer)
    assert layer.mono.hca_width == HCA_WIDTH  # every compressed row of a 1M context
    assert md._runner is None  # the runner is made at the first decode step, not here


def test_hca_width_follows_max_model_len(tp_group, deployment, served_runner):
    cfg = make_vllm_config()
    cfg.model_config.max_model_len = 128 * 1000 + 1  # 1001 compressed rows -> 1024
    assert build_layer(cfg, 3).mono.hca_width == 1024


def _tp4(mp, md):
    mp.setattr(md, "get_tensor_model_parallel_world_size", lambda: 4)


def _cdna3(mp, md):
    import vllm.platforms.rocm

    mp.setattr(vllm.platforms.rocm, "get_cdna_version", lambda: 3)


def _triton_moe(mp, md):
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    mp.setattr(
        UnquantizedFusedMoEMethod, "mxfp4_backend", Mxfp4MoeBackend.AITER_TRITON_MXFP4_BF16
    )


def _fp8_linears_off(mp, md):
    from vllm._aiter_ops import rocm_aiter_ops

    mp.setattr(rocm_aiter_ops, "is_linear_fp8_enabled", classmethod(lambda cls: False))


def _no_runner(mp, md):
    mp.setitem(sys.modules, RUNNER, None)


@pytest.mark.parametrize(
    "undo, parallel, reason",
    [
        (_cdna3, {}, "--monokernel needs CDNA4."),
        (_tp4, {"tensor_parallel_size": 4}, "--monokernel needs tensor parallel size 8."),
        (
            lambda mp, md: None,
            {"tensor_parallel_size": 8, "enable_expert_parallel": True},
            "--monokernel needs tensor parallelism only: no expert or data parallelism.",
        ),
        (
            lambda mp, md: mp.setenv("VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4", "1"),
            {},
            "--monokernel needs AITER's A8W4 MoE (VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4 unset).",
        ),
        (
            _triton_moe,
            {},
            "--monokernel needs the AITER_MXFP4_BF16 MoE backend, "
            "not Mxfp4MoeBackend.AITER_TRITON_MXFP4_BF16.",
        ),
        (
            _fp8_linears_off,
            {},
            "--monokernel needs AITER's FP8 linears (VLLM_ROCM_USE_AITER_LINEAR).",
        ),
        (
            lambda mp, md: mp.setenv("VLLM_ROCM_FP8_PADDING", "0"),
            {},
            "--monokernel needs vLLM's padded FP8 weight rows (VLLM_ROCM_FP8_PADDING).",
        ),
        (
            _no_runner,
            {},
            f"--monokernel needs FlyDSL and AITER's FlyDSL helpers (import of {RUNNER} halted; "
            "None in sys.modules).",
        ),
        (
            lambda mp, md: mp.setattr(md, "_compute_units", lambda: 128),
            {},
            "--monokernel needs 256 compute units, the GPU has 128.",
        ),
    ],
    ids=[
        "cdna3",
        "tp4",
        "expert-parallel",
        "a4w4-moe",
        "moe-backend",
        "fp8-linears-off",
        "fp8-padding-off",
        "no-runner-module",
        "128-cus",
    ],
)
def test_refuses_deployment(deployment, served_runner, md, tp_group, undo, parallel, reason):
    """Each deployment fact undone alone refuses `--monokernel` at layer construction, with
    vLLM's reason."""
    undo(deployment, md)
    cfg = make_vllm_config(parallel=parallel or None)
    with pytest.raises(ValueError) as err:
        build_layer(cfg, 4)
    assert str(err.value) == reason


def test_draft_layer_is_declined(build, deployment, served_runner):
    assert build(NUM_LAYERS).mono is None  # model.layers.5: past num_hidden_layers (MTP)


def test_fused_mhc_off_is_declined(build, deployment, served_runner, model_module):
    """Without AITER's fused mHC (a CPU's own state) the layer keeps its original path."""
    deployment.setattr(model_module, "HAS_AITER_MHC", False)
    layer = build()
    assert (layer.use_fused_mhc, layer.mono) == (False, None)


def test_bf16_kv_is_declined(build, deployment, served_runner, md):
    """A bf16 KV cache: the layer keeps its original path. vLLM 0.33.0's ROCm attention only
    builds with an fp8_ds_mla cache (it raises for bf16), so the gate is driven on a built
    layer whose `kv_cache_dtype` reads bf16."""
    layer = build()
    deployment.setattr(layer.attn, "kv_cache_dtype", "bfloat16")
    assert md.MonoDecodeLayer.create(layer, make_vllm_config()) is None


def test_rocm_attention_refuses_bf16_kv(build, deployment, served_runner):
    with pytest.raises(ValueError, match="fp8_ds_mla layout only supports fp8"):
        build(cache_dtype="bfloat16")


def test_other_moe_routing_is_declined(build, deployment, served_runner):
    """A MoE other than the kernels' (here 256 experts) keeps the original path."""
    assert build(n_routed_experts=256).mono is None
