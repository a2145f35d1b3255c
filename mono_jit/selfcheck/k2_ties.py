"""Rounding ties in K2's attention hand-off: S3's MXFP8 codes of o (after the inverse RoPE) held
against the reference's exactly, but for a code one step off where the reference's unrounded o
lies within the f32 summation error of a rounding boundary (a bf16 boundary of o, or an e4m3
boundary of the scaled value), and the kernel's code is on the other side of it.

Why a tie is not an error: the kernel rounds where the reference does (o to bf16, the inverse
RoPE in f32, MXFP8), but its f32 o is the chunked merge of f32 sums (kernel.py S2 / S3) where the
reference's is f64 dot products rounded once. Where the reference's o is within that difference
of the midpoint of two bf16 values the two round it to neighbours, and when those straddle an
e4m3 boundary after the block's scale the code moves a step (the test world's seed 2: o
58.124985, 4 f32 ulps under the bf16 tie 58.125; bf16 58.0 scales to the e4m3 tie 232, RNE 224,
where 58.25 gives 240). The later stages amplify that step (an xo code moves ~28 of a rank's
2048 z codes and R by up to 0.023), which is why R is held against the reference fed the
kernel's own xo codes (K2Ranks.check) once these codes are held here.

The error scale is not |o| but A = sum_k p_k |v_k| / l (o is sum_k p_k v_k / l; f32 sums are off
by a multiple of u x the sum of the terms' magnitudes): where the keys' values cancel, o is small
and its bf16 ulp far below A's f32 ulp (seed 2, rank 7, xo column 6953: o 0.0017091, A 159.5; the
kernel wrote the code under the e4m3 tie 3.5 x 2^-9, which needs its o 3.9e-6 = 0.26 ulp(A)
lower). TIE_ULPS, derived: each o is a chain of f32 adds as deep as a chunk's keys plus the
chunks (S2 then S3's merge): 82 at bucket 1 (18 chunks of 64 of CSA's 1152 keys), 324 at
bucket 64 (4 of 320); f32 roundings of random sign grow as the square root of the depth, 18
ulps of A at 324, and sqrt(2) x 18 ~ 25 for acc and l together, with exp2's and the
reciprocal's ulps: 32. The flips seen needed 1 and 0.26 ulp(A).

fold_tie_flips is the same idea one stage on, for R after the attention fold where the y the
kernel summed cannot be read: a value past its bound must be the fold of y's other bf16 neighbour.
"""

from __future__ import annotations

import torch

from ..deepseek_v4 import NOPE
from ..templates.geometry import MX_BLOCK
from ..templates.k2 import attention_reference as ref
from ..templates.reference_math import e4m3_value, e8m0_inverse, fold, rope_angles
from .k1_world import Mismatch

TIE_ULPS = 32
E4M3_MAX = 448.0


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def f32_ulp(x: torch.Tensor) -> torch.Tensor:
    """The f32 spacing at |x|."""
    magnitude = x.float().abs().contiguous()
    return (magnitude.view(torch.int32) + 1).view(torch.float32) - magnitude


def code_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in e4m3 code steps (codes are sign-magnitude, ordered by magnitude)."""
    def ordinal(c: torch.Tensor) -> torch.Tensor:
        c = c.to(torch.int32)
        return torch.where(c >= 128, -(c & 0x7F), c)
    return (ordinal(a) - ordinal(b)).abs()


def unrounded_o(x: ref.K2Inputs, w: ref.K2Weights) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's o [M, heads, 512] f32 before its bf16 rounding (reference.attend) and its
    error scale A = sum_k p_k |v_k| / l (the same softmax weights on the values' magnitudes)."""
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    p, denominator = ref.softmax_weights(x.q, values, valid, w.attn_sink)
    return ref.weighted(p, denominator, values), ref.weighted(p, denominator, values.abs())


