"""An independent torch formulation of vLLM 0.33's DeepSeek-V4-Pro decoder layer (TP8, ROCm decode
path), for tests that check mono-jit's kernels and runner against vLLM's math.

Written from vLLM's and AITER's sources (cited as path:line under vllm/ of the 0.33.0 wheel), never
from mono_jit's references: nothing here imports mono_jit.templates.*.reference or mono_jit.runtime
(mono_jit.deepseek_v4's constants only). Public pieces:

- encodings: `e2m1`, `dequant_mxfp4`, `dequant_fp8_blocks` (= `dequant`), `mx8` (MXFP8 round trip),
  `decode_record` / `encode_records` / `insert_records` / `read_record` (fp8_ds_mla, 584 bytes),
  `block_gemv` (MX activations x 128 x 128 block-scaled e4m3, f64), `all_reduce` (rank order);
- AITER's layouts: `aiter_shuffle_weight_a16w4`, `aiter_shuffle_scale_a16w4`, `aiter_shuffle_scale`,
  `aiter_shuffle_weight_16x16`; vLLM's `mx32` scale expansion and `padded` FP8 rows;
- the mHC seams: `mhc_pre`, `mhc_post` (kernels/mhc/torch.py restated; tests/vllm/test_vllm_torch_references.py
  checks them bit for bit against vLLM's own), `rms_norm`, `mhc_seam`;
- attention: `rope_gptj`, `q_heads`, `kv_rope`, `step_keys`, `dense_attention`, `inverse_rope_vllm`,
  `projections` (vLLM's bf16 wo_a path at full width);
- MoE: `clamped_swiglu`, `vllm_route`, `Global`, `global_weights`, `rank_slices`, `vllm_layout`,
  `vllm_shared`, `vllm_routed` (one rank, plainly), `moe_partials` (every rank, at full width),
  `vllm_moe`, `expert_weights` (an LRU of dequantised experts);
- one layer: `CheckpointLayer`, `random_checkpoint_layer`, `route_table`, `rank_tensors` (its first
  launch's part: `front_tensors`), `ATTN_FIELDS`, `LayerStep`, `random_step`, `LayerExpected`,
  `attention_seam`, `qkv_norms`, `query` (the first launch's math, a stage each), `decode_layer`;
- checking a layer against it: `BOUNDS`, `layer_errors`, `check_swa_cache`.

Cost: decode_layer of 4 rows ~5 s on 2 cores the first time a layer's experts are met (8 experts
dequantised, ~3 s), ~2 s after; peak ~1.4 GB beyond the 0.65 GB checkpoint (1.1 GB of it the
expert cache).

Rounding points of `decode_layer` (bf16 = a value stored as bf16; MX = MXFP8 per 32, e4m3 RNE with
one E8M0 per 32 values, code ceil(log2(amax / 448)) + 127, as mono's kernels and vLLM's MXFP8 wo_a
path quantise; vLLM's other ROCm linears quantise per 128 with fp32 scales instead, see
amd/rocm.py:1236 `_bpre_attn_gemm` -> group_fp8_quant, and the in-tree mono README "Numerics"):

  R = bf16(post x + comb^T R)                       (fold; layer 0 skips it)     mhc/torch.py:135
  post, comb, bf16 collapse = mhc_pre(R, hc_attn)                               mhc/torch.py:48
  normed = bf16(rmsnorm(collapse) x attn_norm)      (fused norm, f32 inside)    model.py:990
  qkv = bf16(MX(normed) . wqkv)                      (128 x 128 E8M0 weight blocks) rocm.py:1253
  qr = bf16(rmsnorm(qkv[:1536]) x q_norm), kv = bf16(rmsnorm(qkv[1536:]) x kv_norm)
                                                     fused_qk_rmsnorm.py (f32, one cast)
  q = bf16(MX(qr) . wq_b); per head bf16(rms(q) then GPT-J RoPE on dims 448..511, f32)
  kv' = bf16(GPT-J RoPE of kv's dims 448..511); record = fp8_ds_mla(kv')
                                                     xpu/xpu_qnorm_rope_kv_fp8_insert.py:19 (the
                                                     Triton twin of the fused C op, attention.py:763)
                                                     common/ops/cache_utils.py:44 (the record)
  record inserted at slot_mapping (-1: none) BEFORE the attention reads the SWA cache
  o = bf16(softmax over [q.k x 512^-0.5 for the row's SWA then compressed keys, sink] . k)
                                                     rocm_aiter_mla_sparse.py:2943, :3315, :3371
  xo = MX(inverse RoPE of o, f32)                   rocm.py:1352 _o_proj (inverse_rope_group_quant)
  z = bf16(xo_g . wo_a_g) per group; partial_r = bf16(MX(z)_r . wo_b_r) per rank
  y = bf16(sum_r f32(partial_r)), rank order         (mono's all-reduce; vLLM: rocm.py:1250)
  R2 = bf16(post y + comb^T R); post2, comb2, bf16 collapse2 = mhc_pre(R2, hc_ffn); x = bf16(norm)
  MoE: router on bf16 x (f32 logits); per rank r: shared_r = bf16(MX(bf16(swiglu(bf16(MX(x) . sgu_r))))
       . sw2_r); routed_r = bf16(sum over picks in top-k order of w x (MX(bf16(swiglu(MX(x) . w13_e,r)))
       . w2_e,r)); partial_r = bf16(shared_r + routed_r); out = bf16(sum_r f32(partial_r)).

Dot products: the dense GEMVs in f64, the routed experts in f32 (their dequantised weights are
cached as bf16, exact for e2m1 x 2^k).
"""

from __future__ import annotations

import itertools
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from mono_jit import deepseek_v4

H = deepseek_v4.HIDDEN  # 7168
HEADS, D, NOPE, ROPE = deepseek_v4.HEADS, 512, 448, 64
Q_LORA, KV_LORA = 1536, 512
GROUPS, O_LORA = deepseek_v4.OUTPUT_GROUPS, 1024
GROUP_K = HEADS // GROUPS * D  # 4096: a group's wo_a input
INTER = deepseek_v4.MOE_INTERMEDIATE  # 3072, routed and shared, unsharded
EXPERTS = deepseek_v4.ROUTED_EXPERTS  # 384
TOP_K = deepseek_v4.EXPERTS_PER_TOKEN
SCALE = deepseek_v4.ROUTED_SCALING
LIMIT = 10.0  # swiglu_limit
TP = 8
LOCAL = INTER // TP  # a rank's intermediate share
EPS = 1e-6  # rms_norm_eps = hc_eps (DeepSeek-V4-Pro config)
SINKHORN = 20  # hc_sinkhorn_iters
POST_ALPHA = 2.0  # model.py hc_post_alpha
WINDOW = deepseek_v4.SWA_WINDOW
RECORD, RECORD_DATA = 584, 576
KV_AMAX_FLOOR = 1e-4
E4M3 = torch.float8_e4m3fn
FP4 = torch.float4_e2m1fn_x2


# -- encodings ---------------------------------------------------------------------------------

def e2m1(code: torch.Tensor) -> torch.Tensor:
    """OCP e2m1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 subnormal."""
    sign = torch.where((code >> 3) & 1 == 1, -1.0, 1.0)
    exponent, mantissa = ((code >> 1) & 3).float(), (code & 1).float()
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, (1 + 0.5 * mantissa) * torch.exp2(exponent - 1))
    return sign * magnitude


def _fp4_pairs() -> torch.Tensor:
    """int16 table: a packed fp4x2 byte -> its two values as e4m3 bytes (low nibble first), exact:
    every e2m1 value is an e4m3 value."""
    values = e2m1(torch.arange(16))
    pairs = torch.stack([values[torch.arange(256) & 15], values[torch.arange(256) >> 4]], -1)
    return pairs.to(E4M3).view(torch.uint8).contiguous().view(torch.int16).view(256)


_FP4_PAIRS = _fp4_pairs()


