"""Helpers for tests against vLLM 0.33.0's real classes on a CPU host (`conftest.py` says
what is real and what is faked). Nothing here imports vLLM at module level: the folder must
collect, and skip, where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

RUNNER = "vllm.models.deepseek_v4.amd.mono.runner"
VLLM_VERSION = "0.33.0"


def _vllm_installed() -> bool:
    """Whether an installed vLLM can be imported: a package with an ``__init__.py``. pytest puts
    tests/ on the path, where this folder itself would pass as a namespace package named vllm."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


VLLM_MISSING = None if _vllm_installed() else f"vLLM {VLLM_VERSION} is not installed: bash scripts/setup.sh --with-vllm"

# The tiny model: V4-Pro's routing and layer kinds, small widths.
HIDDEN = 1280
NUM_LAYERS = 5  # prefix model.layers.5 is then a draft (MTP) layer
HCA_LAYER, CSA_LAYER = "heavily_compressed_attention", "compressed_sparse_attention"
LAYER_TYPES = [HCA_LAYER, HCA_LAYER, CSA_LAYER, HCA_LAYER, CSA_LAYER]
MAX_MODEL_LEN = 1 << 20
HCA_WIDTH = 8192  # roundup(cdiv(1M, 128), 128): vLLM's c128a table width at a 1M context
INDEX_TOPK = 1024
KV_BLOCK = 256  # vLLM's KV block (tokens); the SWA cache pages 64 tokens
ROWS_CAP = 128  # height of the step's graph-stable buffers (vLLM's max_num_batched_tokens)
CACHE_BLOCKS = 8

# Layer index -> (compress ratio, routes by hash), as V4-Pro's first layers.
LAYER_KINDS = {0: (128, True), 1: (128, True), 2: (4, True), 3: (128, False), 4: (4, False)}


def fake_amdsmi(gfx: str = "gfx950") -> types.ModuleType:
    """An `amdsmi` with the names `vllm.platforms.rocm` imports; one GPU reporting `gfx`."""
    mod = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    def _unavailable(*args: Any, **kwargs: Any) -> Any:
        raise AmdSmiException("fake amdsmi: no GPU on this host")

    mod.AmdSmiException = AmdSmiException
    mod.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    mod.amdsmi_init = mod.amdsmi_shut_down = lambda *args, **kwargs: None
    mod.amdsmi_get_processor_handles = lambda: [0]
    mod.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": gfx}
    for name in (
        "amdsmi_get_gpu_device_uuid",
        "amdsmi_get_gpu_memory_total",
        "amdsmi_topo_get_link_type",
        "amdsmi_topo_get_numa_node_number",
    ):
        setattr(mod, name, _unavailable)
    return mod


def no_cuda_event() -> type:
    """A `torch.cuda.Event` for a CPU build of torch: constructible, every method a no-op."""

    class Event:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def wait(self, *args: Any, **kwargs: Any) -> None:
            pass

        def synchronize(self) -> None:
            pass

    return Event


def patch_deployment(mp: pytest.MonkeyPatch) -> None:
    """Make `MonoDecodeLayer.create` see an MI355X TP8 deployment, each fact it reads set once:

    - TP size 8 (`md.get_tensor_model_parallel_world_size`; the process group has 1 rank);
    - 256 compute units (`md._compute_units`: reading them raises on a CPU);
    - AITER's FP8 linears on (`rocm_aiter_ops.is_linear_fp8_enabled`);
    - the routed MoE's backend `AITER_MXFP4_BF16`: set as `mxfp4_backend` on the unquantised
      MoE method the tiny layer gets (a real MXFP4 layer cannot be built on a CPU);
    - `VLLM_ROCM_FP8_PADDING=1`, `VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4` unset;
    - AITER's fused mHC present (`model.HAS_AITER_MHC`; read by layers built afterwards).

    The CDNA4 check is already met by the fake amdsmi. A refusal test undoes one of these.
    """
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )
    from vllm.models.deepseek_v4.amd import mono_decode, model

    mp.setattr(mono_decode, "get_tensor_model_parallel_world_size", lambda: 8)
    mp.setattr(mono_decode, "_compute_units", lambda: 256)
    mp.setattr(rocm_aiter_ops, "is_linear_fp8_enabled", classmethod(lambda cls: True))
    mp.setattr(
        UnquantizedFusedMoEMethod,
        "mxfp4_backend",
        Mxfp4MoeBackend.AITER_MXFP4_BF16,
        raising=False,
    )
    mp.setenv("VLLM_ROCM_FP8_PADDING", "1")
    mp.delenv("VLLM_ROCM_USE_AITER_MOE_A4W4_DSV4", raising=False)
    mp.setattr(model, "HAS_AITER_MHC", True)


