"""Attribute drift: what vLLM 0.33.0's mono decode hook reads, and the call shapes the mono-jit
plug-in relies on, still exist in the installed vLLM. Written from reading `mono_decode.py`
(`create`, `weights`, `_decode_step`, `__call__`, `_select`); fails on the first vLLM upgrade
that renames one of them."""

from __future__ import annotations

import dataclasses
import inspect
from functools import reduce

import pytest

from cpu_vllm import VLLM_VERSION

# Paths read from a DeepseekV4DecoderLayer, relative to it, by each part of the hook.
CREATE = [
    "attn.prefix",
    "attn.compress_ratio",
    "attn.indexer",
    "attn.kv_cache_dtype",
    "use_fused_mhc",
    "fuse_mhc_rmsnorm",
    "ffn.experts.routed_experts.quant_method",
    "ffn.use_mega_moe",
    "ffn.shared_experts",
    "ffn.fuse_heterogeneous_shared_expert",
    "ffn.is_fused_shared_expert_enabled",
    "ffn.gate.bias_vl",
    "ffn.n_routed_experts",
    "ffn.n_activated_experts",
    "ffn.routed_scaling_factor",
    "ffn.swiglu_limit",
    "ffn.scoring_func",
    "ffn.renormalize",
]
WEIGHTS = [
    "attn._wqa_wkv_scale",
    "attn._wo_b_scale",
    "attn.fused_wqa_wkv.weight",
    "attn.q_norm.weight",
    "attn.kv_norm.weight",
    "attn.wq_b.weight",
    "attn.wo_a.weight",
    "attn.wo_b.weight",
    "attn.attn_sink",
    "attn.rotary_emb.cos_sin_cache",
    "hc_attn_fn",
    "hc_attn_scale",
    "hc_attn_base",
    "attn_norm.weight",
    "hc_ffn_fn",
    "hc_ffn_scale",
    "hc_ffn_base",
    "ffn_norm.weight",
    "ffn.gate.weight",
    "ffn.gate.e_score_correction_bias",
    "ffn.experts.routed_experts.w13_weight",
    "ffn.experts.routed_experts.w2_weight",
    "ffn.shared_experts._gateup_scale",
    "ffn.shared_experts.gate_up_proj.weight",
    "ffn.shared_experts.down_proj.weight",
]
CALL = [
    "attn.swa_cache_layer.prefix",
    "attn.swa_cache_layer.kv_cache",
    "attn.kv_cache",
    "attn.topk_indices_buffer",
    "ffn.gate.tid2eid",
]
SELECT_CSA = [
    "attn.compressor.fused_wkv_wgate.weight",
    "attn.rotary_emb",
    "attn.indexer_rotary_emb",
    "attn.indexer.compressor.fused_wkv_wgate.weight",
    "attn.indexer.weights_proj",
    "attn.indexer.indexer_op",
]
# Fields of the ROCm metadata the hook reads (SWA layer's, compressed layer's).
SWA_FIELDS = {
    "num_prefills",
    "num_decodes",
    "num_decode_tokens",
    "decode_swa_width",
    "decode_swa_indices",
    "decode_swa_lens",
    "token_to_req_indices",
    "slot_mapping",
    "block_size",
}
COMP_FIELDS = {"c128a_global_decode_topk_indices", "block_table", "block_size"}


def has_path(obj, path: str) -> bool:
    try:
        reduce(getattr, path.split("."), obj)
    except AttributeError:
        return False
    return True


def test_vllm_version():
    import vllm

    assert vllm.__version__ == VLLM_VERSION


@pytest.mark.parametrize("index", [0, 2, 3, 4])
def test_layer_has_what_the_hook_reads(tiny_model, index):
    layer = tiny_model.layers[index]
    paths = CREATE + WEIGHTS + CALL + (SELECT_CSA if layer.attn.compress_ratio == 4 else [])
    assert [p for p in paths if not has_path(layer, p)] == []
    assert layer.mono is not None  # create() took it: every gate read an existing attribute


def test_layer_kinds_are_v4_pro(tiny_model):
    """The tiny model's layers have V4-Pro's kinds: the hook's branches key on these."""
    kinds = {
        i: (
            layer.attn.compress_ratio,
            layer.ffn.gate.tid2eid is not None,
            layer.attn.indexer is not None,
        )
        for i, layer in tiny_model.layers.items()
    }
    assert kinds == {
        0: (128, True, False),
        1: (128, True, False),
        2: (4, True, True),
        3: (128, False, False),
        4: (4, False, True),
    }
    assert {layer.attn.kv_cache_dtype for layer in tiny_model.layers.values()} == {"fp8_ds_mla"}


