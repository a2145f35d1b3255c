"""Pure-torch reference of K1, stage by stage; its docstrings define the kernel's semantics.

Rounding points (where a value becomes bf16) follow vLLM's DeepSeek-V4 path: R after the fold,
the collapsed seam input, every RMSNorm output, and the outputs of the two GEMVs (vLLM's linear
layers return bf16). Inside a stage everything is f32. Facts (widths, the Sinkhorn schedule,
the fp8_ds_mla record) are from vLLM's DeepSeek-V4 model code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ... import deepseek_v4
from ...deepseek_v4 import EPS, HC_POST_ALPHA, HEAD_DIM, KV_LORA, NOPE, Q_LORA, ROPE, SINKHORN_ROUNDS, STREAMS
from ...spec import Spec
from ..geometry import E4M3_MAX, KV_DATA, KV_RECORD, KV_SCALE_BLOCK, MX_BLOCK, SEAM_CHUNK, WEIGHT_BLOCK

KV_AMAX_FLOOR = 1e-4  # vLLM's insert floors a 64-block's amax before choosing its scale


# -- E8M0 / MXFP8 ---------------------------------------------------------------------------

def e8m0_code(amax: torch.Tensor) -> torch.Tensor:
    """The E8M0 code of a block: clamp(ceil(log2(amax / 448)) + 127, 0, 254), exactly.

    Computed on the f32 bits so no rounding of amax / 448 or of log2 can move a boundary:
    amax = 1.m x 2^e is <= 448 x 2^s = 1.75 x 2^(8+s) iff s >= e - 8 (+1 when 1.m > 1.75).
    Zero and f32 subnormals give 0; a finite amax gives at most 247; inf / NaN give 254.
    """
    bits = amax.to(torch.float32).abs().view(torch.int32)
    biased = bits >> 23
    above = ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)
    code = torch.where(biased == 255, 254, biased - 8 + above)
    return torch.clamp(code, 0, 254).to(torch.uint8)


def e8m0_value(code: torch.Tensor) -> torch.Tensor:
    """2^(code - 127) as f32 (codes 0..254)."""
    return torch.exp2(code.to(torch.float32) - 127.0)


def e8m0_inverse(code: torch.Tensor) -> torch.Tensor:
    """The multiplier that quantises a block of code `code`: 2^(127 - code), a normal f32.

    Exact for every code a finite block gets (0..247). Code 254 comes only from a block holding
    inf or NaN; its multiplier is 2^-126 (the smallest normal f32, as the kernel builds it from
    exponent bits), so the NaN itself stays NaN and the block's finite values go to about 0.
    """
    return torch.exp2(127.0 - code.to(torch.float32).clamp_max(253.0))


def _e4m3(values: torch.Tensor) -> torch.Tensor:
    """Round to e4m3 (RNE) after clamping into its range; returns the raw bytes."""
    return values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_value(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).to(torch.float32)


def mxfp8_quantize(x: torch.Tensor, block: int = MX_BLOCK,
                   amax_floor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 bytes [..., n], E8M0 codes [..., n / block]) of x along its last dim.

    NaN propagates as vLLM's torch path propagates it (amax, clamp): a NaN value gives an e4m3
    NaN byte and its block code 254 (see e8m0_inverse for the rest of that block).
    """
    blocks = x.to(torch.float32).unflatten(-1, (-1, block))
    amax = blocks.abs().amax(-1).clamp_min(amax_floor)
    codes = e8m0_code(amax)
    scaled = blocks * e8m0_inverse(codes).unsqueeze(-1)
    return _e4m3(scaled).flatten(-2), codes


def mxfp8_dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int = MX_BLOCK) -> torch.Tensor:
    values = e4m3_value(codes).unflatten(-1, (-1, block))
    return (values * e8m0_value(scales).unsqueeze(-1)).flatten(-2)


def e8m0_from_scale(scale: torch.Tensor) -> torch.Tensor:
    """E8M0 codes of f32 block scales that are powers of two (ue8m0 checkpoints); exact."""
    scale = scale.to(torch.float32)
    bits = scale.view(torch.int32)
    if not bool(((bits & 0x807FFFFF) == 0).all()) or not bool((scale > 0).all()):
        raise ValueError("block scales must be positive powers of two (ue8m0) to be E8M0 codes")
    return (bits >> 23).to(torch.uint8)