def make_vllm_config(
    *,
    monokernel: bool = True,
    cache_dtype: str = "fp8",
    parallel: dict[str, Any] | None = None,
    **hf_overrides: Any,
):
    """A real `VllmConfig` for the tiny model: real `KernelConfig(monokernel=...)`, real
    `ParallelConfig(**parallel)` (default TP8), `--kv-cache-dtype cache_dtype` (vLLM turns
    "fp8" into fp8_ds_mla), a real transformers `DeepseekV4Config` (`hf_overrides` on the tiny
    model's fields); its `model_config` is a namespace (a real `ModelConfig` needs the
    checkpoint's files)."""
    from transformers import DeepseekV4Config
    from vllm.config import KernelConfig, ParallelConfig, VllmConfig

    hf = DeepseekV4Config(
        **{
            "vocab_size": 1024,
            "hidden_size": HIDDEN,
            "moe_intermediate_size": 128,
            "num_hidden_layers": NUM_LAYERS,
            "layer_types": LAYER_TYPES,
            "num_attention_heads": 8,
            "head_dim": 512,  # 448 NoPE + 64 RoPE: the only head size the fp8_ds_mla cache takes
            "q_lora_rank": 64,
            "o_groups": 2,
            "o_lora_rank": 64,
            "n_routed_experts": 384,
            "num_experts_per_tok": 6,
            "routed_scaling_factor": 2.5,
            "index_n_heads": 4,
            "index_head_dim": 128,
            "index_topk": INDEX_TOPK,
            "max_position_embeddings": 4096,  # the RoPE table is built eagerly: keep it small
            **hf_overrides,
        }
    )
    cfg = VllmConfig(
        kernel_config=KernelConfig(monokernel=monokernel),
        parallel_config=ParallelConfig(**(parallel or {"tensor_parallel_size": 8})),
    )
    model_config = types.SimpleNamespace(
        hf_config=hf,
        hf_text_config=hf,
        dtype=torch.bfloat16,
        max_model_len=MAX_MODEL_LEN,
        is_moe=True,
    )
    object.__setattr__(cfg, "model_config", model_config)
    cfg.attention_config.sparse_mla_prefill_workspace_factor = 5
    cfg.cache_config.cache_dtype = cache_dtype
    cfg.cache_config.block_size = KV_BLOCK
    return cfg