def dequant_mxfp4(packed: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """[..., K] f32 of fp4x2 bytes [..., K / 2] (low nibble first) and E8M0 codes [..., >= K / 32]."""
    pairs = torch.take(_FP4_PAIRS, packed.long())
    values = pairs.view(torch.uint8).view(E4M3).float().view(*packed.shape[:-1], packed.shape[-1] * 2)
    blocks = values.shape[-1] // 32
    scales = torch.exp2(codes[..., :blocks].float() - 127)
    return (values.view(*values.shape[:-1], blocks, 32) * scales[..., None]).view_as(values)


def dequant_fp8_blocks(w: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """f32 of e4m3 bytes [N, K] with E8M0 codes [N / 128, K / 128] of 128 x 128 blocks."""
    n, k = w.shape
    blocks = w.view(E4M3).float().view(n // 128, 128, k // 128, 128)
    return (blocks * torch.exp2(codes.float() - 127)[:, None, :, None]).view(n, k)


dequant = dequant_fp8_blocks


def mx8(x: torch.Tensor) -> torch.Tensor:
    """x through MXFP8 per 32 along the last dim and back (f32): scale 2^ceil(log2(amax / 448)),
    e4m3 RNE of x / scale clamped to +-448."""
    blocks = x.float().view(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)).clamp(-127, 127))
    q = (blocks / scale).clamp(-448, 448).to(E4M3).float()
    return (q * scale).view(x.shape)


def decode_record(record: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla bytes [..., 584] -> [..., 512] f32: e4m3 x 2^(code - 127) per 64 NoPE dims, bf16
    RoPE dims (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:1476 _decode_e8m0_scales)."""
    scales = torch.exp2(record[..., 576:583].float() - 127.0).repeat_interleave(64, -1)
    nope = record[..., :NOPE].contiguous().view(E4M3).float() * scales
    return torch.cat([nope, record[..., NOPE:576].contiguous().view(torch.bfloat16).float()], -1)


def encode_records(kv: torch.Tensor) -> torch.Tensor:
    """[M, 584] fp8_ds_mla records of bf16 kv [M, 512] (NoPE normed, RoPE dims rotated), as
    vllm/models/deepseek_v4/common/ops/cache_utils.py:44 quantize_and_insert_k_kernel writes them:
    per 64 NoPE dims amax floored at 1e-4, exponent = ceil(log2(amax / 448)), e4m3 of x / 2^exponent
    clamped to +-448, code exponent + 127 clamped to 0..255; the 64 RoPE dims as bf16 bytes; byte
    583 (the eighth scale) 0."""
    m = kv.shape[0]
    x = kv[:, :NOPE].float().view(m, NOPE // 64, 64)
    exponent = torch.ceil(torch.log2(x.abs().amax(-1).clamp_min(KV_AMAX_FLOOR) / 448.0))
    q = (x / torch.exp2(exponent)[..., None]).clamp(-448, 448).to(E4M3).view(torch.uint8).view(m, NOPE)
    codes = (exponent + 127).clamp(0, 255).to(torch.uint8)
    rope = kv[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([q, rope, codes, torch.zeros(m, 1, dtype=torch.uint8)], 1)


def _record_offsets(slot: int, page_stride: int, block: int) -> tuple[int, int]:
    """(data, scale) byte offsets of a slot: a page's `block` records' 576 data bytes, then their 8
    scale bytes (cache_utils.py:44 docstring; mono_decode.py:89 _record_view)."""
    page, row = divmod(slot, block)
    base = page * page_stride
    return base + row * RECORD_DATA, base + block * RECORD_DATA + row * (RECORD - RECORD_DATA)


def insert_records(cache: torch.Tensor, records: torch.Tensor, slots: torch.Tensor, page_stride: int,
                   block: int) -> None:
    """Write records [M, 584] into a flat byte cache at slots, in place; slot -1 writes nothing."""
    for record, slot in zip(records, slots.tolist()):
        if slot < 0:
            continue
        data, scale = _record_offsets(int(slot), page_stride, block)
        cache[data:data + RECORD_DATA] = record[:RECORD_DATA]
        cache[scale:scale + RECORD - RECORD_DATA] = record[RECORD_DATA:]


def read_record(cache: torch.Tensor, slot: int, page_stride: int, block: int) -> torch.Tensor:
    data, scale = _record_offsets(slot, page_stride, block)
    return torch.cat([cache[data:data + RECORD_DATA], cache[scale:scale + RECORD - RECORD_DATA]])


# -- AITER's layouts (aiter/ops/shuffle.py), re-implemented from their documented permutations --

def aiter_shuffle_weight_a16w4(w: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """shuffle_weight_a16w4(w, NLane=16, gate_up) = shuffle_weight(layout=(16, 16),
    is_guinterleave=True): KLane = 64 / 16 = 4, KPack = 16 bytes; gate_up views the rows as
    (2, N0, 16) and moves the 2 inside N0."""
    e, n, k = w.shape
    k0 = k // 64
    if gate_up:
        x = w.view(e, 2, n // 2 // 16, 16, k0, 4, 16).permute(0, 2, 1, 4, 5, 3, 6)
    else:
        x = w.view(e, n // 16, 16, k0, 4, 16).permute(0, 1, 3, 4, 2, 5)
    return x.contiguous().view(e, n, k)


def aiter_shuffle_scale_a16w4(s: torch.Tensor, experts: int, gate_up: bool) -> torch.Tensor:
    """shuffle_scale(s, experts, is_guinterleave=True, gate_up): K_Pack 2, N_Pack 2, N_Lane 16,
    K_Lane 4; gate_up views (E, N_Pack, N1, N_Lane, K1, K_Pack, K_Lane) -> (0, 2, 4, 6, 3, 5, 1),
    down views (E, N1, N_Pack, N_Lane, K1, K_Pack, K_Lane) -> (0, 1, 4, 6, 3, 5, 2)."""
    rows, k = s.shape
    n1, k1 = rows // experts // 32, k // 8
    if gate_up:
        x = s.view(experts, 2, n1, 16, k1, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)
    else:
        x = s.view(experts, n1, 2, 16, k1, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)
    return x.contiguous().view(rows, k)


def aiter_shuffle_scale(s: torch.Tensor) -> torch.Tensor:
    """shuffle_scale(s) (not interleaved): pad to (256 x, 8 x) with garbage (torch.empty), view
    (sm / 32, 2, 16, sn / 8, 2, 4), permute (0, 3, 5, 2, 4, 1)."""
    m, n = s.shape
    padded_ = torch.full(((m + 255) // 256 * 256, (n + 7) // 8 * 8), 0xA5, dtype=torch.uint8)
    padded_[:m, :n] = s
    sm, sn = padded_.shape
    return padded_.view(sm // 32, 2, 16, sn // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().view(sm, sn)


def aiter_shuffle_weight_16x16(w: torch.Tensor) -> torch.Tensor:
    """shuffle_weight(w, layout=(16, 16)) of e4m3 bytes: view (N / 16, 16, K / 32, 2, 16),
    permute (0, 2, 3, 1, 4) (the 16-byte K unit of a one-byte type)."""
    n, k = w.shape
    return w.view(n // 16, 16, k // 32, 2, 16).permute(0, 2, 3, 1, 4).contiguous().view(n, k)


def mx32(codes: torch.Tensor) -> torch.Tensor:
    """vLLM's `_mx_scales` (amd/mono_decode.py:108): each 128 x 128 E8M0 code repeated over its
    4 x 4 blocks of 32 x 32."""
    return codes.repeat_interleave(4, 0).repeat_interleave(4, 1).contiguous()


def padded(w: torch.Tensor) -> torch.Tensor:
    """An e4m3 [N, K] view of a [N, K + 256] allocation (VLLM_ROCM_FP8_PADDING pads rows whose K is
    a multiple of 512 by 256 bytes); the padding holds e4m3 NaN (0x7F), so a read past K shows."""
    n, k = w.shape
    storage = torch.full((n, k + 256), 0x7F, dtype=torch.uint8)
    storage[:, :k] = w
    return storage.view(E4M3)[:, :k]


# -- the mHC seams (vllm/model_executor/kernels/mhc/torch.py, restated) -------------------------

def mhc_post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """mhc_post_torch (mhc/torch.py:135): R'_j = sum_i comb[i, j] R_i + post_j x, in f32 (the
    stream mix first, then the post term added), stored in the residual's dtype (bf16)."""
    mixed = torch.einsum("mij,mih->mjh", comb.float().reshape(-1, 4, 4), residual.float())
    return (mixed + post.float().reshape(-1, 4, 1) * x.float().unsqueeze(-2)).to(residual.dtype)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
            eps: float = EPS, rounds: int = SINKHORN, alpha: float = POST_ALPHA
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_pre_torch (mhc/torch.py:48) with vLLM's DeepSeek-V4 arguments (model.py:953 hc_pre:
    rms_eps = hc_pre_eps = hc_sinkhorn_eps = 1e-6, post x 2, 20 Sinkhorn rounds): returns
    (post [M, 4, 1], comb [M, 4, 4], bf16 collapse [M, H], pre [M, 4]).

    x = R [M, 4H] in f32; mixes = (x fn^T) x rsqrt(sum(x^2) / 4H + eps); pre = sigmoid(mixes[0:4]
    s0 + base[0:4]) + eps; post = sigmoid(mixes[4:8] s1 + base[4:8]) x 2; comb = softmax(mixes[8:24]
    as 4 x 4 x s2 + base[8:24], over j) + eps, divided by its column sums (+ eps), then 19 x (rows,
    columns); the collapse is bf16(sum_i pre_i R_i) in f32."""
    m, streams, h = residual.shape
    x = residual.reshape(m, streams * h).float()
    mixes = torch.matmul(x, fn.t())
    mixes = mixes * torch.rsqrt(x.square().sum(-1, keepdim=True) / (streams * h) + eps)
    pre = torch.sigmoid(mixes[:, :streams] * scale[0] + base[:streams]) + eps
    post = torch.sigmoid(mixes[:, streams:2 * streams] * scale[1] + base[streams:2 * streams]) * alpha
    comb = (mixes[:, 2 * streams:].view(m, streams, streams) * scale[2]
            + base[2 * streams:].view(1, streams, streams))
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(rounds - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    collapse = torch.sum(pre.unsqueeze(-1) * residual.float(), dim=1).to(torch.bfloat16)
    return post.view(m, streams, 1), comb, collapse, pre


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS) -> torch.Tensor:
    """bf16(x rsqrt(mean(x^2) + eps) w) in f32, one rounding: vLLM's fused norms (models/common/ops/
    fused_qk_rmsnorm.py:71 'RMSNorm in fp32 throughout ... a single cast at store'; the mHC kernels'
    fused norm, kernels/mhc/tilelang_kernels.py:457-520, on the bf16 collapse)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(torch.bfloat16)


