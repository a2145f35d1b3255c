"""K2's tie-aware attention hand-off check (mono_jit/selfcheck/k2_ties.py) on the CPU: on the
test world's seed 2 rank 2, whose o at xo column 6441 is 58.124985 (4 f32 ulps under the bf16
tie 58.125), the reference's codes pass, the code one step up there (what the kernel writes)
passes as one tie flip, and a code one step off anywhere that is not a tie, two steps off at the
tie, or a changed scale fails. Its chained counterpart (R against the reference fed the kernel's
own codes) runs in tests/test_emulated_k2_ranks.py."""

from __future__ import annotations

import pytest
import torch

from mono_jit.selfcheck.k1_world import Mismatch
from mono_jit.selfcheck.k2_ties import TIE_ULPS, code_steps, near_tie, other_bf16, to_bf16, unrounded_o, xo_tie_flips
from mono_jit.selfcheck.k2_world import full_weights, shard, world
from mono_jit.templates.k2 import reference as ref

RANK, TIE = 2, (0, 6441)  # seed 2: the flip the 8-rank emulated run shows


@pytest.fixture(scope="module")
def case():
    w = shard(full_weights(), RANK)
    x = world(4, seed=2, rows=1, width=1024).rank(RANK)
    return x, w, ref.rank_attention(x, w)


def test_the_seed_2_value_sits_at_a_bf16_tie(case):
    x, w, want = case
    o = unrounded_o(x, w).flatten(1)[TIE]
    assert float(o) == pytest.approx(58.124985, abs=1e-6) and float(want.o.flatten(1)[TIE]) == 58.0
    assert near_tie(o, 5, to_bf16) and not near_tie(o, 4, to_bf16)  # 4 ulps up is the tie, which RNE takes to 58.0
    assert float(other_bf16(o, TIE_ULPS)) == 58.25
    assert int(want.xo_codes[TIE]) == 118  # 58.0 x 4 = 232, the e4m3 tie, RNE 224


def test_the_references_codes_pass_with_no_flip(case):
    x, w, want = case
    assert xo_tie_flips(want.xo_codes.clone(), want.xo_scales.clone(), want, x, w) == 0


def test_the_tie_rounded_the_other_way_passes_as_one_flip(case):
    x, w, want = case
    codes = want.xo_codes.clone()
    codes[TIE] = 119  # 58.25 x 4 = 233 -> 240
    assert xo_tie_flips(codes, want.xo_scales, want, x, w) == 1


@pytest.mark.parametrize("col", [0, 100, 4000, 7000])
def test_a_code_one_step_off_away_from_a_tie_fails(case, col):
    x, w, want = case
    codes = want.xo_codes.clone()
    codes[0, col] = codes[0, col] + 1 if int(codes[0, col]) & 0x7F < 0x7E else codes[0, col] - 1
    assert int(code_steps(codes[0, col], want.xo_codes[0, col])) == 1
    with pytest.raises(Mismatch, match="not explained by a rounding tie"):
        xo_tie_flips(codes, want.xo_scales, want, x, w)


def test_the_tie_two_steps_off_fails(case):
    x, w, want = case
    codes = want.xo_codes.clone()
    codes[TIE] = 120
    with pytest.raises(Mismatch, match="not explained by a rounding tie"):
        xo_tie_flips(codes, want.xo_scales, want, x, w)


def test_a_changed_scale_fails(case):
    x, w, want = case
    scales = want.xo_scales.clone()
    scales[0, 5] += 1
    with pytest.raises(Mismatch, match="scales differ"):
        xo_tie_flips(want.xo_codes, scales, want, x, w)


def test_near_tie_measures_f32_ulps_to_a_value_rounding_the_other_way():
    """5 ulps under a tie: 5 ulps up reach the tie, which RNE rounds down to 58.0 (even) but up
    to 58.5 from under 58.375 (58.25 odd); both signs alike; nothing flagged across zero."""
    tie = torch.tensor([58.125, -58.125, 58.375, -58.375])
    below = (tie.abs().view(torch.int32) - 5).view(torch.float32) * tie.sign()
    assert near_tie(below, 5, to_bf16).tolist() == [False, False, True, True]
    assert near_tie(below, 6, to_bf16).all() and not near_tie(below, 4, to_bf16).any()
    assert not near_tie(torch.tensor([0.0, 1e-45]), TIE_ULPS, to_bf16).any()
