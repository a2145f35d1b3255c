"""Pure-torch reference of K1, stage by stage; its docstrings define the kernel's semantics.

Rounding points (where a value becomes bf16) follow vLLM's DeepSeek-V4 path: R after the fold,
the collapsed seam input, every RMSNorm output, and the outputs of the two GEMVs (vLLM's linear
layers return bf16). Inside a stage everything is f32. The numerics K1 shares with K2 (MXFP8,
the FP8 GEMV, RMSNorm, RoPE, the seam, the KV record) are in templates/reference_math.py; this
module composes them into K1's stages. Facts (widths) are from vLLM's DeepSeek-V4 model code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ... import deepseek_v4
from ...deepseek_v4 import EPS, HEAD_DIM, KV_LORA, NOPE, Q_LORA, ROPE, STREAMS
from ...spec import Spec
from ..geometry import WEIGHT_BLOCK
from ..reference_math import KV_AMAX_FLOOR as KV_AMAX_FLOOR  # re-exported: K1's kernel floors its KV amax by it
from ..reference_math import (collapse, fold, fp8_gemv, gate_from_partials, kv_insert, kv_record, mxfp8_quantize,
                              rms_norm, rope_angles, rope_gptj, seam_partials)


def e8m0_from_scale(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 codes of f32 block scales that are powers of two (ue8m0 checkpoints); exact."""
    scale = scale.to(torch.float32)
    bits = scale.view(torch.int32)
    if not bool(((bits & 0x807FFFFF) == 0).all()) or not bool((scale > 0).all()):
        raise ValueError("block scales must be positive powers of two (ue8m0) to be E8M0 codes")
    return (bits >> 23).to(torch.uint8)


# -- K1 as a whole --------------------------------------------------------------------------

@dataclass
class K1Weights:
    """One layer's K1 weights as vLLM holds them per rank (fp8 tensors as uint8 bytes)."""

    hc_fn: torch.Tensor  # [24, 4 H] f32
    hc_base: torch.Tensor  # [24] f32
    hc_scale: torch.Tensor  # [3] f32
    attn_norm: torch.Tensor  # [H] bf16
    w_qkv: torch.Tensor  # [2048, stride >= H] e4m3 bytes (fused_wqa_wkv), or preshuffled [2048, H]
    s_qkv: torch.Tensor  # [16, 56] E8M0
    q_norm: torch.Tensor  # [1536] bf16
    kv_norm: torch.Tensor  # [512] bf16
    w_qb: torch.Tensor  # [heads x 512, stride >= 1536] e4m3 bytes (wq_b)
    s_qb: torch.Tensor  # [heads x 4, 12] E8M0
    rope: torch.Tensor  # [P, 64] f32 cos | sin
    qkv_shuffled: bool = False
    qb_shuffled: bool = False


@dataclass
class K1Outputs:
    r: torch.Tensor  # [M, 4, H] bf16, after the fold
    post: torch.Tensor  # [M, 4] f32
    comb: torch.Tensor  # [M, 4, 4] f32
    x_norm: torch.Tensor  # [M, H] bf16
    qr: torch.Tensor  # [M, 1536] bf16
    q: torch.Tensor  # [M, heads, 512] bf16
    kv: torch.Tensor  # [M, 512] f32: the record's content (normed, RoPE'd), before quantisation
    records: torch.Tensor  # [M, 584] what the insert writes
    # What one stage hands the next (K1Layout's scratch), for testing the stages one by one:
    partials: torch.Tensor  # [M, 56, 25] S1 -> S2
    x_codes: torch.Tensor  # [M, H] e4m3 bytes, S2 -> S3
    x_scales: torch.Tensor  # [M, 224] E8M0
    qkv_raw: torch.Tensor  # [M, 2048] f32, S3 -> S4 (the kernel keeps it as two K halves)
    qr_codes: torch.Tensor  # [M, 1536], S4 -> S5
    qr_scales: torch.Tensor  # [M, 48]
    q_raw: torch.Tensor  # [M, heads x 512] f32, S5 -> S6


@dataclass
class Front:
    """S4's results from the raw S3 output."""

    qr: torch.Tensor
    qr_codes: torch.Tensor
    qr_scales: torch.Tensor
    kv: torch.Tensor
    records: torch.Tensor


def attention_front(qkv_raw: torch.Tensor, w: K1Weights, positions: torch.Tensor) -> Front:
    """S4: q_norm on qr (and its MXFP8), kv_norm, RoPE on kv's last 64 dims, the KV record."""
    qkv = qkv_raw.to(torch.bfloat16)
    qr = rms_norm(qkv[:, :Q_LORA], w.q_norm)
    kv = rms_norm(qkv[:, Q_LORA:Q_LORA + KV_LORA], w.kv_norm)
    cos, sin = rope_angles(w.rope, positions)
    kv = torch.cat([kv[:, :NOPE].to(torch.float32), rope_gptj(kv[:, NOPE:], cos, sin)], dim=1)
    kv = kv.to(torch.bfloat16).to(torch.float32)
    qr_codes, qr_scales = mxfp8_quantize(qr)
    return Front(qr, qr_codes, qr_scales, kv, kv_record(kv))