def xo_radius(o: tuple[torch.Tensor, torch.Tensor], rope: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """How far [M, heads x 512] the kernel's pre-quantisation xo may be from the reference's:
    o's bf16 moved as far as o +- TIE_ULPS ulp(A) rounds, through the inverse RoPE's rotation in
    the RoPE dims (|cos| and |sin| of the pair's two moves) with its own f32 products' TIE_ULPS ulps."""
    exact, error = o
    rounded = to_bf16(exact)
    reach = TIE_ULPS * f32_ulp(error)
    move = torch.maximum(to_bf16(exact + reach) - rounded, rounded - to_bf16(exact - reach))
    radius = move.clone()
    cos, sin = rope_angles(rope, positions)
    cos, sin = cos.abs()[:, None], sin.abs()[:, None]
    even, odd = move[..., NOPE::2], move[..., NOPE + 1::2]
    e, d = rounded[..., NOPE::2].abs(), rounded[..., NOPE + 1::2].abs()
    radius[..., NOPE::2] = even * cos + odd * sin + TIE_ULPS * f32_ulp(e * cos + d * sin)
    radius[..., NOPE + 1::2] = odd * cos + even * sin + TIE_ULPS * f32_ulp(d * cos + e * sin)
    return radius.flatten(1)


def xo_tie_flips(codes: torch.Tensor, scales: torch.Tensor, want: ref.RankOutputs, x: ref.K2Inputs,
                 w: ref.K2Weights, name: str = "xo") -> int:
    """The number of the kernel's xo codes ([m, heads x 512] e4m3, its scales [m, heads x 16])
    that differ from the reference's `want` as rounding ties explain; raises Mismatch on any other
    difference. The scales must equal the reference's. A code may differ only by one step, and
    only where the reference's pre-quantisation value moved by xo_radius (o within TIE_ULPS
    ulp(A) of a bf16 boundary, or a RoPE value within its products' ulps of an e4m3 one) rounds
    to the kernel's code. A value whose o is far from any bf16 boundary has radius 0 in the NoPE
    dims: there an exact e4m3 tie must round as RNE does."""
    m = want.xo_codes.shape[0]
    codes, scales = codes[:m], scales[:m]
    if not torch.equal(scales, want.xo_scales):
        blocks = (scales != want.xo_scales).nonzero().tolist()
        raise Mismatch(f"{name} scales differ from the reference's at (row, block) {blocks[:4]} ({len(blocks)})")
    differ = codes != want.xo_codes
    if not differ.any():
        return 0
    multiplier = e8m0_inverse(want.xo_scales).repeat_interleave(MX_BLOCK, dim=1)
    value = ref.inverse_rope(want.o, w.rope, x.positions).flatten(1)
    radius = xo_radius(unrounded_o(x, w), w.rope, x.positions)
    low, high = to_e4m3((value - radius) * multiplier), to_e4m3((value + radius) * multiplier)
    got = e4m3_value(codes)
    admitted = differ & (code_steps(codes, want.xo_codes) == 1) & (low <= got) & (got <= high)
    unexplained = differ & ~admitted
    if unexplained.any():
        at = unexplained.nonzero().tolist()
        r, c = at[0]
        raise Mismatch(f"{name} codes differ from the reference's at {len(at)} values not explained by a rounding tie, "
                       f"first (row {r}, col {c}): {int(codes[r, c])} for {int(want.xo_codes[r, c])}")
    return int(admitted.sum())


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bf16 values at each of x's (f32): 2^(exponent - 7), 0 at 0."""
    _, exponent = torch.frexp(x.float())
    return torch.where(x == 0, 0.0, torch.ldexp(torch.ones_like(x, dtype=torch.float32), exponent - 8))


def fold_tie_flips(got: torch.Tensor, want: torch.Tensor, partials: list[torch.Tensor], residual: torch.Tensor,
                   post: torch.Tensor, comb: torch.Tensor, worst: float) -> int:
    """The values of the kernel's R after the attention fold (`got`, [M, 4, H]) past `worst`
    (relative and absolute, as torch.testing.assert_close) of the reference's `want` that a
    rounding tie of y explains; raises Mismatch on any other.

    y is the all-reduced attention output, bf16 of the ranks' bf16 `partials` summed in f32 in
    rank order, and the fold is bf16(post x y + comb^T R) in f32, so one bf16 ulp of y moves R by
    post x ulp(y) (1.87 x 2^-7 = 0.0146 at |y| ~ 1, past 1e-2). The kernel sums in the same order,
    but its partials may each be a bf16 ulp or more off the reference's (S6's f32 GEMV order; an
    xo code flipped at a tie upstream moves a partial by up to 0.0098). A value past the bound is
    admitted only where the reference's unrounded y lies within the largest bf16 ulp of one rank's
    partial of a bf16 boundary, and only if the reference's fold with y rounded the other way is
    within `worst` of the kernel's value. The first condition is weak (8 partials each carry an
    ulp: most y values are that close to a boundary); the refold's match is what holds the value,
    and callers that can read every rank's hand-off hold R chained as well."""
    got, want = got.float(), want.float()
    off = (got - want).abs() > worst + worst * want.abs()
    if not off.any():
        return 0
    summed = partials[0].float()
    for p in partials[1:]:
        summed = summed + p.float()
    reach = torch.stack([bf16_ulp(p.float()) for p in partials]).amax(0)
    low, high = to_bf16(summed - reach), to_bf16(summed + reach)
    tie = low != high
    other = torch.where(to_bf16(summed) == low, high, low).to(torch.bfloat16)
    refolded = fold(other, residual, post, comb, True).float()
    explained = tie[:, None, :] & ((got - refolded).abs() <= worst + worst * refolded.abs())
    unexplained = off & ~explained
    if unexplained.any():
        at = unexplained.nonzero().tolist()
        r, s, h = at[0]
        raise Mismatch(f"R: {len(at)} values past {worst} not explained by a rounding tie of y, first (row {r}, "
                       f"stream {s}, col {h}): {float(got[r, s, h])} for {float(want[r, s, h])}")
    return int(off.sum())
