"""Pure-torch reference of K2 part one, stage by stage; its docstrings define the kernel's semantics.

Rounding points (where a value becomes bf16 or MXFP8), as vLLM's ROCm decode path rounds: the
attention output o (bf16, the decode output's dtype), o after the inverse RoPE (MXFP8 per 32,
straight from f32), wo_a's output (bf16, then MXFP8 per 32 into wo_b), wo_b's output (the rank's
bf16 partial), the all-reduced sum (bf16), then K1's seam roundings. Inside a stage everything
is f32, dot products in f64 (as K1's GEMVs). Sources are cited by path under vllm/ (0.33.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ... import deepseek_v4
from ..reference_math import (collapse, fold, fp8_gemv, kv_dequantize, kv_read, mxfp8_quantize, rms_norm, rope_angles,
                              rope_gptj, seam_gate)
from ...deepseek_v4 import HEAD_DIM, NOPE
from ..geometry import KV_RECORD, MX_BLOCK, WEIGHT_BLOCK
from ..keytable.reference import key_table
from .attention_layout import O_LORA
LOG2E = math.log2(math.e)  # natural logits to base 2: the softmax runs on exp2
SCALE = HEAD_DIM ** -0.5  # vllm/models/deepseek_v4/attention.py:244 (self.scale)


@dataclass
class PagedCache:
    """A flat byte cache of fp8_ds_mla records: `block` records a page, pages `page_stride` bytes
    apart (K1's kv_insert / kv_read layout)."""

    data: torch.Tensor  # uint8
    page_stride: int
    block: int


@dataclass
class K2Weights:
    """One layer's K2 part-one weights as vLLM holds them on one rank (fp8 as uint8 bytes)."""

    attn_sink: torch.Tensor  # [heads] f32: this rank's heads of the global sink
    wo_a: torch.Tensor  # [groups x 1024, stride >= heads / groups x 512] e4m3 (rows padded by vLLM)
    s_woa: torch.Tensor  # [groups x 8, 32] E8M0 of 128 x 128 blocks
    wo_b: torch.Tensor  # [7168, groups x 1024] e4m3, AITER-preshuffled (16, 16)
    s_wob: torch.Tensor  # [56, groups x 8] E8M0
    rope: torch.Tensor  # [P, 64] f32 cos | sin
    hc_ffn_fn: torch.Tensor  # [24, 4 H] f32
    hc_ffn_base: torch.Tensor  # [24] f32
    hc_ffn_scale: torch.Tensor  # [3] f32
    ffn_norm: torch.Tensor  # [H] bf16


@dataclass
class K2Inputs:
    """What K2 reads on one rank: K1's q for its heads and K1's seam state, vLLM's metadata."""

    q: torch.Tensor  # [M, heads, 512] bf16 (K1's q_out)
    positions: torch.Tensor  # [M]
    slot_mapping: torch.Tensor  # [M] int64, -1 = graph padding
    swa_indices: torch.Tensor  # [M, 128] int32 global SWA slots, -1 padded
    swa_lens: torch.Tensor  # [M] int32
    topk: torch.Tensor  # [M, W] int32: CSA local indices / HCA global slots, -1 padded
    ratio: int  # 4 (CSA) or 128 (HCA)
    swa_cache: PagedCache
    comp_cache: PagedCache
    residual: torch.Tensor  # [M, 4, H] bf16: K1's R after its fold
    post: torch.Tensor  # [M, 4] f32: K1's post
    comb: torch.Tensor  # [M, 4, 4] f32: K1's comb
    token_req: torch.Tensor | None = None  # [M] (CSA)
    block_table: torch.Tensor | None = None  # [R, pages] compressed block table (CSA)
    entries_per_page: int | None = None  # CSA: kv block size / 4


# -- 1. the key table -----------------------------------------------------------------------

@dataclass
class Keys:
    slots: torch.Tensor  # [M, W + 128] int32, -1 after a row's keys
    lens: torch.Tensor  # [M] int32
    swa: torch.Tensor  # [M] int32: a row's leading keys that are SWA slots


def keys(x: K2Inputs) -> Keys:
    """Stage 1: the `keytable` reference's table, with each row's count of SWA keys; graph-pad
    rows (slot_mapping -1) get no keys, and their metadata is not read.

    vLLM keeps the two sources apart: the window indexes the SWA cache, the top-k the compressed
    cache, each with its own block size (models/deepseek_v4/amd/rocm.py:1500 _forward_decode ->
    v1/attention/ops/rocm_aiter_mla_sparse.py:4561 rocm_sparse_attn_decode: main_cache and
    extra_cache). The table holds the window first, so a row's first `swa` keys (its window's
    slots >= 0) are SWA slots and the rest compressed ones.
    """
    m = x.q.shape[0]
    live = x.slot_mapping[:m] >= 0
    window = x.swa_indices.reshape(-1, deepseek_v4.SWA_WINDOW)[:m][live]  # vLLM's [T, 1, 128], T >= M
    lens_in = x.swa_lens[:m][live]
    csa = x.ratio == deepseek_v4.CSA_RATIO
    slots_live, lens_live = key_table(window, lens_in, x.topk[:m][live], x.ratio,
                                      x.token_req[:m][live] if csa else None, x.block_table, x.entries_per_page)
    in_window = torch.arange(deepseek_v4.SWA_WINDOW) < lens_in[:, None].long()
    slots = torch.full((m, slots_live.shape[1]), -1, dtype=torch.int32)
    lens, swa = torch.zeros(m, dtype=torch.int32), torch.zeros(m, dtype=torch.int32)
    slots[live], lens[live] = slots_live, lens_live
    swa[live] = ((window >= 0) & in_window).sum(1, dtype=torch.int32)
    return Keys(slots, lens, swa)


# -- 2. the records and the sparse MQA ------------------------------------------------------

def gather(k: Keys, swa_cache: PagedCache, comp_cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [M, K, 512] f32, valid [M, K]), K = the longest row: key j of row r read from the
    SWA cache when j < swa[r], else from the compressed cache (K1's kv_read), and dequantised
    (K1's kv_dequantize: e4m3 x 2^(code - 127) per 64 NoPE dims, bf16 RoPE dims). Keys past a
    row's length are masked and never read (their values are zero).
    vLLM: v1/attention/ops/rocm_aiter_mla_sparse.py:2943 _sparse_attn_decode_gfx950_partial_loaded_tile
    (a page's 576-byte rows, then its 8-byte scale rows)."""
    m, width = k.lens.shape[0], int(k.lens.max())
    records = torch.zeros(m, width, KV_RECORD, dtype=torch.uint8)
    for r in range(m):
        for j in range(int(k.lens[r])):
            cache = swa_cache if j < int(k.swa[r]) else comp_cache
            records[r, j] = kv_read(cache.data, int(k.slots[r, j]), cache.page_stride, cache.block)
    valid = torch.arange(width) < k.lens[:, None].long()
    return kv_dequantize(records.view(-1, KV_RECORD)).view(m, width, HEAD_DIM), valid


def scores(q: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Base-2 logits [M, heads, K]: (q . k) x 512^-0.5 x log2(e) (dot in f64, then f32); -inf
    where masked. vLLM: rocm_aiter_mla_sparse.py:2943 (scores *= scale * 1.4426950408889634)."""
    s = torch.einsum("mhd,mkd->mhk", q.double(), values.double()).float() * (SCALE * LOG2E)
    return s.masked_fill(~valid[:, None, :], float("-inf"))


def attend(q: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Stage 2, unsplit: o [M, heads, 512] f32 = sum_k 2^(s_k - m) v_k / (sum_k 2^(s_k - m) +
    2^(sink x log2(e) - m)), m the max over the keys and the sink. MQA: a key's value is its
    whole 512-dim record (RoPE dims included). The sink (a natural-log logit per head) enters the
    denominator only. vLLM: v1/attention/backends/mla/rocm_aiter_mla_sparse.py:752
    reference_mla_sparse_prefill (base-2 log-sum-exp, masked keys -inf), with the sink as
    rocm_aiter_mla_sparse.py:3371 _sparse_attn_decode_reduce_kernel folds it."""
    p, denominator = softmax_weights(q, values, valid, sink)
    return weighted(p, denominator, values)


def softmax_weights(q: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                    sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attend's unnormalised weights p [M, heads, keys] = 2^(s_k - m) (f32) and their
    denominator with the sink."""
    s = scores(q, values, valid)
    sink2 = (sink.float() * LOG2E).expand(s.shape[0], -1)
    m = _finite(torch.maximum(s.amax(-1), sink2) if s.shape[-1] else sink2)
    p = torch.exp2(s - m[..., None])
    return p, p.sum(-1) + torch.exp2(sink2 - m)


def weighted(p: torch.Tensor, denominator: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """sum_k p_k values_k / denominator [M, heads, 512] f32, the sum in f64."""
    return _normalise(torch.einsum("mhk,mkd->mhd", p.double(), values.double()).float(), denominator)


def _finite(m: torch.Tensor) -> torch.Tensor:
    """A max of nothing (-inf: no live key, and no sink) as 0, so 2^(-inf - m) is 0, not NaN."""
    return torch.where(torch.isinf(m), 0.0, m)


def _normalise(acc: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """acc / denominator, 0 where nothing was summed (a pad row; a padded head's -inf sink with
    no live key), as rocm_aiter_mla_sparse.py:3371 writes where(l_final > 0, acc / denom, 0)."""
    safe = torch.where(denominator > 0, denominator, 1.0)
    return torch.where(denominator[..., None] > 0, acc / safe[..., None], 0.0)


@dataclass
class Partial:
    """One chunk of keys' softmax state per (row, head), unnormalised and without the sink."""

    m: torch.Tensor  # [M, heads] base-2 max of the chunk's live scores, -inf when it has none
    l: torch.Tensor  # [M, heads] sum of 2^(s - m)
    acc: torch.Tensor  # [M, heads, 512] sum of 2^(s - m) v


def attend_chunk(q: torch.Tensor, values: torch.Tensor, valid: torch.Tensor) -> Partial:
    """A chunk's Partial (what one CTA of the split stage publishes). vLLM:
    rocm_aiter_mla_sparse.py:3043 _sparse_attn_decode_gfx950_partial_kernel."""
    s = scores(q, values, valid)
    m = s.amax(-1)
    p = torch.exp2(s - _finite(m)[..., None])
    return Partial(m, p.sum(-1), torch.einsum("mhk,mkd->mhd", p.double(), values.double()).float())


def merge(parts: Sequence[Partial], sink: torch.Tensor, rows: int) -> torch.Tensor:
    """The chunks' Partials merged exactly with the sink folded in: each weighed by 2^(m_c - m),
    m the max of the chunks' maxima and the sink's base-2 logit. vLLM: rocm_aiter_mla_sparse.py:3371
    _sparse_attn_decode_reduce_kernel."""
    sink2 = (sink.float() * LOG2E).expand(rows, -1)
    m = sink2
    for part in parts:
        m = torch.maximum(m, part.m)
    m = _finite(m)
    denominator = torch.exp2(sink2 - m)
    acc = torch.zeros(*m.shape, HEAD_DIM)
    for part in parts:
        weight = torch.exp2(part.m - m)
        denominator = denominator + part.l * weight
        acc = acc + part.acc * weight[..., None]
    return _normalise(acc, denominator)


def attend_split(q: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
                 chunk: int) -> torch.Tensor:
    """Stage 2 as the kernel runs it: keys in chunks of `chunk` (one CTA each), then merge;
    equal to attend up to f32 rounding."""
    parts = [attend_chunk(q, values[:, i:i + chunk], valid[:, i:i + chunk]) for i in range(0, values.shape[1], chunk)]
    return merge(parts, sink, q.shape[0])


# -- 3. inverse RoPE, wo_a, wo_b ------------------------------------------------------------

def inverse_rope(o: torch.Tensor, rope: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """f32 [M, heads, 512]: dims 448.. rotated back by the token's angle (GPT-J pairs: K1's
    rope_gptj with the sine negated: e' = e cos + o sin, o' = o cos - e sin), NoPE dims as they
    are. vLLM: v1/attention/ops/rocm_aiter_mla_sparse.py:1505 _inverse_rope_gptj_kernel."""
    cos, sin = rope_angles(rope, positions)
    out = o.to(torch.float32).clone()
    out[..., NOPE:] = rope_gptj(o[..., NOPE:], cos[:, None], -sin[:, None])
    return out


def wo_a(codes: torch.Tensor, scales: torch.Tensor, w: K2Weights) -> torch.Tensor:
    """bf16 [M, groups x 1024]: group g's MXFP8 input (its heads' 8 x 512 columns) times its 1024
    rows of wo_a (row-major, vLLM's padded row stride; 128 x 128 E8M0 blocks), K1's fp8_gemv.
    vLLM: rocm_aiter_mla_sparse.py:1943 rocm_mxfp8_wo_a_bmm (out[t, g] = a[t, g] @ W[g].T, bf16),
    models/deepseek_v4/amd/rocm.py:1111 _prepare_fp8_wo_a (the [groups, 1024, K] view)."""
    groups = w.wo_a.shape[0] // O_LORA
    k = codes.shape[1] // groups
    rows, blocks = O_LORA // WEIGHT_BLOCK, k // MX_BLOCK
    out = [fp8_gemv(codes[:, g * k:(g + 1) * k], scales[:, g * blocks:(g + 1) * blocks],
                       w.wo_a[g * O_LORA:(g + 1) * O_LORA], w.s_woa[g * rows:(g + 1) * rows], k)
           for g in range(groups)]
    return torch.cat(out, dim=1).to(torch.bfloat16)


def wo_b(codes: torch.Tensor, scales: torch.Tensor, w: K2Weights) -> torch.Tensor:
    """The rank's bf16 partial [M, 7168]: MXFP8 of wo_a's output times its wo_b columns
    (AITER-preshuffled). vLLM: models/deepseek_v4/amd/rocm.py:1068 prepare_attn_preshuffle and
    :1236 _bpre_attn_gemm (bf16 out; the sum over ranks follows)."""
    return fp8_gemv(codes, scales, w.wo_b, w.s_wob, codes.shape[1], shuffled=True).to(torch.bfloat16)


@dataclass
class RankOutputs:
    """Stages 1-3 on one rank, with what each stage hands the next."""

    keys: Keys
    o: torch.Tensor  # [M, heads, 512] bf16 attention output
    xo_codes: torch.Tensor  # [M, heads x 512] e4m3: MXFP8 of o after the inverse RoPE
    xo_scales: torch.Tensor  # [M, heads x 16] E8M0
    z: torch.Tensor  # [M, groups x 1024] bf16 wo_a output
    z_codes: torch.Tensor  # [M, groups x 1024]
    z_scales: torch.Tensor  # [M, groups x 32]
    partial: torch.Tensor  # [M, 7168] bf16 wo_b output


def rank_attention(x: K2Inputs, w: K2Weights) -> RankOutputs:
    """Stages 1-3 on one rank: keys, attention of its heads, inverse RoPE, wo_a, wo_b."""
    k = keys(x)
    values, valid = gather(k, x.swa_cache, x.comp_cache)
    o = attend(x.q, values, valid, w.attn_sink).to(torch.bfloat16)
    xo_codes, xo_scales = mxfp8_quantize(inverse_rope(o, w.rope, x.positions).flatten(1))
    z = wo_a(xo_codes, xo_scales, w)
    z_codes, z_scales = mxfp8_quantize(z)
    return RankOutputs(k, o, xo_codes, xo_scales, z, z_codes, z_scales, wo_b(z_codes, z_scales, w))


# -- 4. the all-reduce, 5. the FFN seam -----------------------------------------------------

def all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """bf16 of the ranks' bf16 partials summed in f32 in rank order (one f32 add per rank), so
    every rank gets the same bits. vLLM: the in-tree mono's amd/mono/stages/allreduce.py (one hop
    and two hops agree bit for bit) replacing tensor_model_parallel_all_reduce (rocm.py:1250)."""
    acc = partials[0].to(torch.float32)
    for partial in partials[1:]:
        acc = acc + partial.to(torch.float32)
    return acc.to(torch.bfloat16)


@dataclass
class Seam:
    r: torch.Tensor  # [M, 4, H] bf16: R after the attention's fold
    post: torch.Tensor  # [M, 4] f32: the FFN's post (folded at the next seam)
    comb: torch.Tensor  # [M, 4, 4] f32
    pre: torch.Tensor  # [M, 4] f32: the FFN's pre (the collapse's weights; vLLM's pre_out)
    x_norm: torch.Tensor  # [M, H] bf16: ffn_norm of the collapse
    x_codes: torch.Tensor  # [M, H] e4m3: the MoE's MXFP8 input (part two)
    x_scales: torch.Tensor  # [M, 224] E8M0


def ffn_seam(y: torch.Tensor, x: K2Inputs, w: K2Weights) -> Seam:
    """Stage 5, K1's seam pieces with the FFN's weights: the fold of the reduced attention output
    y into K1's R with K1's post / comb, the mixes with hc_ffn_*, Sinkhorn, the collapse,
    ffn_norm, and the MXFP8 of the normed row. vLLM: models/deepseek_v4/amd/model.py:990
    _forward_fused_post_pre (mhc_fused_post_pre with hc_ffn_*, then ffn_norm), whose torch
    semantics are model_executor/kernels/mhc/torch.py:135 mhc_post_torch and :48 mhc_pre_torch."""
    return seam_of(fold(y, x.residual, x.post, x.comb, True), w)


def seam_of(r: torch.Tensor, w: K2Weights) -> Seam:
    """The FFN seam from R after the fold (bf16 [M, 4, H]): the mixes with hc_ffn_*, Sinkhorn,
    the collapse, ffn_norm and the MXFP8 of the normed row (what S8 computes from S7's R)."""
    gate = seam_gate(r, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale)
    x_norm = rms_norm(collapse(r, gate.pre), w.ffn_norm)
    codes, scales = mxfp8_quantize(x_norm)
    return Seam(r, gate.post, gate.comb, gate.pre, x_norm, codes, scales)


# -- K2 part one as a whole -----------------------------------------------------------------

@dataclass
class K2Outputs:
    rank: RankOutputs
    y: torch.Tensor  # [M, 7168] bf16: the all-reduced attention output
    seam: Seam


def finish(own: RankOutputs, x: K2Inputs, w: K2Weights, partials: Sequence[torch.Tensor]) -> K2Outputs:
    """Stages 4-5 on a rank whose stages 1-3 gave `own`, given every rank's partial in rank order."""
    y = all_reduce(partials)
    return K2Outputs(own, y, ffn_seam(y, x, w))


def k2_part_one(x: K2Inputs, w: K2Weights, rank: int, peers: Sequence[torch.Tensor | None]) -> K2Outputs:
    """All of K2 part one on rank `rank`: `peers` holds the other ranks' partials in rank order,
    None at `rank` (this rank's own partial is computed here)."""
    if peers[rank] is not None:
        raise ValueError(f"peers[{rank}] must be None: rank {rank} computes its own partial")
    own = rank_attention(x, w)
    return finish(own, x, w, [own.partial if i == rank else p for i, p in enumerate(peers)])


def k2_part_one_ranks(inputs: Sequence[K2Inputs], weights: Sequence[K2Weights]) -> list[K2Outputs]:
    """K2 part one on every rank of a simulated TP group: rank i's inputs (its heads' q) and weight
    shards; the all-reduce makes every rank's y and seam the same."""
    owns = [rank_attention(x, w) for x, w in zip(inputs, weights)]
    partials = [own.partial for own in owns]
    return [finish(own, x, w, partials) for own, x, w in zip(owns, inputs, weights)]