def test_routed_scales_are_mxfp4_weights(md):
    """`weights()` reads `w13_weight_scale` / `w2_weight_scale`: the MXFP4 MoE method (which a
    CPU cannot build) registers them."""
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    source = inspect.getsource(Mxfp4MoEMethod.create_weights)
    assert '"w13_weight_scale"' in source and '"w2_weight_scale"' in source


def test_block_scales_are_read_from_the_linear(md):
    """`_block_scale` takes FP8 linears' scales through vLLM's helper, by name."""
    from vllm.model_executor.layers.quantization.utils import fp8_utils

    assert "weight_scale_inv" in inspect.getsource(fp8_utils.get_fp8_block_weight_scale)
    assert "get_fp8_block_weight_scale" in inspect.getsource(md._block_scale)


def test_metadata_fields(md):
    from vllm.models.deepseek_v4.amd.rocm import (
        DeepseekV4ROCMAiterMLASparseMetadata,
        DeepseekV4ROCMAiterSparseSWAMetadata,
    )

    swa = {f.name for f in dataclasses.fields(DeepseekV4ROCMAiterSparseSWAMetadata)}
    comp = {f.name for f in dataclasses.fields(DeepseekV4ROCMAiterMLASparseMetadata)}
    assert SWA_FIELDS - swa == set()
    assert COMP_FIELDS - comp == set()


def test_decoder_layer_calls_the_hook(model_module):
    """The layer makes its hook in `__init__` and hands `forward`'s arguments to it unchanged,
    falling back to its own path on None."""
    cls = model_module.DeepseekV4DecoderLayer
    params = list(inspect.signature(cls.forward).parameters)
    assert params == ["self", "x", "positions", "input_ids", "post_mix", "res_mix", "residual"]
    assert "self.mono = MonoDecodeLayer.create(self, vllm_config)" in inspect.getsource(
        cls.__init__
    )
    forward = inspect.getsource(cls.forward)
    assert "self.mono(self, x, positions, input_ids, post_mix, res_mix, residual)" in forward
    assert "if out is not None:" in forward
    assert model_module.MonoDecodeLayer.__module__ == "vllm.models.deepseek_v4.amd.mono_decode"


def test_hook_signatures(md):
    assert list(inspect.signature(md._mono_runner).parameters) == ["device", "max_topk"]
    call = list(inspect.signature(md.MonoDecodeLayer.__call__).parameters)
    assert call == [
        "self",
        "layer",
        "x",
        "positions",
        "input_ids",
        "post_mix",
        "res_mix",
        "residual",
    ]
    assert list(inspect.signature(md.MonoDecodeLayer.create).parameters) == [
        "layer",
        "vllm_config",
    ]


def test_hook_source_contract(md):
    """The runner is reached only as the plug-in serves it: `BLOCKS` imported by the deployment
    check, `MonoRunner(tp, rank, cpu_group, device, max_topk=...)`, `AttnWeights` /
    `MonoLayerWeights` by keyword, `runner.forward(...)` whose first four outputs the hook
    returns (`return out[:4]`: the plug-in declines a step by the hook's own None path)."""
    src = inspect.getsource(md)
    assert "from vllm.models.deepseek_v4.amd.mono.runner import BLOCKS" in src
    assert "from vllm.models.deepseek_v4.amd.mono.runner import MonoRunner" in src
    assert "get_tp_group().cpu_group" in src
    assert "max_topk=max_topk" in src
    call = inspect.getsource(md.MonoDecodeLayer.__call__)
    assert "out = runner.forward(" in call
    assert call.rstrip().endswith("return out[:4]")
    assert "return self._skip(why)" in call
    weights = inspect.getsource(md.MonoDecodeLayer.weights)
    assert "attn = AttnWeights(" in weights and "MonoLayerWeights(" in weights
    assert "attn.check(d)" in weights and "self._weights.check(d)" in weights


def test_select_calls(md):
    """`_select` drives vLLM's compressor and indexer with these call shapes."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Indexer
    from vllm.models.deepseek_v4.compressor import DeepseekCompressor

    compressor = list(inspect.signature(DeepseekCompressor.forward).parameters)
    assert compressor[:4] == ["self", "kv_score", "positions", "rotary_emb"]
    indexer = list(inspect.signature(DeepseekV4Indexer.forward).parameters)
    assert len(indexer) >= 7  # self, normed, qr, score, weights, positions, rotary_emb
    assert "torch.mm(normed, comp.fused_wkv_wgate.weight.T, out_dtype=torch.float32)" in (
        inspect.getsource(md._select)
    )