def build_layer(cfg, index: int):
    """A real `DeepseekV4DecoderLayer` `model.layers.<index>` of `cfg` (its `__init__` runs the
    real `MonoDecodeLayer.create`), with zeroed fp8_ds_mla caches bound the way vLLM binds them
    (`[blocks, 1, states, 584]` pages at the KV spec's padded page stride). Index
    `NUM_LAYERS` is a draft layer. Each (cfg, index) may be built once: vLLM registers layer
    names per config."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.amd.model import DeepseekV4DecoderLayer

    with set_current_vllm_config(cfg):
        layer = DeepseekV4DecoderLayer(
            cfg,
            prefix=f"model.layers.{index}",
            topk_indices_buffer=torch.zeros(ROWS_CAP, INDEX_TOPK, dtype=torch.int32),
        )
    if layer.attn.kv_cache_dtype == "fp8_ds_mla":
        _bind_cache(layer.attn.swa_cache_layer, layer.attn.swa_cache_layer.get_kv_cache_spec(cfg))
        spec = layer.attn.get_kv_cache_spec(cfg)
        if spec is not None:
            _bind_cache(layer.attn, spec)
    return layer


def _bind_cache(owner, spec) -> None:
    states = int(spec.block_size / spec.tokens_per_state)
    width = spec.state_content_size_bytes
    pages = torch.zeros(CACHE_BLOCKS * spec.page_size_bytes, dtype=torch.uint8)
    owner.bind_kv_cache(
        pages.as_strided(
            (CACHE_BLOCKS, 1, states, width), (spec.page_size_bytes, states * width, width, 1)
        )
    )


@dataclass
class Calls:
    """What the stand-in runner module saw: runners built (their constructor arguments) and
    every `forward` (its arguments by name, the outputs it returned)."""

    built: list[dict[str, Any]] = field(default_factory=list)
    forwards: list[dict[str, Any]] = field(default_factory=list)


def stand_in_runner_module() -> types.ModuleType:
    """A module in place of vLLM's FlyDSL runner: `BLOCKS`, `MAX_TOKENS`, a `MonoRunner` whose
    `forward` has the in-tree signature (a hook passing anything else fails), records its
    arguments and returns outputs of the contracted shapes, and keyword-only `AttnWeights` /
    `MonoLayerWeights`. `module.calls` is a `Calls`."""
    mod = types.ModuleType(RUNNER)
    calls = Calls()

    class _Weights:
        def __init__(self, **fields: Any) -> None:
            self.fields = fields
            self.checked_with: Any = None

        def check(self, dims: Any) -> None:
            self.checked_with = dims

    class AttnWeights(_Weights):
        pass

    class MonoLayerWeights(_Weights):
        pass

    class MonoRunner:
        def __init__(self, tp, rank, group, device, max_topk=0) -> None:
            calls.built.append(
                dict(tp=tp, rank=rank, group=group, device=device, max_topk=max_topk)
            )

        def forward(
            self,
            w,
            x,
            residual,
            post_mix,
            res_mix,
            positions,
            slot_mapping,
            swa_cache,
            swa_indices,
            swa_lens,
            token_to_req,
            topk_indices,
            comp_cache,
            select,
            comp_block_table=None,
            outs=None,
            fold=True,
            route_ids=None,
            topk=0,
            global_keys=False,
        ):
            args = dict(locals())
            del args["self"]
            m, h = residual.shape[0], residual.shape[-1]
            out = (
                torch.empty(m, h, dtype=torch.bfloat16),
                torch.empty_like(residual),
                torch.empty(m, 4, 1),
                torch.empty(m, 4, 4),
                torch.empty(m, 4),
            )
            calls.forwards.append(dict(args=args, out=out))
            return out

    mod.BLOCKS, mod.MAX_TOKENS = 256, 64
    mod.MonoRunner, mod.AttnWeights, mod.MonoLayerWeights = (
        MonoRunner,
        AttnWeights,
        MonoLayerWeights,
    )
    mod.calls = calls
    return mod


def stub_weights(mp: pytest.MonkeyPatch, layer, weights: Any = None) -> Any:
    """Give `layer.mono` its weights (what `MonoDecodeLayer.weights` returns: it keeps them in
    `_weights`), a fresh marker object unless given; returns them."""
    weights = object() if weights is None else weights
    mp.setattr(layer.mono, "_weights", weights)
    return weights


def mark_fallback(mp: pytest.MonkeyPatch, layer) -> list[tuple]:
    """Replace the layer's original fused path (AITER's kernels: not on a CPU) by a recorder;
    returns the list its calls' arguments are appended to. It returns the 4-tuple of its
    inputs `(x, residual, post_mix, res_mix)`."""
    seen: list[tuple] = []

    def fallback(x, positions, input_ids, post_mix=None, res_mix=None, residual=None):
        seen.append((x, positions, input_ids, post_mix, res_mix, residual))
        return x, residual, post_mix, res_mix

    mp.setattr(layer, "_forward_fused_post_pre", fallback)
    return seen



def record_declines(mp: pytest.MonkeyPatch) -> list[str]:
    """Record why the hook declines steps (`MonoDecodeLayer._skip`'s reason; it still returns
    None, so the layer takes its original path); returns the list of reasons."""
    from vllm.models.deepseek_v4.amd.mono_decode import MonoDecodeLayer

    reasons: list[str] = []

    def skip(why: str) -> None:
        reasons.append(why)

    mp.setattr(MonoDecodeLayer, "_skip", staticmethod(skip))
    return reasons


# ---- a decode step -----------------------------------------------------------------------


@dataclass
class Step:
    """One step's inputs to `DeepseekV4DecoderLayer.forward` and its attention metadata (the
    dict vLLM's forward context carries, by layer name; None: a profile / dummy run)."""

    x: torch.Tensor
    positions: torch.Tensor
    input_ids: torch.Tensor | None
    post_mix: torch.Tensor | None
    res_mix: torch.Tensor | None
    residual: torch.Tensor | None
    metadata: dict[str, Any] | None

    def args(self) -> tuple:
        """The positional arguments of `DeepseekV4DecoderLayer.forward`, in its order."""
        return (self.x, self.positions, self.input_ids, self.post_mix, self.res_mix, self.residual)