def mhc_seam(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
             base: torch.Tensor, scale: torch.Tensor, norm_weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """A seam of DeepseekV4DecoderLayer._forward_fused_post_pre (amd/model.py:990): mhc_post of the
    sublayer's reduced output y into the residual with the previous seam's post / comb, mhc_pre with
    this seam's hc_* and the fused RMSNorm. Returns r (bf16 [M, 4, H]), post [M, 4], comb, pre,
    x_norm (bf16 [M, H])."""
    r = mhc_post(y, residual, post, comb)
    post2, comb2, collapse, pre = mhc_pre(r, fn, scale, base)
    return {"r": r, "post": post2[..., 0], "comb": comb2, "pre": pre, "x_norm": rms_norm(collapse, norm_weight)}


# -- attention ---------------------------------------------------------------------------------

def rope_gptj(even: torch.Tensor, odd: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-J RoPE of f32 pairs (dims 2i, 2i + 1): (e cos - o sin, e sin + o cos)
    (xpu/xpu_qnorm_rope_kv_fp8_insert.py:80, :106)."""
    return even * cos - odd * sin, even * sin + odd * cos


def _angles(cos_sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [M, 32] f32 from the cos_sin_cache [P, 64] (32 cos, then 32 sin)."""
    rows = cos_sin[positions.long()].float()
    return rows[:, :ROPE // 2], rows[:, ROPE // 2:]


def q_heads(q: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """bf16 [M, heads, 512]: each bf16 head RMS-normalised without a weight (rsqrt(sum q^2 / 512 +
    eps), f32), its NoPE dims stored, its RoPE dims rotated from the normalised f32 values
    (xpu_qnorm_rope_kv_fp8_insert.py:55-85)."""
    cos, sin = _angles(cos_sin, positions)
    qf = q.float()
    rms = torch.rsqrt(qf.square().sum(-1, keepdim=True) / D + eps)
    out = (qf * rms).to(torch.bfloat16)
    even, odd = rope_gptj(qf[..., NOPE::2] * rms, qf[..., NOPE + 1::2] * rms, cos[:, None], sin[:, None])
    out[..., NOPE::2], out[..., NOPE + 1::2] = even.to(torch.bfloat16), odd.to(torch.bfloat16)
    return out


def kv_rope(kv: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """bf16 [M, 512]: kv's NoPE dims as they are, its RoPE dims rotated in f32 then bf16
    (xpu_qnorm_rope_kv_fp8_insert.py:86-110)."""
    cos, sin = _angles(cos_sin, positions)
    out = kv.clone()
    even, odd = rope_gptj(kv[:, NOPE::2].float(), kv[:, NOPE + 1::2].float(), cos, sin)
    out[:, NOPE::2], out[:, NOPE + 1::2] = even.to(kv.dtype), odd.to(kv.dtype)
    return out


def dense_attention(q: torch.Tensor, keys: Sequence[torch.Tensor | None], sink: torch.Tensor) -> torch.Tensor:
    """bf16 [M, heads, 512]: row r's softmax over [its keys (records [n, 584]), the sink] in f64, the
    values the keys' whole 512 dims (MQA), scale 512^-0.5 (attention.py:244): vLLM's decode kernel
    scores in base 2 (rocm_aiter_mla_sparse.py:2943), keeps maxima in natural units (:3315) and folds
    the per-head natural-log sink into the denominator only (:3371 _sparse_attn_decode_reduce_kernel);
    vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py:752 reference_mla_sparse_prefill is the
    dense form. A row without keys (graph padding) gets zeros."""
    qd = q.double()
    out = torch.zeros(qd.shape, dtype=torch.float64)
    for r, records in enumerate(keys):
        if records is None or len(records) == 0:
            continue
        kv = decode_record(records).double()
        logits = torch.cat([qd[r] @ kv.T * D ** -0.5, sink.double()[:, None]], dim=1)
        out[r] = torch.softmax(logits, dim=1)[:, :-1] @ kv
    return out.to(torch.bfloat16)


def inverse_rope_vllm(o: torch.Tensor, rope: torch.Tensor, positions: torch.Tensor,
                      out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """e' = e cos + o sin, o' = o cos - e sin on dims 448.. in f32 (rocm_aiter_mla_sparse.py:1505
    _inverse_rope_gptj_kernel), NoPE dims unchanged; stored as out_dtype (default o's)."""
    cos, sin = rope[positions.long(), :32][:, None].float(), rope[positions.long(), 32:][:, None].float()
    a, b = o[..., NOPE::2].float(), o[..., NOPE + 1::2].float()
    out = o.to(out_dtype or o.dtype, copy=True)
    out[..., NOPE::2], out[..., NOPE + 1::2] = (a * cos + b * sin).to(out.dtype), (b * cos - a * sin).to(out.dtype)
    return out


def projections(o: torch.Tensor, wo_a: torch.Tensor, s_wo_a: torch.Tensor, wo_b: torch.Tensor,
                s_wo_b: torch.Tensor) -> torch.Tensor:
    """vLLM's bf16 wo_a path at full width: y = bf16(wo_b(bf16(wo_a per group(o)))) in f32 (o the
    inverse-RoPE'd bf16 attention output; rocm_aiter_mla_sparse.py:1755 rocm_inv_rope_einsum:
    einsum('tgd,grd->tgr')), one wo_b over all 16384 columns, which is what the sum over ranks
    computes. wo_a [16 x 1024, 4096], wo_b [7168, 16384] checkpoint bytes, 128 x 128 codes."""
    x = o.float().view(o.shape[0], GROUPS, GROUP_K)
    z = torch.stack([x[:, g] @ dequant(wo_a[g * O_LORA:(g + 1) * O_LORA], s_wo_a[8 * g: 8 * (g + 1)]).T
                     for g in range(GROUPS)], dim=1).flatten(1).to(torch.bfloat16).float()
    y = torch.zeros(o.shape[0], H)
    for c in range(0, GROUPS * O_LORA, 4096):  # K in chunks, for memory
        y += z[:, c:c + 4096] @ dequant(wo_b[:, c:c + 4096], s_wo_b[:, c // 128:(c + 4096) // 128]).T
    return y.to(torch.bfloat16)


def block_gemv(x: torch.Tensor, w: torch.Tensor, codes: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """f64 [M, N] = x [M, K] times the block-scaled e4m3 weight w [N, K] (bytes, any row stride)^T,
    codes [N / 128, K / 128] E8M0: each 128-row block's scales folded into x (exact: powers of
    two), the weight converted a chunk of rows at a time."""
    m, k = x.shape
    xd = x.double()
    out = []
    for n0 in range(0, w.shape[0], chunk):
        wc = w[n0:n0 + chunk].view(E4M3).double()
        nb = wc.shape[0] // 128
        s = torch.exp2(codes[n0 // 128:n0 // 128 + nb].double() - 127).repeat_interleave(128, 1)  # [nb, K]
        xs = (xd[:, None, :] * s[None]).permute(1, 2, 0)  # [nb, K, M]
        out.append(torch.bmm(wc.view(nb, 128, k), xs).permute(2, 0, 1).reshape(m, nb * 128))
    return torch.cat(out, 1)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """A dot product's bf16 output: its f32 value (the accumulator's type on the GPU) rounded."""
    return x.float().to(torch.bfloat16)


def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """bf16 of the ranks' bf16 partials summed in f32 in rank order (mono's exact all-reduce, in
    place of vLLM's tensor_model_parallel_all_reduce)."""
    acc = partials[0].float()
    for p in partials[1:]:
        acc = acc + p.float()
    return acc.to(torch.bfloat16)


# -- the MoE (vLLM's math, independently) --------------------------------------------------------

def clamped_swiglu(gu: torch.Tensor, limit: float = LIMIT) -> torch.Tensor:
    """SiluAndMulWithClamp: silu(clamp(g, max=limit)) x clamp(u, -limit, limit)."""
    d = gu.shape[-1] // 2
    g, u = gu[..., :d].clamp(max=limit), gu[..., d:].clamp(-limit, limit)
    return torch.nn.functional.silu(g) * u


def vllm_route(x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor | None, hash_ids: torch.Tensor | None,
               softplus_sqrt: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """dsv4_topk (fused_moe/router/dsv4_topk.py:84-104): softplus as where(l > 20, l, log(1 + e^l)),
    sqrt; six times take the max of score + bias and the lowest expert holding it; weights the
    unbiased scores renormalised x 2.5. Hash: tid2eid's experts, the same weights."""
    logits = x.float() @ gate.float().T
    softplus = torch.where(logits > 20, logits, torch.log(1 + torch.exp(logits)))
    scores = softplus.sqrt() if softplus_sqrt else softplus
    if hash_ids is None:
        current = scores + bias
        ids = torch.empty(x.shape[0], TOP_K, dtype=torch.long)
        experts = torch.arange(gate.shape[0])
        for slot in range(TOP_K):
            best = current.amax(-1, keepdim=True)
            ids[:, slot] = torch.where(current == best, experts, gate.shape[0]).amin(-1)
            current = current.scatter(1, ids[:, slot:slot + 1], -math.inf)
    else:
        ids = hash_ids.long()
    chosen = scores.gather(1, ids)
    return ids.int(), chosen / chosen.sum(-1, keepdim=True) * SCALE


_UIDS = itertools.count()


@dataclass
class Global:
    """Unsharded checkpoint MoE weights (raw layouts: w13 gate rows then up rows).

    Only the experts in `reachable` (None: all) hold weights; the routed tensors of the others are
    torch.empty pages that nothing here reads, so a 384-expert layer costs RAM for its reachable
    experts only. Treat a Global as immutable (decode_layer caches dequantised experts by `uid`;
    dataclasses.replace makes a new uid)."""

    gate: torch.Tensor  # [E, H] bf16
    bias: torch.Tensor  # [E] f32
    w13: torch.Tensor  # [E, 2 x 3072, H / 2] fp4x2
    w13_s: torch.Tensor  # [E, 2 x 3072, H / 32]
    w2: torch.Tensor  # [E, H, 3072 / 2]
    w2_s: torch.Tensor  # [E, H, 3072 / 32]
    sgu: torch.Tensor  # [2 x 3072, H] e4m3
    sgu_s: torch.Tensor  # [48, 56]
    sw2: torch.Tensor  # [H, 3072]
    sw2_s: torch.Tensor  # [56, 24]
    reachable: tuple[int, ...] | None = None
    uid: int = field(init=False, default_factory=lambda: next(_UIDS), compare=False)

    @property
    def experts(self) -> int:
        return self.gate.shape[0]

    def live(self) -> tuple[int, ...]:
        return tuple(range(self.experts)) if self.reachable is None else self.reachable


def _moe_weights(g: torch.Generator, experts: int, live: Sequence[int], bias: torch.Tensor, down: int = 0) -> Global:
    """Random weights scaled so gate / up run past the clamp (|g| ~ 8) and a rank's partial is O(1);
    `down` lowers the down projections' scale codes (their sum over 8 ranks is O(1) at down = 4)."""

    def u8(shape: tuple[int, ...], lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.uint8)

    gate = (torch.randn(experts, H, generator=g) * 0.03).to(torch.bfloat16)
    routed = {name: torch.empty(experts, *shape, dtype=torch.uint8) for name, shape in (
        ("w13", (2 * INTER, H // 2)), ("w13_s", (2 * INTER, H // 32)), ("w2", (H, INTER // 2)),
        ("w2_s", (H, INTER // 32)))}
    for e in live:
        routed["w13"][e], routed["w13_s"][e] = u8((2 * INTER, H // 2)), u8((2 * INTER, H // 32), 121, 124)
        routed["w2"][e], routed["w2_s"][e] = u8((H, INTER // 2)), u8((H, INTER // 32), 116 - down, 119 - down)
    return Global(gate=gate, bias=bias, **routed,
                  sgu=u8((2 * INTER, H)) & 0xBF, sgu_s=u8((2 * INTER // 128, H // 128), 123, 126),
                  sw2=u8((H, INTER)) & 0xBF, sw2_s=u8((H // 128, INTER // 128), 120 - down, 123 - down),
                  reachable=None if len(live) == experts else tuple(live))


def global_weights(seed: int = 3, experts: int = 8) -> Global:
    """`experts` routed experts, all reachable, bias ~ 0.1 N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(experts, generator=torch.Generator().manual_seed(seed + 1000)) * 0.1
    return _moe_weights(g, experts, range(experts), bias)


def _per_expert(w: Global, tensor: torch.Tensor, fn) -> torch.Tensor:
    """fn(tensor[e]) for every live expert into a torch.empty [E, ...] (the others never touched)."""
    first = fn(tensor[w.live()[0]])
    out = torch.empty(w.experts, *first.shape, dtype=first.dtype)
    for e in w.live():
        out[e] = fn(tensor[e])
    return out


def rank_slices(w: Global, rank: int, tp: int = TP) -> dict[str, torch.Tensor]:
    """Rank `rank`'s raw shares as FusedMoE / MergedColumnParallel / RowParallel shard them:
    gate rows [I r, I (r + 1)) and the same up rows (I = 3072 / tp); down's columns of that range."""
    local = INTER // tp
    share = torch.arange(local * rank, local * (rank + 1))
    rows = torch.cat([share, INTER + share])
    k8, k32 = slice(local // 2 * rank, local // 2 * (rank + 1)), slice(local // 32 * rank, local // 32 * (rank + 1))
    kb = slice(local // 128 * rank, local // 128 * (rank + 1))
    return dict(w13=_per_expert(w, w.w13, lambda t: t[rows]), w13_s=_per_expert(w, w.w13_s, lambda t: t[rows]),
                w2=_per_expert(w, w.w2, lambda t: t[:, k8].contiguous()),
                w2_s=_per_expert(w, w.w2_s, lambda t: t[:, k32].contiguous()),
                sgu=w.sgu[rows], sgu_s=w.sgu_s[torch.cat([rows[:local:128], rows[local::128]]) // 128],
                sw2=w.sw2[:, local * rank: local * (rank + 1)], sw2_s=w.sw2_s[:, kb])


def vllm_layout(w: Global, rank: int, hash_layer: bool = False, tp: int = TP) -> dict[str, torch.Tensor | None]:
    """The rank's MoE weights after vLLM's loading, as the fields of mono_jit's MoeWeights (uint8
    bytes; the shared expert's scales as 128 x 128 codes): experts through AITER's A8W4 shuffles
    (fused_moe/oracle/mxfp4.py:1834-1857; w2_s through the plain shuffle_scale, 12 columns padded to
    16), the shared gate_up (16, 16)-preshuffled (amd/model.py:146 prepare_gateup_preshuffle); bias
    None on a hash layer. Each live expert is shuffled on its own (the shuffles keep experts apart);
    the others stay torch.empty."""
    raw = rank_slices(w, rank, tp)
    cols = -(-(INTER // tp // 32) // 8) * 8
    return dict(
        gate=w.gate, bias=None if hash_layer else w.bias,
        w13=_per_expert(w, raw["w13"], lambda t: aiter_shuffle_weight_a16w4(t[None].contiguous(), True)[0]),
        w13_s=_per_expert(w, raw["w13_s"], lambda t: aiter_shuffle_scale_a16w4(t.contiguous(), 1, True)
                          ).view(-1, H // 32),
        w2=_per_expert(w, raw["w2"], lambda t: aiter_shuffle_weight_a16w4(t[None].contiguous(), False)[0]),
        w2_s=_per_expert(w, raw["w2_s"], lambda t: aiter_shuffle_scale(t)).view(-1, cols),
        sgu=aiter_shuffle_weight_16x16(raw["sgu"].contiguous()), sgu_s=raw["sgu_s"].contiguous(),
        sw2=raw["sw2"].contiguous(), sw2_s=raw["sw2_s"].contiguous())


def vllm_shared(x: torch.Tensor, raw: dict[str, torch.Tensor], limit: float = LIMIT) -> torch.Tensor:
    """DeepseekV4MLP on one rank (amd/model.py:179): bf16 gate_up, bf16 act, bf16 down (MX per-32
    inputs as mono's shared stage; vLLM's own quantises per 128)."""
    gate_up = (mx8(x) @ dequant_fp8_blocks(raw["sgu"], raw["sgu_s"]).T).to(torch.bfloat16)
    h = clamped_swiglu(gate_up.float(), limit).to(torch.bfloat16)
    return (mx8(h) @ dequant_fp8_blocks(raw["sw2"], raw["sw2_s"]).T).to(torch.bfloat16)


def vllm_routed(x: torch.Tensor, raw: dict[str, torch.Tensor], ids: torch.Tensor, weights: torch.Tensor,
                limit: float = LIMIT) -> torch.Tensor:
    """fused_moe's reference semantics for A8W4 on one rank, a token and a pick at a time:
    out[t] += w[t, k] x down_e(MXFP8(bf16(act(MXFP8(x_t) . gate_up_e)))), then bf16."""
    xq = mx8(x)
    out = torch.zeros(x.shape[0], H)
    dequantised: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for t in range(x.shape[0]):
        for k in range(TOP_K):
            e = int(ids[t, k])
            if e not in dequantised:
                dequantised[e] = (dequant_mxfp4(raw["w13"][e], raw["w13_s"][e]),
                                  dequant_mxfp4(raw["w2"][e], raw["w2_s"][e]))
            w13, w2 = dequantised[e]
            h = clamped_swiglu(xq[t:t + 1] @ w13.T, limit).to(torch.bfloat16)
            out[t] += weights[t, k] * (mx8(h) @ w2.T)[0]
    return out.to(torch.bfloat16)


# dequantised experts, full width, as bf16 (exact: e2m1 x 2^k), least recently used first
_EXPERT_CACHE: OrderedDict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
EXPERT_CACHE_BYTES = int(os.environ.get("LAYER_MATH_EXPERT_CACHE_MB", "1100")) << 20


def expert_weights(w: Global, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w13 [6144, H], w2 [H, 3072]) bf16 of expert e, through a small LRU (132 MB an expert;
    LAYER_MATH_EXPERT_CACHE_MB bounds it, default 1100)."""
    key = (w.uid, e)
    if key in _EXPERT_CACHE:
        _EXPERT_CACHE.move_to_end(key)
        return _EXPERT_CACHE[key]
    if w.reachable is not None and e not in w.reachable:
        raise ValueError(f"expert {e} is not reachable (its weights were never written)")
    pair = (dequant_mxfp4(w.w13[e], w.w13_s[e]).to(torch.bfloat16), dequant_mxfp4(w.w2[e], w.w2_s[e]).to(torch.bfloat16))
    _EXPERT_CACHE[key] = pair
    size = lambda p: sum(t.numel() * t.element_size() for t in p)  # noqa: E731
    while sum(size(p) for p in _EXPERT_CACHE.values()) > EXPERT_CACHE_BYTES and len(_EXPERT_CACHE) > 1:
        _EXPERT_CACHE.popitem(last=False)
    return pair


def moe_partials(x: torch.Tensor, w: Global, hash_ids: torch.Tensor | None = None, tp: int = TP
                 ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(every rank's bf16 MoE partial [M, H] in rank order, ids, weights): vllm_shared + vllm_routed
    per rank, computed at full width once and cut per rank (each rank's gate / up rows, its
    intermediate share's MXFP8 blocks, which the 32-aligned shares keep apart, and its down columns),
    then partial_r = bf16(routed_r + shared_r) (fused_moe/runner/moe_runner.py:790)."""
    ids, weights = vllm_route(x, w.gate, None if hash_ids is not None else w.bias, hash_ids)
    m, local = x.shape[0], INTER // tp
    xq = mx8(x)
    gate_up = torch.cat([block_gemv(xq, w.sgu[c:c + 1024], w.sgu_s[c // 128:(c + 1024) // 128])
                         for c in range(0, 2 * INTER, 1024)], 1).float().to(torch.bfloat16)
    h = mx8(clamped_swiglu(gate_up.float()).to(torch.bfloat16))
    shared = [_bf16(block_gemv(h[:, local * r:local * (r + 1)], w.sw2[:, local * r:local * (r + 1)],
                               w.sw2_s[:, local // 128 * r:local // 128 * (r + 1)])) for r in range(tp)]
    picks = torch.zeros(tp, m, TOP_K, H)
    for e in sorted({int(e) for e in ids.flatten().tolist()}):
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        w13, w2 = expert_weights(w, e)
        hq = mx8(clamped_swiglu(xq[rows] @ w13.float().T).to(torch.bfloat16))
        w2f = w2.float()
        for r in range(tp):
            cut = slice(local * r, local * (r + 1))
            picks[r, rows, slots] = weights[rows, slots, None] * (hq[:, cut] @ w2f[:, cut].T)
    partials = []
    for r in range(tp):
        routed = torch.zeros(m, H)
        for k in range(TOP_K):
            routed = routed + picks[r, :, k]
        partials.append((routed.to(torch.bfloat16).float() + shared[r].float()).to(torch.bfloat16))
    return partials, ids, weights


def vllm_moe(x: torch.Tensor, w: Global, hash_ids: torch.Tensor | None = None,
             ranks: range = range(TP)) -> torch.Tensor:
    """The MoE's all-reduced output over `ranks`: per rank bf16(shared + routed), summed in f32 in
    rank order, one bf16 rounding."""
    partials, _, _ = moe_partials(x, w, hash_ids)
    return all_reduce([partials[r] for r in ranks])


# -- one layer's checkpoint and vLLM's per-rank tensors --------------------------------------------

@dataclass
class CheckpointLayer:
    """One layer's unsharded weights in checkpoint form: e4m3 as uint8 bytes, 128 x 128 E8M0 block
    codes (uint8), MXFP4 packed bytes with per-32 E8M0 codes; plain row-major, no AITER shuffles."""

    layer_id: int
    ratio: int  # 4 (CSA) or 128 (HCA)
    hash_layer: bool
    hc_attn_fn: torch.Tensor  # [24, 4 H] f32
    hc_attn_base: torch.Tensor  # [24] f32
    hc_attn_scale: torch.Tensor  # [3] f32
    attn_norm: torch.Tensor  # [H] bf16
    hc_ffn_fn: torch.Tensor
    hc_ffn_base: torch.Tensor
    hc_ffn_scale: torch.Tensor
    ffn_norm: torch.Tensor
    wqkv: torch.Tensor  # [2048, H] u8: q_a rows (1536) then kv rows (512)
    s_wqkv: torch.Tensor  # [16, 56]
    q_norm: torch.Tensor  # [1536] bf16
    kv_norm: torch.Tensor  # [512] bf16
    wq_b: torch.Tensor  # [128 x 512, 1536] u8
    s_wq_b: torch.Tensor  # [512, 12]
    wo_a: torch.Tensor  # [16 x 1024, 4096] u8
    s_wo_a: torch.Tensor  # [128, 32]
    wo_b: torch.Tensor  # [H, 16384] u8
    s_wo_b: torch.Tensor  # [56, 128]
    attn_sink: torch.Tensor  # [128] f32
    cos_sin: torch.Tensor  # [P, 64] f32: cos | sin
    moe: Global  # 384 experts, `reachable` of them with weights


def _fp8(g: torch.Generator, n: int, k: int) -> torch.Tensor:
    """e4m3 bytes with exponent field 0..7 (|v| < 2, no NaN): bit 6 cleared."""
    return torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8) & 0xBF


def _codes(g: torch.Generator, n: int, k: int, lo: int) -> torch.Tensor:
    return torch.randint(lo, lo + 3, (n, k), generator=g, dtype=torch.uint8)


def random_checkpoint_layer(layer_id: int, ratio: int, hash_layer: bool, seed: int, reachable: int = 8,
                            positions: int = 4096) -> CheckpointLayer:
    """Random weights whose activations stay O(1): wqkv / wq_b codes so the GEMV outputs are ~1
    before their norms; wo_a / wo_b so the attention output y is O(1) beside the residual; the
    sink ~ N(4, 1) (~10% of a row's mass: dropping it shows); RoPE angles uniform per (position,
    pair), so a wrong pairing shows at every position. MoE as global_weights at 384 experts, of which
    `reachable` (a seeded choice that always holds expert 383, the tensors' end) hold weights; on a
    non-hash layer their bias is +50 over N(0, 0.1) so only they win the top 6 (route_table gives a
    hash layer's). About 0.65 GB a layer (the reachable experts 33 MB each)."""
    if ratio not in (deepseek_v4.CSA_RATIO, deepseek_v4.HCA_RATIO):
        raise ValueError(f"ratio {ratio}: 4 or 128")
    g = torch.Generator().manual_seed(seed)
    mhc = lambda: dict(fn=torch.randn(24, 4 * H, generator=g) * 0.01, base=torch.randn(24, generator=g) * 0.1,  # noqa: E731
                       scale=torch.rand(3, generator=g) + 0.5, norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16())
    attn, ffn = mhc(), mhc()
    theta = torch.rand(positions, ROPE // 2, generator=g) * 2 * math.pi
    picks = torch.randperm(EXPERTS - 1, generator=g)[:reachable - 1].tolist() + [EXPERTS - 1]
    live = tuple(sorted(picks))
    bias = torch.randn(EXPERTS, generator=g) * 0.1
    bias[list(live)] += 50.0
    return CheckpointLayer(
        layer_id=layer_id, ratio=ratio, hash_layer=hash_layer,
        hc_attn_fn=attn["fn"], hc_attn_base=attn["base"], hc_attn_scale=attn["scale"], attn_norm=attn["norm"],
        hc_ffn_fn=ffn["fn"], hc_ffn_base=ffn["base"], hc_ffn_scale=ffn["scale"], ffn_norm=ffn["norm"],
        wqkv=_fp8(g, Q_LORA + KV_LORA, H), s_wqkv=_codes(g, 16, H // 128, 120),
        q_norm=(1 + 0.2 * torch.randn(Q_LORA, generator=g)).bfloat16(),
        kv_norm=(1 + 0.2 * torch.randn(KV_LORA, generator=g)).bfloat16(),
        wq_b=_fp8(g, HEADS * D, Q_LORA), s_wq_b=_codes(g, HEADS * D // 128, Q_LORA // 128, 121),
        wo_a=_fp8(g, GROUPS * O_LORA, GROUP_K), s_wo_a=_codes(g, GROUPS * O_LORA // 128, GROUP_K // 128, 121),
        wo_b=_fp8(g, H, GROUPS * O_LORA), s_wo_b=_codes(g, H // 128, GROUPS * O_LORA // 128, 122),
        attn_sink=torch.randn(HEADS, generator=g) + 4.0,
        cos_sin=torch.cat([torch.cos(theta), torch.sin(theta)], 1).contiguous(),
        moe=_moe_weights(g, EXPERTS, live, bias, down=4))


def route_table(ckpt: CheckpointLayer, vocab: int, seed: int = 0) -> torch.Tensor:
    """A hash layer's tid2eid [vocab, 6] int32: per token 6 distinct reachable experts, seeded."""
    live = torch.tensor(ckpt.moe.live(), dtype=torch.int32)
    if len(live) < TOP_K:
        raise ValueError(f"{len(live)} reachable experts: a token needs {TOP_K} distinct ones")
    g = torch.Generator().manual_seed(seed)
    return torch.stack([live[torch.randperm(len(live), generator=g)[:TOP_K]] for _ in range(vocab)])


ATTN_FIELDS = ("layer_id", "wqkv", "wqkv_scale", "q_norm", "kv_norm", "wq_b", "wq_b_scale", "wo_a", "wo_a_scale",
               "wo_b", "wo_b_scale", "attn_sink", "cos_sin", "ratio")


def front_tensors(ckpt: CheckpointLayer, rank: int, tp: int = TP) -> dict[str, torch.Tensor]:
    """The part of `rank_tensors` that the attention seam and front read (the layer's first launch):
    wqkv, wqkv_scale, q_norm, kv_norm, wq_b, wq_b_scale, cos_sin, hc_attn_fn / scale / base,
    attn_norm."""
    qrows = slice(HEADS // tp * D * rank, HEADS // tp * D * (rank + 1))
    return dict(
        wqkv=aiter_shuffle_weight_16x16(ckpt.wqkv).view(E4M3), wqkv_scale=mx32(ckpt.s_wqkv),
        q_norm=ckpt.q_norm, kv_norm=ckpt.kv_norm,
        wq_b=padded(ckpt.wq_b[qrows]), wq_b_scale=mx32(ckpt.s_wq_b[qrows.start // 128:qrows.stop // 128]),
        cos_sin=ckpt.cos_sin, hc_attn_fn=ckpt.hc_attn_fn, hc_attn_scale=ckpt.hc_attn_scale,
        hc_attn_base=ckpt.hc_attn_base, attn_norm=ckpt.attn_norm)


def rank_tensors(ckpt: CheckpointLayer, rank: int, tp: int = TP) -> dict[str, torch.Tensor | int | None]:
    """TP rank `rank`'s tensors as vLLM 0.33 holds them after loading and preshuffling, keyed by the
    keyword fields of mono_jit's AttnWeights (ATTN_FIELDS) and MonoLayerWeights (all but `attn`), as
    MonoDecodeLayer.weights (amd/mono_decode.py:255-306) builds them:

    - wqkv e4m3 [2048, H] (16, 16)-preshuffled (replicated: disable_tp, attention.py:252-258; rocm.py:1068
      prepare_attn_preshuffle), wqkv_scale mx32 [64, 224];
    - wq_b e4m3 [heads 512, 1536] the rank's heads (ColumnParallel), padded rows (1536 + 256 bytes
      apart), wq_b_scale mx32 [heads 16, 48];
    - wo_a e4m3 [groups 1024, 4096] groups (tp / 16) r.., padded rows (4096 + 256), wo_a_scale mx32;
    - wo_b e4m3 [H, groups 1024] those groups' columns (RowParallel), preshuffled, wo_b_scale mx32;
    - attn_sink f32 [heads]: the rank's heads only (model_loader/weight_utils.py:1568
      load_attention_sink narrows the global sink to heads r.., padded heads -inf; the ROCm layer
      pads none, rocm.py:1065), cos_sin, ratio, layer_id;
    - the seams' hc_* and norms (replicated); MoE: gate_w, bias (None on a hash layer), w13 / w2 as
      float4_e2m1fn_x2 and w13_s / w2_s uint8 through AITER's A8W4 shuffles ([384, ...]: only the
      reachable experts written), sgu e4m3 preshuffled [2 I, H] with sgu_s mx32, sw2 e4m3 [H, I]
      (K = I is no multiple of 512: not padded) with sw2_s mx32."""
    groups = GROUPS // tp
    arows = slice(groups * O_LORA * rank, groups * O_LORA * (rank + 1))
    moe = vllm_layout(ckpt.moe, rank, ckpt.hash_layer, tp)
    return dict(
        layer_id=ckpt.layer_id, ratio=ckpt.ratio, **front_tensors(ckpt, rank, tp),
        wo_a=padded(ckpt.wo_a[arows]), wo_a_scale=mx32(ckpt.s_wo_a[arows.start // 128:arows.stop // 128]),
        wo_b=aiter_shuffle_weight_16x16(ckpt.wo_b[:, arows].contiguous()).view(E4M3),
        wo_b_scale=mx32(ckpt.s_wo_b[:, arows.start // 128:arows.stop // 128]),
        attn_sink=ckpt.attn_sink[HEADS // tp * rank:HEADS // tp * (rank + 1)].clone(),
        hc_ffn_fn=ckpt.hc_ffn_fn, hc_ffn_scale=ckpt.hc_ffn_scale, hc_ffn_base=ckpt.hc_ffn_base, ffn_norm=ckpt.ffn_norm,
        gate_w=moe["gate"], bias=moe["bias"], w13=moe["w13"].view(FP4), w13_s=moe["w13_s"],
        w2=moe["w2"].view(FP4), w2_s=moe["w2_s"], sgu=moe["sgu"].view(E4M3), sgu_s=mx32(moe["sgu_s"]),
        sw2=moe["sw2"].view(E4M3), sw2_s=mx32(moe["sw2_s"]))


# -- one decode step ---------------------------------------------------------------------------------

@dataclass
class LayerStep:
    """One rank-independent decode step of one layer, as the hook sees it (M rows; rows with
    slot_mapping -1 are graph padding: their metadata is never read, they get no keys)."""

    x: torch.Tensor | None  # [M, H] bf16 (None on layer 0)
    residual: torch.Tensor  # [M, 4, H] bf16 (layer 0: the embedding broadcast to 4 streams)
    post_mix: torch.Tensor | None  # [M, 4, 1] f32
    res_mix: torch.Tensor | None  # [M, 4, 4] f32
    positions: torch.Tensor  # [M] int64
    slot_mapping: torch.Tensor  # [M] int64 SWA slots, -1 = pad
    swa_cache: torch.Tensor  # uint8 flat bytes BEFORE the step
    swa_page_stride: int
    swa_block: int  # records a page
    swa_indices: torch.Tensor  # [M, 128] int32 global SWA slots (valid: first swa_lens[r], >= 0)
    swa_lens: torch.Tensor  # [M] int32
    topk: torch.Tensor  # [M, W] int32: CSA local indices through block_table / HCA global slots; -1 none
    token_req: torch.Tensor | None  # [M] int32 (CSA)
    block_table: torch.Tensor | None  # [requests, pages] int32 (CSA)
    entries_per_page: int | None  # CSA: slot = block_table[req, i // P] P + i % P
    comp_cache: torch.Tensor  # compressed cache bytes (read only)
    comp_page_stride: int
    comp_block: int  # records at slot s live at page s // block, row s % block
    route_ids: torch.Tensor | None  # [M, 6] int32 on hash layers


@dataclass
class LayerExpected:
    normed: torch.Tensor  # [M, H] bf16 attn_norm of the attention seam's collapse (select's input)
    qr: torch.Tensor  # [M, 1536] bf16 q_norm'd q_a (select's input)
    records: torch.Tensor  # [M, 584] uint8: this step's KV records (pad rows' too; they are not written)
    out: torch.Tensor  # [M, H] bf16 MoE output all-reduced over the ranks
    res_out: torch.Tensor  # [M, 4, H] bf16
    post_out: torch.Tensor  # [M, 4, 1] f32
    comb_out: torch.Tensor  # [M, 4, 4] f32
    # beyond the hook's outputs, for diagnosis:
    swa_cache: torch.Tensor  # the SWA cache bytes after the step's insert
    attn_out: torch.Tensor  # [M, H] bf16 y, the attention output all-reduced
    pre_out: torch.Tensor  # [M, 4] f32 the FFN seam's pre
    expert_ids: torch.Tensor  # [M, 6] int32 the experts each row chose


def _live(step: LayerStep) -> list[int]:
    return [r for r, s in enumerate(step.slot_mapping.tolist()) if s >= 0]


def step_keys(step: LayerStep, swa_cache: torch.Tensor) -> list[torch.Tensor | None]:
    """Per row, its keys' records [n, 584]: the window's slots (the first swa_lens entries that are
    >= 0) from the SWA cache, then its compressed keys (the top-k entries >= 0; CSA through the
    block table, amd/rocm.py:371 _pack_global_topk_ragged_kernel; HCA global slots) from the
    compressed cache. A pad row: None. (vLLM counts a row's entries >= 0 and reads that many from
    the row's start, rocm.py:345-420: the same keys when -1s only trail, as the indexer writes them.)"""
    keys: list[torch.Tensor | None] = [None] * step.positions.shape[0]
    for r in _live(step):
        n = int(step.swa_lens[r])
        rows = [read_record(swa_cache, int(s), step.swa_page_stride, step.swa_block)
                for s in step.swa_indices[r, :n].tolist() if s >= 0]
        for i in step.topk[r].tolist():
            if i < 0:
                continue
            if step.block_table is not None:
                p = step.entries_per_page
                i = int(step.block_table[int(step.token_req[r]), i // p]) * p + i % p
            rows.append(read_record(step.comp_cache, i, step.comp_page_stride, step.comp_block))
        keys[r] = torch.stack(rows) if rows else None
    return keys


def attention_seam(step: LayerStep, w: CheckpointLayer) -> dict[str, torch.Tensor]:
    """The attention seam: mhc_post unless layer 0, mhc_pre, attn_norm. Returns r [M, 4, H] bf16,
    post [M, 4, 1], comb [M, 4, 4], pre [M, 4] (f32) and normed [M, H] bf16."""
    r = step.residual if step.x is None else mhc_post(step.x, step.residual, step.post_mix, step.res_mix)
    post, comb, collapse, pre = mhc_pre(r, w.hc_attn_fn, w.hc_attn_scale, w.hc_attn_base)
    return dict(r=r, post=post, comb=comb, pre=pre, normed=rms_norm(collapse, w.attn_norm))


def qkv_norms(normed: torch.Tensor, w: CheckpointLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """(qr [M, 1536], kv [M, 512]) bf16: wqkv of MX(normed), then the q and kv norms."""
    qkv = _bf16(block_gemv(mx8(normed), w.wqkv, w.s_wqkv))
    return rms_norm(qkv[:, :Q_LORA], w.q_norm), rms_norm(qkv[:, Q_LORA:], w.kv_norm)


def query(qr: torch.Tensor, w: CheckpointLayer, heads: slice = slice(0, HEADS)) -> torch.Tensor:
    """bf16 [M, heads, 512]: wq_b of MX(qr) for `heads`, before the head norm and RoPE."""
    rows = slice(heads.start * D, heads.stop * D)
    q = _bf16(block_gemv(mx8(qr), w.wq_b[rows], w.s_wq_b[rows.start // 128:rows.stop // 128], chunk=8192))
    return q.view(qr.shape[0], -1, D)


def decode_layer(step: LayerStep, w: CheckpointLayer, tp: int = TP, o: torch.Tensor | None = None) -> LayerExpected:
    """The layer's decode step as vLLM's ROCm path computes it with mono's MXFP8 activations (the
    module docstring lists every rounding point), the ranks' shares summed in rank order. `o`
    (bf16 [M, heads, 512]): a kernel's own attention output to carry on from instead of
    dense_attention's, to check the stages after it from their own input."""
    m = step.residual.shape[0]
    seam_a = attention_seam(step, w)
    r, post_a, comb_a, normed = seam_a["r"], seam_a["post"], seam_a["comb"], seam_a["normed"]
    qr, kv = qkv_norms(normed, w)
    q = q_heads(query(qr, w), w.cos_sin, step.positions)
    records = encode_records(kv_rope(kv, w.cos_sin, step.positions))
    swa_cache = step.swa_cache.clone()
    insert_records(swa_cache, records, step.slot_mapping, step.swa_page_stride, step.swa_block)
    # the sparse attention over the cache after the insert, the inverse RoPE, wo_a, wo_b per rank
    if o is None:
        o = dense_attention(q, step_keys(step, swa_cache), w.attn_sink)
    xo = mx8(inverse_rope_vllm(o, w.cos_sin, step.positions, torch.float32).flatten(1))
    z = torch.cat([block_gemv(xo[:, g * GROUP_K:(g + 1) * GROUP_K], w.wo_a[g * O_LORA:(g + 1) * O_LORA],
                              w.s_wo_a[g * O_LORA // 128:(g + 1) * O_LORA // 128]) for g in range(GROUPS)], 1)
    zq = mx8(_bf16(z))
    cols = GROUPS // tp * O_LORA
    y = all_reduce([_bf16(block_gemv(zq[:, cols * k:cols * (k + 1)], w.wo_b[:, cols * k:cols * (k + 1)],
                               w.s_wo_b[:, cols * k // 128:cols * (k + 1) // 128]))
                    for k in range(tp)])
    # the FFN seam and the MoE
    seam = mhc_seam(y, r, post_a, comb_a, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, w.ffn_norm)
    partials, ids, _ = moe_partials(seam["x_norm"], w.moe, step.route_ids if w.hash_layer else None, tp)
    return LayerExpected(normed=normed, qr=qr, records=records, out=all_reduce(partials), res_out=seam["r"],
                         post_out=seam["post"].reshape(m, 4, 1), comb_out=seam["comb"], swa_cache=swa_cache,
                         attn_out=y, pre_out=seam["pre"], expert_ids=ids)


# -- a random step -----------------------------------------------------------------------------------

SWA_BLOCK, COMP_BLOCK_BYTES = 64, 256  # vLLM's SWA block; a 256-token KV block gives 256 / ratio records


def _paged(block: int, pages: int, stride: int, g: torch.Generator) -> torch.Tensor:
    """A flat cache of random bf16-valued records (encoded by encode_records), 0xEE in page tails."""
    cache = torch.full((pages * stride,), 0xEE, dtype=torch.uint8)
    kv = torch.randn(block * pages, D, generator=g).to(torch.bfloat16)
    insert_records(cache, encode_records(kv), torch.arange(block * pages), stride, block)
    return cache


def _poison(cache: torch.Tensor, slots: Sequence[int], stride: int, block: int) -> None:
    """NaN records (e4m3 0x7F NoPE bytes) at slots nothing may read."""
    for s in slots:
        data, _ = _record_offsets(s, stride, block)
        cache[data:data + NOPE] = 0x7F


def random_step(w: CheckpointLayer, m: int = 4, seed: int = 0, first: bool = False, pads: Sequence[int] = (),
                vocab: int = 1000) -> LayerStep:
    """A decode step of m rows: rows 0 and 1 are consecutive tokens of request 0 (row 1's window
    holds row 0's slot, written this step), the others one request each; `pads` rows are graph
    padding (slot -1; their metadata points past both caches, at a request that does not exist).
    The SWA cache maps (request, position) to a slot by a ring of 256 slots a request; slots no
    live window holds are NaN records. CSA: (p + 1) // 4 compressed entries through a random block
    table, the top-k a random subset of them (at most 96), -1 after; HCA: a random set of
    (p + 1) // 128 global compressed slots (at least 1). Positions >= 150 so windows are full."""
    g = torch.Generator().manual_seed(seed)
    live = [r for r in range(m) if r not in pads]
    requests = max(1, len(live) - 1)
    ring = 256
    swa_pages = requests * ring // SWA_BLOCK + 1
    swa_stride = SWA_BLOCK * RECORD + 128
    swa = _paged(SWA_BLOCK, swa_pages, swa_stride, g)
    perm = torch.randperm(requests * ring, generator=g)
    slot_of = lambda req, pos: int(perm[req * ring + pos % ring])  # noqa: E731
    positions = torch.randint(150, w.cos_sin.shape[0] - 2, (m,), generator=g)
    req_of = {r: (0 if i < 2 else i - 1) for i, r in enumerate(live)}
    if len(live) >= 2:
        positions[live[1]] = positions[live[0]] + 1
    slots = torch.full((m,), -1, dtype=torch.int64)
    swa_indices = torch.full((m, WINDOW), 10 ** 6, dtype=torch.int32)
    swa_lens = torch.full((m,), WINDOW, dtype=torch.int32)
    read: set[int] = set()
    for r in live:
        p = int(positions[r])
        slots[r] = slot_of(req_of[r], p)
        window = [slot_of(req_of[r], q) for q in range(p - WINDOW + 1, p + 1)]
        swa_indices[r] = torch.tensor(window, dtype=torch.int32)
        read.update(window)
    if live:
        swa_indices[live[0], 3] = -1  # a hole in a window: masked
    _poison(swa, [s for s in range(swa_pages * SWA_BLOCK) if s not in read], swa_stride, SWA_BLOCK)
    comp_block = COMP_BLOCK_BYTES // w.ratio
    csa = w.ratio == deepseek_v4.CSA_RATIO
    token_req = torch.tensor([req_of.get(r, 99) for r in range(m)], dtype=torch.int32)
    if csa:
        pages_per_req = -(-(w.cos_sin.shape[0] // 4) // comp_block)
        comp_pages = requests * pages_per_req + 1
        block_table = torch.randperm(comp_pages - 1, generator=g)[:requests * pages_per_req].int().view(requests, -1)
        width = deepseek_v4.CSA_INDEX_TOPK
    else:
        comp_pages, block_table, width = 64, None, 128
    comp_stride = comp_block * RECORD + 64
    comp = _paged(comp_block, comp_pages, comp_stride, g)
    _poison(comp, range((comp_pages - 1) * comp_block, comp_pages * comp_block), comp_stride, comp_block)
    topk = torch.full((m, width), 10 ** 6, dtype=torch.int32)
    for r in live:
        p = int(positions[r])
        topk[r] = -1
        if csa:
            n = (p + 1) // 4
            chosen = torch.randperm(n, generator=g)[:min(n, 96)].int()
        else:
            chosen = torch.randperm((comp_pages - 1) * comp_block, generator=g)[:max(1, (p + 1) // 128)].int()
        topk[r, :len(chosen)] = chosen
    x, residual = torch.randn(m, H, generator=g).bfloat16(), torch.randn(m, 4, H, generator=g).bfloat16()
    post_mix = torch.rand(m, 4, 1, generator=g) * 2
    res_mix = torch.softmax(torch.randn(m, 4, 4, generator=g), -1)
    res_mix = res_mix / res_mix.sum(-2, keepdim=True)
    if first:
        residual = residual[:, :1].expand(m, 4, H).contiguous()
        x = post_mix = res_mix = None
    route_ids = None
    if w.hash_layer:
        tokens = torch.randint(0, vocab, (m,), generator=g)
        route_ids = route_table(w, vocab)[tokens].contiguous()
    return LayerStep(
        x=x, residual=residual, post_mix=post_mix, res_mix=res_mix, positions=positions, slot_mapping=slots,
        swa_cache=swa, swa_page_stride=swa_stride, swa_block=SWA_BLOCK, swa_indices=swa_indices, swa_lens=swa_lens,
        topk=topk, token_req=token_req if csa else None, block_table=block_table,
        entries_per_page=comp_block if csa else None, comp_cache=comp, comp_page_stride=comp_stride,
        comp_block=comp_block, route_ids=route_ids)


# -- comparing a layer's outputs with decode_layer ---------------------------------------------------

# Relative norm errors a layer's outputs may have against decode_layer (live rows). Both sides
# quantise at the same points, so they differ only where a summation-order ulp flips a rounding;
# a flipped MXFP8 code moves its element one e4m3 step (half-ulp 2^-4 relative) and every later
# MXFP8 of a dependent value flips with it. normed and qr (bf16 flips only): 1e-3; res_out,
# post_out, comb_out (y through two MXFP8 steps, y about 60% of res_out's norm): 1e-2; out
# (through the MoE's MXFP8 of h, saturating near 2.5e-2 when fully decorrelated): 5e-2.
BOUNDS = {"normed": 1e-3, "qr": 1e-3, "res_out": 1e-2, "post_out": 1e-2, "comb_out": 1e-2, "out": 5e-2}


def layer_errors(got: dict[str, torch.Tensor], want: LayerExpected, rows: Sequence[int]) -> dict[str, float]:
    """Each of got's outputs (names as BOUNDS') against want's, over `rows` (the live ones)."""
    index = torch.tensor(list(rows))
    return {name: float((t[index].double() - getattr(want, name)[index].double()).norm()
                        / getattr(want, name)[index].double().norm()) for name, t in got.items()}


def check_swa_cache(got: torch.Tensor, want: torch.Tensor, step: LayerStep) -> float:
    """Byte for byte: every byte outside this step's records identical (no stray write, pad rows'
    -1 slots untouched); the records' bytes identical but where an upstream bf16 ulp (the mHC
    sums' order) moves a value across a rounding point: then that byte is one code off (an e4m3
    step, or a bf16 ulp's low byte), and at most 1 byte in 100 is (measured: 1 of 1752). Returns
    the fraction of the records' bytes that differ."""
    written = torch.zeros_like(got)
    live = step.slot_mapping >= 0
    insert_records(written, torch.ones(int(live.sum()), 584, dtype=torch.uint8), step.slot_mapping[live],
                   step.swa_page_stride, step.swa_block)
    outside = written == 0
    assert torch.equal(got[outside], want[outside]), "the SWA cache changed outside this step's records"
    inside = (got[~outside].int() - want[~outside].int()).abs()
    assert int(inside.max()) <= 1 and int((inside > 0).sum()) * 100 <= inside.numel(), \
        f"{int((inside > 0).sum())} of {inside.numel()} record bytes differ, by up to {int(inside.max())}"
    return int((inside > 0).sum()) / inside.numel()