def preshuffle_16x16(weight: torch.Tensor) -> torch.Tensor:
    """AITER's (16, 16) layout of a byte matrix [N, K]: [N/16][K/32][2][16 rows][16 bytes]."""
    n, k = weight.shape
    return weight.view(n // 16, 16, k // 32, 2, 16).permute(0, 2, 3, 1, 4).contiguous().view(n, k)


def unshuffle_16x16(weight: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    return weight.view(n // 16, k // 32, 2, 16, 16).permute(0, 3, 1, 2, 4).contiguous().view(n, k)


def fp8_gemv(x_codes: torch.Tensor, x_scales: torch.Tensor, weight: torch.Tensor,
             weight_scales: torch.Tensor, k: int, shuffled: bool = False) -> torch.Tensor:
    """f32 [M, N] = MXFP8 x [M, K] times the block-scaled e4m3 weight [N, row stride >= K]^T.

    weight_scales [N / 128, K / 128] are E8M0 codes of the checkpoint's 128 x 128 blocks;
    `shuffled` says the weight is preshuffle_16x16 of [N, K].
    """
    n = weight.shape[0]
    if shuffled:
        weight = unshuffle_16x16(weight)
    w = e4m3_value(weight[:, :k]).view(n // WEIGHT_BLOCK, WEIGHT_BLOCK, k // WEIGHT_BLOCK, WEIGHT_BLOCK)
    w = (w * e8m0_value(weight_scales)[:, None, :, None]).reshape(n, k)
    x = mxfp8_dequantize(x_codes, x_scales)
    return x.double().matmul(w.double().T).float()


# -- norms and RoPE ---------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = EPS) -> torch.Tensor:
    """bf16(x * rsqrt(mean(x^2) + eps) * weight), all in f32, one rounding."""
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(torch.float32)
    return y.to(torch.bfloat16)


def rope_gptj(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J (interleaved) RoPE in f32: pair i is dims (2i, 2i + 1), rotated by angle i."""
    xf = x.to(torch.float32)
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = torch.empty_like(xf)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


def rope_angles(rope_table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [M, 32] from vLLM's cos_sin_cache [P, 64] (32 cos then 32 sin)."""
    rows = rope_table[positions.long()].to(torch.float32)
    return rows[:, : ROPE // 2], rows[:, ROPE // 2:]


# -- the mHC attention seam -----------------------------------------------------------------

def fold(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, res_mix: torch.Tensor,
         do_fold: bool) -> torch.Tensor:
    """R'_j = post_j * x + sum_i comb[i, j] * R_i in f32, stored bf16; R unchanged when not do_fold."""
    if not do_fold:
        return residual.clone()
    post = post_mix.reshape(-1, STREAMS, 1).to(torch.float32)
    comb = res_mix.reshape(-1, STREAMS, STREAMS).to(torch.float32)
    mixed = torch.einsum("mij,mih->mjh", comb, residual.to(torch.float32))
    return (post * x.to(torch.float32).unsqueeze(1) + mixed).to(torch.bfloat16)


def sinkhorn(logits: torch.Tensor, rounds: int = SINKHORN_ROUNDS, eps: float = EPS) -> torch.Tensor:
    """softmax over the last dim + eps, then columns, then (rounds - 1) x (rows, columns)."""
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(rounds - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb


@dataclass
class Gate:
    mixes: torch.Tensor  # [M, 24]
    pre: torch.Tensor  # [M, 4]
    post: torch.Tensor  # [M, 4]
    comb: torch.Tensor  # [M, 4, 4]


def seam_partials(r: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
    """[M, 56, 25]: per 128-column chunk (all four streams), the 24 dot products of R with
    hc_fn and the sum of squares; what S1 leaves for S2, which adds the chunks in order."""
    m, streams, h = r.shape
    chunks = h // SEAM_CHUNK
    rc = r.to(torch.float64).view(m, streams, chunks, SEAM_CHUNK)
    dots = torch.einsum("msck,nsck->mcn", rc, fn.to(torch.float64).view(-1, streams, chunks, SEAM_CHUNK))
    squares = rc.pow(2).sum((1, 3)).unsqueeze(-1)
    return torch.cat([dots, squares], dim=-1).float()


def seam_gate(r: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
              eps: float = EPS) -> Gate:
    """The 24 mixes of R [M, 4, H] and the gate built from them (the mHC seam)."""
    return gate_from_partials(seam_partials(r, fn), r[0].numel(), base, scale, eps)


def gate_from_partials(partials: torch.Tensor, width: int, base: torch.Tensor, scale: torch.Tensor,
                       eps: float = EPS) -> Gate:
    """The gate from [M, chunks, 25] partials (24 dot products, then the sum of squares; the row
    has `width` values), added over the chunks as S2 does."""
    sums = partials.double().sum(1).float()
    mixes = sums[:, :24] * torch.rsqrt(sums[:, 24:] / width + eps)
    pre = torch.sigmoid(mixes[:, 0:4] * scale[0] + base[0:4]) + eps
    post = torch.sigmoid(mixes[:, 4:8] * scale[1] + base[4:8]) * HC_POST_ALPHA
    logits = (mixes[:, 8:24] * scale[2] + base[8:24]).view(-1, STREAMS, STREAMS)
    return Gate(mixes, pre, post, sinkhorn(logits, eps=eps))


def collapse(r: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """bf16(sum_i pre_i R_i)."""
    return torch.einsum("mi,mih->mh", pre, r.to(torch.float32)).to(torch.bfloat16)


# -- the KV record --------------------------------------------------------------------------

def kv_record(kv: torch.Tensor) -> torch.Tensor:
    """[M, 584] fp8_ds_mla records of kv [M, 512] (NoPE normed, RoPE already applied).

    Bytes 0..447 e4m3 of the NoPE dims, scaled per 64 by UE8M0 codes (amax floored at 1e-4);
    448..575 the 64 RoPE dims as bf16; 576..582 the 7 codes; byte 583 (pad) is 0, as vLLM's
    insert writes it (common/ops/cache_utils.py quantize_and_insert_k_kernel).
    """
    m = kv.shape[0]
    codes, scales = mxfp8_quantize(kv[:, :NOPE], KV_SCALE_BLOCK, KV_AMAX_FLOOR)
    rope = kv[:, NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    pad = torch.zeros(m, 1, dtype=torch.uint8)
    return torch.cat([codes, rope, scales, pad], dim=1)


def kv_dequantize(record: torch.Tensor) -> torch.Tensor:
    """[M, 512] f32 values of [M, 584] records."""
    nope = mxfp8_dequantize(record[:, :NOPE], record[:, KV_DATA:KV_DATA + NOPE // KV_SCALE_BLOCK],
                            KV_SCALE_BLOCK)
    rope = record[:, NOPE:KV_DATA].contiguous().view(torch.bfloat16).to(torch.float32)
    return torch.cat([nope, rope], dim=1)


def kv_insert(cache: torch.Tensor, records: torch.Tensor, slots: torch.Tensor, page_stride: int,
              block: int) -> None:
    """Write records into the flat byte cache at slots (-1 skipped), in place.

    A page holds its `block` records' 576 data bytes first, then their 8 scale bytes (the 7
    codes and the pad byte).
    """
    for record, slot in zip(records, slots.tolist()):
        if slot < 0:
            continue
        page, row = divmod(slot, block)
        base = page * page_stride
        cache[base + row * KV_DATA: base + (row + 1) * KV_DATA] = record[:KV_DATA]
        scales = base + block * KV_DATA + row * (KV_RECORD - KV_DATA)
        cache[scales: scales + KV_RECORD - KV_DATA] = record[KV_DATA:]


def kv_read(cache: torch.Tensor, slot: int, page_stride: int, block: int) -> torch.Tensor:
    """The [584] record at slot of a flat byte cache."""
    page, row = divmod(slot, block)
    base = page * page_stride
    scales = base + block * KV_DATA + row * (KV_RECORD - KV_DATA)
    return torch.cat([cache[base + row * KV_DATA: base + (row + 1) * KV_DATA], cache[scales: scales + 8]])


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