def make_step(
    layer,
    rows: int,
    *,
    first: bool = False,
    decode_tokens: int | None = None,
    prefills: int = 0,
    swa_width: int = 128,
    metadata: bool = True,
    input_ids: bool = True,
    seq_len: int = 300,
    seed: int = 0,
) -> Step:
    """A decode step of `rows` rows (a FULL graph's padded size) for `layer`, with the real ROCm
    metadata dataclasses filled as vLLM's builders fill them: `decode_tokens` decode requests of
    one token each (default `rows`; pad rows have slot -1), `prefills` prefill requests of 4
    tokens after them, `swa_width` the SWA decode width. `first`: layer 0's inputs (`x` the
    embedding broadcast to the 4 streams `[M, 4, H]`, no residual / mixes); else `x` `[M, H]`,
    residual `[M, 4, H]` bf16, post_mix `[M, 4, 1]` and res_mix `[M, 4, 4]` f32."""
    from vllm.models.deepseek_v4.amd.rocm import (
        DeepseekV4ROCMAiterMLASparseMetadata,
        DeepseekV4ROCMAiterSparseSWAMetadata,
    )

    g = torch.Generator().manual_seed(seed)
    attn = layer.attn
    h = layer.hidden_size
    n = rows if decode_tokens is None else decode_tokens
    reqs = n + prefills
    tokens = n + 4 * prefills
    m = rows
    i32 = dict(dtype=torch.int32)

    def rand_int(high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=g, **i32)

    if first:
        x = torch.randn(m, h, generator=g).to(torch.bfloat16).unsqueeze(1).repeat(1, 4, 1)
        residual = post_mix = res_mix = None
    else:
        x = torch.randn(m, h, generator=g).to(torch.bfloat16)
        residual = torch.randn(m, 4, h, generator=g).to(torch.bfloat16)
        post_mix = torch.rand(m, 4, 1, generator=g)
        res_mix = torch.rand(m, 4, 4, generator=g)
    positions = torch.full((m,), seq_len - 1, dtype=torch.int64)
    ids = rand_int(1024, m) if input_ids else None  # vLLM's input ids are int32

    blocks_per_req = 2
    swa_block = attn.swa_cache_layer.block_size
    swa_table = rand_int(CACHE_BLOCKS, reqs, blocks_per_req)
    slots = torch.full((m,), -1, dtype=torch.int64)  # pad rows: no KV write
    slots[:n] = swa_table[:n, 0].long() * swa_block + (seq_len - 1) % swa_block
    token_to_req = torch.zeros(ROWS_CAP, **i32)
    token_to_req[:n] = torch.arange(n, **i32)
    swa_indices = torch.zeros(ROWS_CAP, 1, 128, **i32)
    swa_indices[:n] = rand_int(CACHE_BLOCKS * swa_block, n, 1, 128)
    swa_lens = torch.zeros(ROWS_CAP, **i32)
    swa_lens[:n] = min(seq_len, 128)
    query_start = torch.cat([torch.arange(n + 1), n + 4 * torch.arange(1, prefills + 1)]).to(
        torch.int32
    )
    seq_lens = torch.full((reqs,), seq_len, **i32)
    swa = DeepseekV4ROCMAiterSparseSWAMetadata(
        block_table=swa_table,
        slot_mapping=slots,
        block_size=swa_block,
        seq_lens=seq_lens,
        query_start_loc=query_start,
        token_to_req_indices=token_to_req,
        decode_swa_indices=swa_indices,
        decode_swa_lens=swa_lens,
        decode_swa_width=swa_width,
        num_decodes=n,
        num_prefills=prefills,
        num_decode_tokens=n,
        num_prefill_tokens=tokens - n,
    )

    ratio = attn.compress_ratio
    comp_slots = torch.full((m,), -1, dtype=torch.int64)
    completes = (seq_len % ratio) == 0  # the step's token completes a compressed entry
    if completes:
        comp_slots[:n] = swa_table[:n, 0].long() * (KV_BLOCK // ratio)
    hca: dict[str, torch.Tensor] = {}
    if ratio == 128:
        active = 128  # vLLM: the power of two >= the context's compressed rows, at least 128
        persistent = torch.full((ROWS_CAP, HCA_WIDTH), -1, **i32)
        persistent[:n, : seq_len // ratio] = rand_int(CACHE_BLOCKS * 2, n, seq_len // ratio)
        hca = dict(
            c128a_global_decode_topk_indices=persistent[:n, :active].view(n, 1, -1),
            c128a_decode_topk_lens=torch.full((n,), seq_len // ratio, **i32),
        )
    comp = DeepseekV4ROCMAiterMLASparseMetadata(
        num_reqs=reqs,
        max_query_len=4 if prefills else 1,
        max_seq_len=seq_len,
        num_actual_tokens=tokens,
        query_start_loc=query_start,
        slot_mapping=comp_slots,
        block_table=rand_int(CACHE_BLOCKS, reqs, blocks_per_req),
        req_id_per_token=token_to_req,
        block_size=KV_BLOCK,
        topk_tokens=HCA_WIDTH if ratio == 128 else INDEX_TOPK,
        **hca,
    )
    md = {attn.swa_cache_layer.prefix: swa, attn.prefix: comp} if metadata else None
    return Step(x, positions, ids, post_mix, res_mix, residual, md)


@contextmanager
def forward_context(cfg, step: Step, mode: str = "FULL") -> Iterator[None]:
    """vLLM's real `set_forward_context` around a step, in CUDA-graph runtime `mode`
    ("FULL", "NONE" or "PIECEWISE")."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    with set_forward_context(
        step.metadata,
        cfg,
        num_tokens=step.x.shape[0],
        cudagraph_runtime_mode=CUDAGraphMode[mode],
    ):
        yield


