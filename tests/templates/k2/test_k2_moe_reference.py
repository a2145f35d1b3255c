"""K2 part two's reference (mono_jit/templates/k2/moe_reference.py) against an independent torch
formulation of vLLM's MoE math (tests/support/layer_math.py), written from vLLM's and AITER's sources, not
from the code under test: the sqrt-softplus router as vLLM's dsv4_topk kernel computes it (iterative argmax,
ties to the lower index), the shared expert as DeepseekV4MLP (block-scaled FP8, clamped SwiGLU),
the routed experts as a per-token, per-pick fused_moe loop over dequantised MXFP4 weights (A8W4:
MXFP8 activations), the MoE partial as shared + routed and the all-reduce in rank order. Weights
are random, sharded over 8 ranks as FusedMoE shards them, and laid out by AITER's shuffles
re-implemented here from aiter/ops/shuffle.py's documented permutations.

Shapes are real widths (hidden 7168, a rank's intermediate 384 of 3072, 384 router experts in the
router tests) with few rows and 8 routed experts in the MoE tests, so the file runs on a CPU.
"""

from __future__ import annotations

import math

import layer_math
import pytest
import torch
from k2_inputs import TP, full_weights, shard, world
from layer_math import (Global, aiter_shuffle_scale, aiter_shuffle_scale_a16w4, aiter_shuffle_weight_a16w4, e2m1,
                        global_weights, mx8, rank_slices, vllm_moe, vllm_route, vllm_routed, vllm_shared)

from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import moe_reference as moe
from mono_jit.templates.router import reference as router_ref

H = 7168
INTER = 3072  # routed and shared intermediate, unsharded
LOCAL = INTER // TP  # 384 a rank
EXPERTS = 8  # routed experts of the MoE tests (the router tests use 384)
TOP_K = 6
SCALE = 2.5
ROWS = 3


def vllm_layout(w: Global, rank: int, hash_layer: bool = False) -> moe.MoeWeights:
    """layer_math.vllm_layout (the rank's weights after vLLM's loading) as the reference's MoeWeights."""
    return moe.MoeWeights(**layer_math.vllm_layout(w, rank, hash_layer))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# Measured on these weights (a third of the routed and a tenth to a fifth of the shared gate / up
# values past the clamp): the reference and the formulation above differ by 2e-6 relative (their
# f64 and f32 dot products round an odd intermediate differently), a hash layer's not at all; the
# wrong choices below move a rank's partial by 0.19 (natural softplus) to 0.82 (no clamp).
TOLERANCE = 1e-3
WRONG = 0.1


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gw() -> Global:
    return global_weights()


@pytest.fixture(scope="module")
def rank3(gw) -> moe.MoeWeights:
    return vllm_layout(gw, 3)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(ROWS, H, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)


# -- layouts -----------------------------------------------------------------------------------

