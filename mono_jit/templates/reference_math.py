"""Pure-torch numerics that more than one template's reference computes: E8M0 / MXFP8, the
block-scaled FP8 GEMV, RMSNorm and GPT-J RoPE, the mHC seam (fold, mixes, Sinkhorn, collapse) and
the fp8_ds_mla KV record. K1 writes the records and runs the attention seam; K2 reads the records,
runs the FFN seam and its GEMVs on the same numerics, so each is written once, here.

Rounding points follow vLLM's DeepSeek-V4 path (see each template's reference for where its
values become bf16). Facts (the Sinkhorn schedule, the fp8_ds_mla record) are from vLLM's
DeepSeek-V4 model code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..deepseek_v4 import EPS, HC_POST_ALPHA, NOPE, ROPE, SINKHORN_ROUNDS, STREAMS
from .geometry import E4M3_MAX, KV_DATA, KV_RECORD, KV_SCALE_BLOCK, MX_BLOCK, SEAM_CHUNK, WEIGHT_BLOCK

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
