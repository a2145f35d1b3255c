"""A layer's weights and one step's tensors the way vLLM 0.33's hook hands them to the runner.

Written from vLLM's `mono_decode.py` (`weights()`, `forward`'s call at `mono_decode.py:402-423`,
`_record_view`, `_mx_scales`), independently of mono_jit.runtime: fused_wqa_wkv AITER-
preshuffled, 128 x 128 block codes repeated over 32 x 32 blocks, wq_b / wo_a rows padded by
256 bytes (the storage holds the padding), a record view of a paged cache whose pages are
longer than their records. The MoE tensors are the right shapes but never read before K2, so
they are left uninitialised (untouched pages cost no memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mono_jit.selfcheck.k1_world import random_activations, random_weights

from mono_jit.deepseek_v4 import HIDDEN as H
from mono_jit.runtime.weights import AttnWeights, MonoLayerWeights
from mono_jit.templates.geometry import KV_RECORD
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates import reference_math as rmath

TP, HEADS, GROUPS = 8, 16, 2
PAGE_BLOCK, PAGES, PAGE_BYTES = 64, 4, 64 * KV_RECORD + 1536  # vLLM pads a page past its records


class Dims:
    """What vLLM's `Dims(8)` offers the checks (they read `tp`)."""

    tp = TP


def mx32(codes: torch.Tensor) -> torch.Tensor:
    """vLLM's `_mx_scales`: each 128 x 128 code repeated over its 4 x 4 32 x 32 blocks."""
    return codes.repeat_interleave(4, 0).repeat_interleave(4, 1).contiguous()


def padded(rows: int, k: int, fill: torch.Tensor | None = None) -> torch.Tensor:
    """An e4m3 [rows, k] view of a [rows, k + 256] allocation, as VLLM_ROCM_FP8_PADDING lays it."""
    storage = torch.full((rows, k + 256), 0x7F, dtype=torch.uint8)
    if fill is not None:
        storage[:, :k] = fill
    return storage.view(torch.float8_e4m3fn)[:, :k]


_MOE_CACHE: dict[str, torch.Tensor] = {}


def _moe(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if name not in _MOE_CACHE:
        _MOE_CACHE[name] = torch.empty(shape, dtype=dtype)
    return _MOE_CACHE[name]


def layer_weights(k1: ref.K1Weights, layer_id: int = 3, ratio: int = 4) -> MonoLayerWeights:
    """MonoLayerWeights in vLLM's layouts whose attention front is `k1` (built with row_pad=256)."""
    g = torch.Generator().manual_seed(layer_id)
    e4m3 = torch.float8_e4m3fn
    attn = AttnWeights(
        layer_id=layer_id,
        wqkv=rmath.preshuffle_16x16(k1.w_qkv[:, :H].contiguous()).view(e4m3),
        wqkv_scale=mx32(k1.s_qkv), q_norm=k1.q_norm, kv_norm=k1.kv_norm,
        wq_b=padded(HEADS * 512, 1536, k1.w_qb[:, :1536]), wq_b_scale=mx32(k1.s_qb),
        wo_a=padded(GROUPS * 1024, 4096), wo_a_scale=torch.full((64, 128), 127, dtype=torch.uint8),
        wo_b=torch.zeros(H, GROUPS * 1024, dtype=e4m3), wo_b_scale=torch.full((224, 64), 127, dtype=torch.uint8),
        attn_sink=torch.randn(HEADS, generator=g), cos_sin=k1.rope, ratio=ratio)
    u8, fp4 = torch.uint8, torch.float4_e2m1fn_x2
    return MonoLayerWeights(
        attn=attn, hc_attn_fn=k1.hc_fn, hc_attn_scale=k1.hc_scale, hc_attn_base=k1.hc_base, attn_norm=k1.attn_norm,
        hc_ffn_fn=torch.randn(24, 4 * H, generator=g) * 0.01, hc_ffn_scale=torch.rand(3, generator=g) + 0.5,
        hc_ffn_base=torch.randn(24, generator=g) * 0.1, ffn_norm=torch.ones(H, dtype=torch.bfloat16),
        gate_w=torch.zeros(384, H, dtype=torch.bfloat16), bias=torch.zeros(384),
        w13=_moe("w13", (384, 768, H // 2), fp4), w13_s=_moe("w13_s", (384 * 768, H // 32), u8),
        w2=_moe("w2", (384, H, 192), fp4), w2_s=_moe("w2_s", (384 * H, 16), u8),
        sgu=torch.zeros(768, H, dtype=e4m3), sgu_s=torch.zeros(24, 224, dtype=u8),
        sw2=torch.zeros(H, 384, dtype=e4m3), sw2_s=torch.zeros(224, 12, dtype=u8))


def record_view(cache: torch.Tensor, block: int) -> torch.Tensor:
    """vLLM's `_record_view`: a paged byte cache as [pages, block, 584] with the pages' stride."""
    return torch.as_strided(cache, (cache.shape[0], block, KV_RECORD), (cache.stride(0), KV_RECORD, 1))


@dataclass
class HookStep:
    """One step's hook arguments (positional and keyword, as `mono_decode.__call__` passes them)."""

    args: tuple
    kwargs: dict
    selected: list  # what select() was called with


def hook_step(w: MonoLayerWeights, m: int, first: bool, seed: int = 5, rows: int | None = None) -> HookStep:
    """A decode step of m rows (`rows` >= m: a padded graph size, pad rows with slot -1)."""
    rows = rows or m
    x, residual, post_mix, res_mix = random_activations(rows, seed)
    if first:  # layer 0: the embedding broadcast to four streams, passed in all four slots
        x = residual
        post_mix = res_mix = x
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, w.attn.cos_sin.shape[0], (rows,), generator=g)
    slots = torch.tensor([(3 + 67 * i) % (PAGES * PAGE_BLOCK) if i < m else -1 for i in range(rows)])
    cache = torch.randint(0, 256, (PAGES, PAGE_BYTES), dtype=torch.uint8, generator=g)
    selected: list = []
    args = (w, x, residual, post_mix, res_mix, positions, slots, record_view(cache, PAGE_BLOCK),
            torch.zeros(256, 1, 128, dtype=torch.int32), torch.zeros(256, dtype=torch.int32),
            torch.zeros(256, dtype=torch.int32))
    kwargs = dict(topk_indices=torch.zeros(256, 1024, dtype=torch.int32),
                  comp_cache=record_view(torch.zeros(4, 64 * KV_RECORD, dtype=torch.uint8), 64),
                  select=lambda normed, qr: selected.append((normed.clone(), qr.clone())),
                  comp_block_table=torch.zeros(2, 4, dtype=torch.int32), fold=not first)
    return HookStep(args, kwargs, selected)


def expected_front(k1: ref.K1Weights, step: HookStep) -> tuple[ref.K1Outputs, torch.Tensor]:
    """reference.k1 on the step's rows (pad rows too: K1 runs M rows) and the cache bytes after
    its KV insert, computed from the K1 weights directly (not through the runner's mapping)."""
    _, x, residual, post_mix, res_mix, positions, slots, view = step.args[:8]
    fold = step.kwargs["fold"]
    out = ref.k1(x if fold else None, residual, post_mix if fold else None, res_mix if fold else None, fold, k1,
                 positions)
    cache = view.as_strided((view.shape[0] * PAGE_BYTES,), (1,)).clone()
    rmath.kv_insert(cache, out.records, slots, PAGE_BYTES, PAGE_BLOCK)
    return out, cache


__all__ = ["Dims", "HookStep", "expected_front", "hook_step", "layer_weights", "random_weights"]