def test_aiter_a8w4_layouts_read_back_to_the_checkpoint(gw):
    raw = rank_slices(gw, 2)
    w = vllm_layout(gw, 2)
    assert torch.equal(moe.unshuffle_w13(w.w13), raw["w13"])
    assert torch.equal(moe.unshuffle_w2(w.w2), raw["w2"])
    assert torch.equal(moe.unshuffle_scales(w.w13_s, EXPERTS, gate_up=True), raw["w13_s"])
    assert torch.equal(moe.unshuffle_scales(w.w2_s, EXPERTS, gate_up=False)[..., :LOCAL // 32], raw["w2_s"])


def test_gate_and_up_interleave_in_16_row_tiles(gw):
    """Shuffled w13 of one expert: 16 bytes of gate row 0, then of gate row 1 (16 rows a K lane),
    and after gate tile 0's K (H / 2 x 16 bytes) up row 0 (the rank's first up row)."""
    raw = rank_slices(gw, 0)["w13"][0]
    flat = vllm_layout(gw, 0).w13[0].flatten()
    assert torch.equal(flat[:16], raw[0, :16]) and torch.equal(flat[16:32], raw[1, :16])
    assert torch.equal(flat[256:272], raw[0, 16:32])
    assert torch.equal(flat[H // 2 * 16: H // 2 * 16 + 16], raw[LOCAL, :16])


def test_the_two_scale_shuffles_agree_on_w2s_padded_columns(gw):
    """vLLM's w2_s (plain shuffle_scale, 12 -> 16 columns) equals shuffle_scale_a16w4(down) of the
    same padded codes: both read back by one unshuffle."""
    codes = rank_slices(gw, 1)["w2_s"].reshape(-1, LOCAL // 32)
    padded = torch.cat([codes, torch.full((codes.shape[0], 4), 0xA5, dtype=torch.uint8)], 1)
    assert torch.equal(aiter_shuffle_scale(codes), aiter_shuffle_scale_a16w4(padded, EXPERTS, gate_up=False))


def test_e2m1_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(moe.e2m1_value(codes), e2m1(codes))
    assert moe.e2m1_value(codes).tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]


def test_shuffles_match_aiters_own():
    """Cross-check of the re-implemented shuffles against AITER's functions."""
    shuffle = pytest.importorskip("aiter.ops.shuffle", reason="AMD AITER (ROCm/aiter) is not importable on this "
                                  "CPU-only machine (it ships with vLLM's ROCm build; PyPI's 'aiter' is unrelated)")
    g = torch.Generator().manual_seed(9)
    w = torch.randint(0, 256, (2, 2 * 256, 512), generator=g, dtype=torch.uint8)
    s = torch.randint(0, 256, (2 * 2 * 256, 32), generator=g, dtype=torch.uint8)
    for gate_up in (True, False):
        theirs = shuffle.shuffle_weight_a16w4(w.view(torch.float4_e2m1fn_x2), 16, gate_up).view(torch.uint8)
        assert torch.equal(theirs, aiter_shuffle_weight_a16w4(w, gate_up))
        assert torch.equal(shuffle.shuffle_scale_a16w4(s, 2, gate_up), aiter_shuffle_scale_a16w4(s, 2, gate_up))
    unpadded = s[:, :16].contiguous()  # AITER pads with torch.empty: compare an unpadded matrix
    assert torch.equal(shuffle.shuffle_scale(unpadded), aiter_shuffle_scale(unpadded))


# -- stage 1, 2: MXFP8 input, router ------------------------------------------------------------

def test_moe_input_is_k1s_mxfp8(x):
    codes, scales = moe.moe_input(x)
    assert codes.shape == (ROWS, H) and scales.shape == (ROWS, H // 32)
    assert torch.equal(rmath.mxfp8_dequantize(codes, scales), mx8(x))


@pytest.fixture(scope="module")
def gate384() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return (torch.randn(384, H, generator=g) * 0.03).to(torch.bfloat16), torch.randn(384, generator=g) * 0.1


def router_weights(gate: torch.Tensor, bias: torch.Tensor | None) -> moe.MoeWeights:
    empty = torch.empty(0, dtype=torch.uint8)
    return moe.MoeWeights(gate, bias, *([empty] * 8))


def test_router_matches_vllms_topk_over_384_experts(gate384):
    gate, bias = gate384
    xs = torch.randn(16, H, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    ids, weights = moe.route(xs, router_weights(gate, bias), None)
    want_ids, want_weights = vllm_route(xs, gate, bias, None)
    assert torch.equal(ids, want_ids)
    assert torch.allclose(weights, want_weights, rtol=1e-5, atol=0)
    assert torch.allclose(weights.sum(-1), torch.full((16,), SCALE))


def test_ties_go_to_the_lower_expert(gate384):
    """Experts 300 and 7 share a gate row and a bias (equal scores) and tie for the sixth place
    behind five experts made first by their bias: vLLM (and the reference) take 7, the lower."""
    gate, bias = gate384[0].clone(), torch.zeros(384)
    gate[300] = gate[7]
    bias[[50, 60, 70, 80, 90]] = 100.0
    bias[[7, 300]] = 50.0
    xs = torch.randn(2, H, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    ids, _ = moe.route(xs, router_weights(gate, bias), None)
    assert ids[:, 5].tolist() == [7, 7]
    assert torch.equal(ids, vllm_route(xs, gate, bias, None)[0])
    bias[[50, 60]] = -100.0  # both tied experts now chosen: the lower first
    ids, _ = moe.route(xs, router_weights(gate, bias), None)
    assert ids[:, 3:5].tolist() == [[7, 300], [7, 300]]


def test_hash_layers_take_the_given_experts_and_no_bias(gate384):
    gate, bias = gate384
    xs = torch.randn(2, H, generator=torch.Generator().manual_seed(14)).to(torch.bfloat16)
    hash_ids = torch.tensor([[5, 380, 17, 0, 99, 200], [1, 2, 3, 4, 5, 6]], dtype=torch.int32)
    ids, weights = moe.route(xs, router_weights(gate, None), hash_ids)
    assert torch.equal(ids, hash_ids)
    assert torch.allclose(weights, vllm_route(xs, gate, None, hash_ids)[1], rtol=1e-5, atol=0)
    with_bias = moe.route(xs, router_weights(gate, bias * 1000), hash_ids)  # a bias has no say
    assert torch.equal(with_bias[0], ids) and torch.equal(with_bias[1], weights)


# -- stages 3, 4: shared and routed experts on one rank ----------------------------------------

def test_shared_expert_matches_deepseekv4_mlp(gw, rank3, x):
    codes, scales = moe.moe_input(x)
    got = moe.shared_expert(codes, scales, rank3)
    assert rel(got, vllm_shared(x, rank_slices(gw, 3))) < TOLERANCE


def test_routed_experts_match_fused_moe_and_read_each_expert_once(gw, rank3, x, monkeypatch):
    ids = torch.tensor([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [7, 0, 1, 2, 3, 4]], dtype=torch.int32)
    weights = torch.rand(ROWS, TOP_K, generator=torch.Generator().manual_seed(15))
    reads: list[int] = []
    matrices = moe.expert_matrices
    monkeypatch.setattr(moe, "expert_matrices", lambda w, e: reads.append(e) or matrices(w, e))
    codes, scales = moe.moe_input(x)
    got = moe.routed_experts(codes, scales, ids, weights, rank3)
    assert reads == [0, 1, 2, 3, 4, 5, 7]  # the union, each once, expert 6 never
    assert rel(got, vllm_routed(x, rank_slices(gw, 3), ids, weights)) < TOLERANCE


def test_out_of_range_ids_choose_nothing(rank3, x):
    """A hash id past the experts (the router weighs it 0) reads no expert and adds nothing."""
    codes, scales = moe.moe_input(x)
    ids = torch.tensor([[0, 1, 0, 1, 0, 1]] * ROWS, dtype=torch.int32)
    weights = torch.rand(ROWS, TOP_K, generator=torch.Generator().manual_seed(16))
    weights[:, 5] = 0
    outside = ids.clone()
    outside[:, 5] = EXPERTS + 3
    assert moe.expert_union(outside, EXPERTS) == [0, 1]
    assert torch.equal(moe.routed_experts(codes, scales, outside, weights, rank3),
                       moe.routed_experts(codes, scales, ids, weights, rank3))


# -- wrong choices must fail the comparison -----------------------------------------------------

HASH_IDS = torch.tensor([[6, 7, 0, 3, 1, 2], [2, 4, 6, 1, 3, 5], [0, 1, 2, 3, 4, 5]], dtype=torch.int32)


HASH_IDS = torch.tensor([[6, 7, 0, 3, 1, 2], [2, 4, 6, 1, 3, 5], [0, 1, 2, 3, 4, 5]], dtype=torch.int32)
Layer = tuple[moe.MoeWeights, "torch.Tensor | None", torch.Tensor]


def rank4(gw: Global, x: torch.Tensor, hash_layer: bool) -> Layer:
    """Rank 4 of a bias or a hash layer, its route ids, and the formulation's MoE partial."""
    route_ids = HASH_IDS if hash_layer else None
    return vllm_layout(gw, 4, hash_layer), route_ids, vllm_moe(x, gw, route_ids, ranks=range(4, 5))


@pytest.fixture(scope="module")
def bias_layer(gw, x) -> Layer:
    return rank4(gw, x, False)


@pytest.fixture(scope="module")
def hash_layer(gw, x) -> Layer:
    return rank4(gw, x, True)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["bias_layer", "hash_layer"])
def test_one_ranks_moe_partial_matches_vllms(layer, x, request):
    w, route_ids, want = request.getfixturevalue(layer)
    assert rel(moe.rank_moe(x, w, route_ids).partial, want) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("wrong", ["no_clamp", "natural_softplus", "bias_on_hash_layer", "w13_not_interleaved",
                                   "no_routed_scaling"])
def test_a_wrong_choice_fails_the_comparison(wrong, gw, x, monkeypatch, request):
    """One rank's partial, against the formulation above, with one choice made wrong (on the hash
    layer for bias_on_hash_layer, else on the bias layer)."""
    w, route_ids, want = request.getfixturevalue("hash_layer" if wrong == "bias_on_hash_layer" else "bias_layer")
    if wrong == "no_clamp":
        monkeypatch.setattr(moe, "SWIGLU_LIMIT", math.inf)
    elif wrong == "natural_softplus":
        monkeypatch.setattr(router_ref, "sqrt_softplus", lambda l: l.clamp_min(0) + torch.log1p(torch.exp(-l.abs())))
    elif wrong == "bias_on_hash_layer":  # routed by score + bias as a non-hash layer
        monkeypatch.setattr(moe, "route", lambda x_norm, w_, ids: router_ref.route(x_norm, w_.gate, gw.bias))
    elif wrong == "w13_not_interleaved":  # the (16, 16) shuffle of [gate; up], no gate / up tiles
        monkeypatch.setattr(moe, "unshuffle_w13", lambda w13: moe.unshuffle_w2(w13))
    else:
        monkeypatch.setattr(router_ref.deepseek_v4, "ROUTED_SCALING", 1.0)
    assert rel(moe.rank_moe(x, w, route_ids).partial, want) > WRONG


# -- the whole K2 over 8 ranks ------------------------------------------------------------------

@pytest.fixture(scope="module")
def whole(gw) -> list[moe.K2Result]:
    wd = world(4)
    part_one_weights = full_weights()
    return moe.k2_ranks([wd.rank(r) for r in range(TP)], [shard(part_one_weights, r) for r in range(TP)],
                        [vllm_layout(gw, r) for r in range(TP)])


@pytest.mark.slow
def test_whole_k2_on_8_ranks_matches_vllms_moe(whole, gw):
    seam = whole[0].part_one.seam
    assert rel(whole[0].outputs.out, vllm_moe(seam.x_norm, gw)) < TOLERANCE


@pytest.mark.slow
def test_every_rank_returns_the_same_layer_outputs(whole):
    first = whole[0].outputs
    for result in whole:
        out = result.outputs
        assert torch.equal(out.out, first.out) and torch.equal(out.res_out, first.res_out)
        assert torch.equal(out.post_out, first.post_out) and torch.equal(out.comb_out, first.comb_out)
        assert torch.equal(result.moe.codes, result.part_one.seam.x_codes)  # stage 1 is the seam's MXFP8
        assert torch.equal(result.moe.ids, whole[0].moe.ids)


@pytest.mark.slow
def test_the_outputs_are_what_vllms_hook_returns(whole):
    """out [M, H] bf16; res_out the FFN seam's R [M, 4, H] bf16; post_out [M, 4, 1], comb_out
    [M, 4, 4] (its rows' and columns' sums 1), pre_out [M, 4] f32, pre as the mHC seam defines it."""
    result = whole[0]
    o, seam = result.outputs, result.part_one.seam
    m = seam.r.shape[0]
    assert o.out.shape == (m, H) and o.out.dtype == torch.bfloat16
    assert torch.equal(o.res_out, seam.r) and o.res_out.dtype == torch.bfloat16
    assert o.post_out.shape == (m, 4, 1) and torch.equal(o.post_out[..., 0], seam.post)
    assert torch.equal(o.comb_out, seam.comb) and torch.allclose(o.comb_out.sum(-1), torch.ones(m, 4), atol=1e-3)
    w = full_weights()
    r = seam.r.flatten(1).double()
    mix = (r @ w.hc_fn.double().T) * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mix[:, :4] * w.hc_scale[0] + w.hc_base[:4]) + 1e-6
    assert o.pre_out.shape == (m, 4) and o.pre_out.dtype == torch.float32
    assert torch.allclose(o.pre_out.double(), pre, rtol=1e-5)


@pytest.mark.slow
def test_the_moe_all_reduce_sums_the_ranks_partials_in_rank_order(whole):
    acc = whole[0].moe.partial.float()
    for result in whole[1:]:
        acc = acc + result.moe.partial.float()
    assert torch.equal(whole[0].outputs.out, acc.to(torch.bfloat16))
    assert moe.moe_shards(8) == LOCAL and moe.moe_shards(4) == 768
    with pytest.raises(ValueError):
        moe.moe_shards(48)
