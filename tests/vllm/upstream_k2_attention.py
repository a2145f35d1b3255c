"""Upstream K2's attention read stage by stage from a rank's scratch after an emulated step, each
stage held against layer_math's formulation from the kernel's own inputs (K1's q and key table).

What vLLM's mono K2 leaves in its scratch (amd/mono/attention/plan.py back_scratch, placed by
amd/mono/layer.py scratch_layout): per (token, 128-key chunk of K1's key table, head) the chunk's
(max, sum) of base-2 scores and its bf16 partial sum of p . v (p rounded to bf16 for the PV MFMA,
as vLLM's Triton decode kernel does, v1/attention/ops/rocm_aiter_mla_sparse.py:2840
`tl.dot(p.to(k_nope.dtype), k_nope)`); per (token, head) the combine's XO, MXFP8 of the inverse
RoPE of bf16(merged o). Its scores are q . k of K1's bf16 rotated q, times the head's RMS factor
rsq(mean(q^2) + eps) and runner.py's qk_scale = 512^-0.5 log2(e); the sink enters the merge as
sink log2(e) (back.py stage_combine).

These tests see no MXFP8 step between their stages, so a 1e-3 difference stays 1e-3: the layer's
outputs do not (an o 3e-3 off flips 6 % of XO's e4m3 codes, and the two MXFP8 steps of wo_a / wo_b
carry that to 2-4 % of y), which is why the end-to-end comparison needs both sides to round at the
same points.
"""

from __future__ import annotations

from dataclasses import dataclass

import layer_math as lm
import torch
from upstream_k2_run import RankBuffers

LOG2E = 1.4426950408889634
CHUNK = 128  # back.chunk_keys of a 16-head rank: one head tile, 8 waves of 16 keys
BF16_HALF_ULP = 2.0 ** -9  # a bf16 rounding's relative error at most
HEADS_PER_RANK = lm.HEADS // 8


@dataclass
class AttentionState:
    """One token's attention on one rank: its inputs (K1's q, the key table's records) and the
    kernel's stages (chunk stats, partials, XO dequantised)."""

    q: torch.Tensor  # [heads, 512] bf16, rotated, not normed
    records: torch.Tensor  # [table keys, 584], a zero record where the table holds -1
    valid: torch.Tensor  # [table keys] bool
    chunk_max: torch.Tensor  # [chunks, heads] f32, base-2 units
    chunk_sum: torch.Tensor
    partials: torch.Tensor  # [chunks, heads, 512] f32 of bf16
    xo: torch.Tensor  # [heads, 512] f32: e4m3 x 2^(code - 127)


def attention_state(buffers: RankBuffers, step: lm.LayerStep, token: int = 0) -> AttentionState:
    """Read token `token`'s attention stages from a rank's buffers after K1 and K2 (m = 1 layout)."""
    from vllm.models.deepseek_v4.amd.mono.dims import Dims
    from vllm.models.deepseek_v4.amd.mono.layer import scratch_layout

    assert token == 0, "the scratch regions are read for a one-token step"
    v, d = buffers.k1.values, Dims(8)
    scratch, layout = v["scratch"], scratch_layout(1, 8)

    def region(name: str) -> torch.Tensor:
        offset, size = layout[name]
        return scratch[offset:offset + size]

    chunks = -(-d.keys // CHUNK)
    stats = region("pstat").view(torch.float32).view(chunks, d.heads, 2)
    partials = region("part").view(torch.bfloat16).view(chunks, d.heads, lm.D).float()
    codes = region("xos").view(torch.int32)[:d.heads * lm.D // 32].float()
    xo = region("xo").view(lm.E4M3)[:d.heads * lm.D].float().view(-1, 32) * torch.exp2(codes[:, None] - 127)
    table = v["kt"][:int(v["klen"][token])].tolist()
    zero = torch.zeros(lm.RECORD, dtype=torch.uint8)
    records = [zero if e == -1 else
               lm.read_record(step.comp_cache, e & 0x7FFFFFFF, step.comp_page_stride, step.comp_block) if e < 0 else
               lm.read_record(v["swa"], e, step.swa_page_stride, step.swa_block) for e in table]
    return AttentionState(q=v["q"][token, :d.heads].clone(), records=torch.stack(records),
                          valid=torch.tensor([e != -1 for e in table]), chunk_max=stats[..., 0].clone(),
                          chunk_sum=stats[..., 1].clone(), partials=partials.clone(), xo=xo.view(d.heads, lm.D))


def normed_q(q: torch.Tensor) -> torch.Tensor:
    """f64 q of each head times its weightless RMS factor (layer_math.q_heads' norm; RoPE keeps it)."""
    qd = q.double()
    return qd * torch.rsqrt(qd.square().sum(-1, keepdim=True) / lm.D + lm.EPS)


def base2_scores(state: AttentionState) -> torch.Tensor:
    """[heads, table keys] f64 scores q . k x 512^-0.5 in base-2 units, -inf where the table is -1."""
    keys = lm.decode_record(state.records).double()
    scores = normed_q(state.q) @ keys.T * lm.D ** -0.5 * LOG2E
    return scores.masked_fill(~state.valid, -torch.inf)


def live_chunks(state: AttentionState) -> list[int]:
    return [c for c in range(state.chunk_max.shape[0]) if bool(state.valid[c * CHUNK:(c + 1) * CHUNK].any())]


def merged(state: AttentionState, sink: torch.Tensor) -> torch.Tensor:
    """bf16 [heads, 512]: the live chunks merged in f32 in chunk order, the sink's term first
    (exp2(sink log2 e - m)), each chunk weighted exp2(its max - m), divided by the sum."""
    sink2 = sink.float() * LOG2E
    chunks = live_chunks(state)
    m = torch.maximum(state.chunk_max[chunks].max(0).values, sink2)
    total, weight_sum = torch.zeros(state.partials.shape[1:]), torch.exp2(sink2 - m)
    for c in chunks:
        w = torch.exp2(state.chunk_max[c] - m)
        weight_sum = weight_sum + state.chunk_sum[c] * w
        total = total + state.partials[c] * w[:, None]
    return (total / weight_sum[:, None]).to(torch.bfloat16)


def xo_of(o: torch.Tensor, step: lm.LayerStep, cos_sin: torch.Tensor) -> torch.Tensor:
    """XO of one token's o [heads, 512]: MXFP8 of its inverse RoPE (f32), dequantised."""
    rotated = lm.inverse_rope_vllm(o[None], cos_sin, step.positions[:1], torch.float32)
    return lm.mx8(rotated.flatten(1)).view(o.shape)


def abs_weighted_values(state: AttentionState, sink: torch.Tensor) -> torch.Tensor:
    """[heads, 512] sum over keys of softmax weight x |value|: what a relative error on each
    weight (bf16 p) or on each chunk's partial can move an output element by, per unit."""
    scores = base2_scores(state)
    logits = torch.cat([scores, (sink.double() * LOG2E)[:, None]], 1)
    weights = torch.softmax(logits * torch.log(torch.tensor(2.0, dtype=torch.float64)), 1)[:, :-1]
    return weights @ lm.decode_record(state.records).double().abs()
