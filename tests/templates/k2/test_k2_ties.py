"""K2's tie-aware attention hand-off check (mono_jit/selfcheck/k2_ties.py) on the CPU, on the test
world's seed 2, whose 8-rank emulated run flips two xo codes: rank 2's column 6441 (o 58.124985,
4 f32 ulps under the bf16 tie 58.125) one step up, and rank 7's column 6953 (o 0.0017091 where
the keys' values cancel, A = 159.5; bf16 o x 4 is the e4m3 tie 3.5 x 2^-9) one step down. The
reference's codes pass, those flips pass, and a code one step off anywhere that is not a tie,
two steps off at the tie, or a changed scale fails. Its chained counterpart (R against the
reference fed the kernel's own codes) runs in tests/emulator/test_emulated_k2_ranks.py."""

from __future__ import annotations

import pytest
import torch

from mono_jit.selfcheck.k1_world import Mismatch
from mono_jit.selfcheck.k2_ties import TIE_ULPS, code_steps, f32_ulp, unrounded_o, xo_tie_flips
from mono_jit.selfcheck.k2_world import full_weights, shard, world
from mono_jit.templates.k2 import attention_reference as ref

TIES = {2: ((0, 6441), 119), 7: ((0, 6953), 3)}  # rank: (row, col), the kernel's code


@pytest.fixture(scope="module", params=sorted(TIES))
def case(request):
    rank = request.param
    w = shard(full_weights(), rank)
    x = world(4, seed=2, rows=1, width=1024).rank(rank)
    return x, w, ref.rank_attention(x, w), *TIES[rank]


def test_the_flipped_values_sit_within_tie_ulps_of_a_bf16_boundary(case):
    """The reference's o is 1 (rank 2) and 0.26 (rank 7) ulp(A) from the bf16 boundary on the
    kernel's side, far inside TIE_ULPS."""
    x, w, want, at, code = case
    o, scale = (t.flatten(1)[at] for t in unrounded_o(x, w))
    rounded = want.o.float().flatten(1)[at]
    half = 2.0 ** (torch.frexp(rounded).exponent - 9)  # half a bf16 ulp
    boundary = rounded + (half if code > int(want.xo_codes[at]) else -half)
    distance = float((o - boundary).abs() / f32_ulp(scale))
    assert distance <= 1.0 < TIE_ULPS, distance


def test_the_references_codes_pass_with_no_flip(case):
    x, w, want, _, _ = case
    assert xo_tie_flips(want.xo_codes.clone(), want.xo_scales.clone(), want, x, w) == 0


def test_the_tie_rounded_the_other_way_passes_as_one_flip(case):
    x, w, want, at, code = case
    codes = want.xo_codes.clone()
    codes[at] = code
    assert xo_tie_flips(codes, want.xo_scales, want, x, w) == 1


@pytest.mark.parametrize("col", [0, 100, 4000, 7000])
def test_a_code_one_step_off_away_from_a_tie_fails(case, col):
    x, w, want, _, _ = case
    codes = want.xo_codes.clone()
    codes[0, col] = codes[0, col] + 1 if int(codes[0, col]) & 0x7F < 0x7E else codes[0, col] - 1
    assert int(code_steps(codes[0, col], want.xo_codes[0, col])) == 1
    with pytest.raises(Mismatch, match="not explained by a rounding tie"):
        xo_tie_flips(codes, want.xo_scales, want, x, w)


def test_the_tie_two_steps_off_fails(case):
    x, w, want, at, code = case
    codes = want.xo_codes.clone()
    codes[at] = 2 * code - int(want.xo_codes[at])
    with pytest.raises(Mismatch, match="not explained by a rounding tie"):
        xo_tie_flips(codes, want.xo_scales, want, x, w)


def test_a_changed_scale_fails(case):
    x, w, want, _, _ = case
    scales = want.xo_scales.clone()
    scales[0, 5] += 1
    with pytest.raises(Mismatch, match="scales differ"):
        xo_tie_flips(want.xo_codes, scales, want, x, w)


def test_f32_ulp():
    assert f32_ulp(torch.tensor([1.0, -1.0, 159.5])).tolist() == [2 ** -23, 2 ** -23, 2 ** -16]