def q_heads(q_raw: torch.Tensor, rope: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """S6: bf16(q_raw) per 512-wide head RMS-normalised (no weight), RoPE on dims 448..511."""
    cos, sin = rope_angles(rope, positions)
    q = q_raw.to(torch.bfloat16).view(q_raw.shape[0], -1, HEAD_DIM).to(torch.float32)
    q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + EPS)
    q[..., NOPE:] = rope_gptj(q[..., NOPE:], cos.unsqueeze(1), sin.unsqueeze(1))
    return q.to(torch.bfloat16)


def k1(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, res_mix: torch.Tensor,
       do_fold: bool, w: K1Weights, positions: torch.Tensor) -> K1Outputs:
    """All of K1 for M rows, stage by stage (the cache insert is kv_insert(cache, out.records,
    slot_mapping, ...))."""
    r = fold(x, residual, post_mix, res_mix, do_fold)  # S1
    partials = seam_partials(r, w.hc_fn)
    gate = gate_from_partials(partials, r[0].numel(), w.hc_base, w.hc_scale)  # S2
    x_norm = rms_norm(collapse(r, gate.pre), w.attn_norm)
    x_codes, x_scales = mxfp8_quantize(x_norm)
    qkv_raw = fp8_gemv(x_codes, x_scales, w.w_qkv, w.s_qkv, deepseek_v4.HIDDEN, w.qkv_shuffled)  # S3
    front = attention_front(qkv_raw, w, positions)  # S4
    q_raw = fp8_gemv(front.qr_codes, front.qr_scales, w.w_qb, w.s_qb, Q_LORA, w.qb_shuffled)  # S5
    return K1Outputs(r=r, post=gate.post, comb=gate.comb, x_norm=x_norm, qr=front.qr,
                     q=q_heads(q_raw, w.rope, positions), kv=front.kv, records=front.records,  # S6
                     partials=partials, x_codes=x_codes, x_scales=x_scales, qkv_raw=qkv_raw,
                     qr_codes=front.qr_codes, qr_scales=front.qr_scales, q_raw=q_raw)


def run(a: Mapping[str, Any], spec: Spec | None = None) -> None:
    """K1's kernel contract (the package docstring) through the reference: read the named flat
    arguments as the kernel would, write its outputs, the KV records and the epoch in place. The
    runtime's reference backend launches K1 with this; layer 0's x, post_mix and res_mix are
    never read (they may come in empty). K1's shapes follow from its arguments: `spec` is not
    read."""
    m, hidden = a["m"], deepseek_v4.HIDDEN
    q_rows = a["s_qb"].numel() // (Q_LORA // WEIGHT_BLOCK) * WEIGHT_BLOCK  # heads x 512
    shuffled_qkv, shuffled_qb = bool(a["qkv_shuffled"]), bool(a["qb_shuffled"])
    w = K1Weights(
        hc_fn=a["hc_fn"].view(-1, STREAMS * hidden), hc_base=a["hc_base"], hc_scale=a["hc_scale"],
        attn_norm=a["attn_norm"],
        w_qkv=a["w_qkv"].view(Q_LORA + KV_LORA, hidden if shuffled_qkv else a["qkv_stride"]),
        s_qkv=a["s_qkv"].view((Q_LORA + KV_LORA) // WEIGHT_BLOCK, hidden // WEIGHT_BLOCK),
        q_norm=a["q_norm"], kv_norm=a["kv_norm"],
        w_qb=a["w_qb"].view(q_rows, Q_LORA if shuffled_qb else a["qb_stride"]),
        s_qb=a["s_qb"].view(q_rows // WEIGHT_BLOCK, Q_LORA // WEIGHT_BLOCK), rope=a["rope"].view(-1, ROPE),
        qkv_shuffled=shuffled_qkv, qb_shuffled=shuffled_qb)
    do_fold = bool(a["do_fold"])
    x, post_mix, res_mix = ((a["x"][: m * hidden].view(m, hidden), a["post_mix"][: m * STREAMS].view(m, STREAMS, 1),
                             a["res_mix"][: m * STREAMS * STREAMS].view(m, STREAMS, STREAMS))
                            if do_fold else (None, None, None))
    out = k1(x, a["residual"][: m * STREAMS * hidden].view(m, STREAMS, hidden), post_mix, res_mix, do_fold, w,
             a["positions"][:m])
    for name, value in (("r_out", out.r), ("post_out", out.post), ("comb_out", out.comb), ("x_norm", out.x_norm),
                        ("qr_out", out.qr), ("q_out", out.q)):
        a[name][: value.numel()].copy_(value.flatten())
    kv_insert(a["kv_cache"], out.records, a["slot_mapping"][:m], a["page_stride"], a["block_size"])
    a["sync"][0] += 1
