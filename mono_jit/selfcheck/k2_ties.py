"""Rounding ties in K2's attention hand-off: S3's MXFP8 codes of o (after the inverse RoPE) held
against the reference's exactly, but for a code one step off where the reference's unrounded
value sits within TIE_ULPS f32 ulps of a rounding boundary and rounding it the other way gives
the kernel's code.

Why a tie is not an error: the kernel rounds where the reference does (o to bf16, the inverse
RoPE in f32, MXFP8), but its f32 o is the chunked merge of f32 sums (kernel.py S2 / S3) where the
reference's is f64 dot products rounded once. Where the reference's f32 o is a few ulps from the
midpoint of two bf16 values the two round it to neighbours, and when those straddle an e4m3
boundary after the block's scale the code moves a step (the test world's seed 2: o 58.124985,
4 ulps under the bf16 tie 58.125; bf16 58.0 scales to the e4m3 tie 232, RNE 224, where 58.25
gives 240). The later stages then amplify that step (an xo code moves ~28 of a rank's 2048 z
codes and R by up to 0.023), which is why R is held against the reference fed the kernel's own
xo codes (K2Ranks.check) once these codes are held here.

TIE_ULPS, derived: at CSA bucket 1 (1152 keys, 18 chunks of 64) each o value is a depth-82 chain
of f32 adds (64 keys of a chunk in sequence, then the 18 chunks' merge), as is its denominator,
then the reciprocal's product; f32 roundings of random sign grow with the square root of the
depth, sqrt(82) ~ 9 ulps in each of acc and l, with exp2's ulp and the product ~ 20 ulps; 32 is
the next power of two (the two flips seen were 4 and 1 ulps from the tie). The worst-case linear
bound (~170 ulps) would admit about 5 times as many values with no observed need.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..deepseek_v4 import NOPE
from ..templates.geometry import MX_BLOCK
from ..templates.k2 import reference as ref
from ..templates.reference_math import e8m0_inverse, fold, mxfp8_quantize
from .k1_world import Mismatch

TIE_ULPS = 32
E4M3_MAX = 448.0


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def _around(x: torch.Tensor, ulps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """|x| moved `ulps` f32 ulps down (not past 0) and up."""
    bits = x.float().abs().contiguous().view(torch.int32)
    return (bits - ulps).clamp_min(0).view(torch.float32), (bits + ulps).view(torch.float32)


def near_tie(x: torch.Tensor, ulps: int, rounding: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Where f32 x lies within `ulps` f32 ulps of a boundary of `rounding` (a symmetric RNE):
    x moved that far down and up rounds to different values."""
    low, high = _around(x, ulps)
    return rounding(low) != rounding(high)


def other_bf16(x: torch.Tensor, ulps: int) -> torch.Tensor:
    """The bf16 neighbour (f32) that x moved up to `ulps` f32 ulps would round to instead of
    bf16(x) (bf16(x) itself where there is none)."""
    low, high = _around(x, ulps)
    own = to_bf16(x.float().abs())
    other = torch.where(to_bf16(low) == own, to_bf16(high), to_bf16(low))
    return torch.copysign(other, x.float())


def code_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in e4m3 code steps (codes are sign-magnitude, ordered by magnitude)."""
    def ordinal(c: torch.Tensor) -> torch.Tensor:
        c = c.to(torch.int32)
        return torch.where(c >= 128, -(c & 0x7F), c)
    return (ordinal(a) - ordinal(b)).abs()


def unrounded_o(x: ref.K2Inputs, w: ref.K2Weights) -> torch.Tensor:
    """The reference's o [M, heads, 512] f32 before its bf16 rounding (rank_attention rounds it)."""
    k = ref.keys(x)
    values, valid = ref.gather(k, x.swa_cache, x.comp_cache)
    return ref.attend(x.q, values, valid, w.attn_sink)


def xo_tie_flips(codes: torch.Tensor, scales: torch.Tensor, want: ref.RankOutputs, x: ref.K2Inputs,
                 w: ref.K2Weights) -> int:
    """The number of the kernel's xo codes ([m, heads x 512] e4m3, its scales [m, heads x 16])
    that differ from the reference's `want` as rounding ties explain; raises Mismatch on any other
    difference. The scales must equal the reference's. A code may differ only by one step, and
    only where (a) the reference's f32 o (unrounded_o) of that value, or of its RoPE pair, is
    within TIE_ULPS of a bf16 boundary and the reference's chain from o rounded the other way
    there gives the kernel's code, or (b) in the RoPE dims, the reference's scaled f32 value is
    within TIE_ULPS of an e4m3 boundary (the inverse RoPE's f32 products round in another order).
    A NoPE value at an exact e4m3 tie is not admitted: there both round the same bf16 o by RNE."""
    m = want.xo_codes.shape[0]
    codes, scales = codes[:m], scales[:m]
    if not torch.equal(scales, want.xo_scales):
        blocks = (scales != want.xo_scales).nonzero().tolist()
        raise Mismatch(f"xo scales differ from the reference's at (row, block) {blocks[:4]} ({len(blocks)})")
    differ = codes != want.xo_codes
    if not differ.any():
        return 0
    o_exact = unrounded_o(x, w)
    o_ties = near_tie(o_exact, TIE_ULPS, to_bf16)
    other_o = torch.where(o_ties, other_bf16(o_exact, TIE_ULPS), want.o.float()).to(torch.bfloat16)
    turned = ref.inverse_rope(other_o, w.rope, x.positions).flatten(1)
    alt_codes, alt_scales = mxfp8_quantize(turned)
    same_scale = (alt_scales == want.xo_scales).repeat_interleave(MX_BLOCK, dim=1)
    by_o = same_scale & (alt_codes == codes)
    scaled = ref.inverse_rope(want.o, w.rope, x.positions).flatten(1) * \
        e8m0_inverse(want.xo_scales).repeat_interleave(MX_BLOCK, dim=1)
    rope_dims = (torch.arange(codes.shape[1]) % want.o.shape[-1] >= NOPE).expand_as(codes)
    by_rope = rope_dims & near_tie(scaled, TIE_ULPS, to_e4m3)
    admitted = differ & (code_steps(codes, want.xo_codes) == 1) & (by_o | by_rope)
    unexplained = differ & ~admitted
    if unexplained.any():
        at = unexplained.nonzero().tolist()
        r, c = at[0]
        raise Mismatch(f"xo codes differ from the reference's at {len(at)} values not explained by a rounding tie, "
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
    post x ulp(y) (1.87 x 2^-7 = 0.0146 at |y| ~ 1, past 1e-2). The kernel sums in the same order
    but its partials may each be a bf16 ulp off the reference's (S6's f32 GEMV sums in another
    order; K2Run.check's model). So its unrounded y may round to the other bf16 neighbour only
    where the reference's unrounded y lies within the largest ulp of one rank's partial of a bf16
    rounding boundary (the kernel's y is not written anywhere it can be read). A value past the
    bound is admitted only there, and only if the reference's fold with y rounded the other way
    is within `worst` of the kernel's value."""
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
