"""K2 part one's torch reference against an independent formulation of vLLM's math (CPU), in the
world of tests/support/k2_inputs.py; the independent formulation uses the unsharded weights whole."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from k2_inputs import (D, GROUP_K, KV_GAIN, LOCAL, NOPE, O_LORA, PAD, POISON_SWA, POSITIONS, SWA_BLOCK, SWA_STRIDE, TP,
                       FullWeights, H, World, full_weights, shard, world)
from layer_math import dense_attention, inverse_rope_vllm, mhc_seam, projections

from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import attention_reference as ref
from mono_jit.templates.geometry import KV_DATA

# -- the independent formulation (vLLM's math, full width, unsharded weights: tests/support/layer_math.py) --

def world_attention(wd: World, sink: torch.Tensor) -> torch.Tensor:
    """layer_math.dense_attention over the world's keys (the records each row was built with)."""
    keys = [torch.stack([wd.records[c][s] for c, s in row]) if row else None for row in wd.keys]
    return dense_attention(wd.inputs.q, keys, sink)


def world_projections(o: torch.Tensor, w: FullWeights) -> torch.Tensor:
    return projections(o, w.wo_a, w.s_woa, w.wo_b, w.s_wob)


def world_seam(y: torch.Tensor, x: ref.K2Inputs, w: FullWeights) -> dict[str, torch.Tensor]:
    return mhc_seam(y, x.residual, x.post, x.comb, w.hc_fn, w.hc_base, w.hc_scale, w.ffn_norm)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# -- fixtures -------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(int(os.environ.get("K2_TEST_SEED", "0")))


@pytest.fixture(scope="module")
def weights() -> FullWeights:
    return full_weights()


@pytest.fixture(scope="module")
def shards(weights) -> list[ref.K2Weights]:
    return [shard(weights, r) for r in range(TP)]


@pytest.fixture(scope="module", params=[4, 128], ids=["csa", "hca"])
def wd(request) -> World:
    return world(request.param)


def full_o(wd: World, sink: torch.Tensor) -> torch.Tensor:
    """Stage 2 over all 128 heads at once (every rank reads the same keys): [M, 128, 512] bf16."""
    x = wd.inputs
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    return ref.attend(x.q, values, valid, sink).to(torch.bfloat16)


# -- stage tests ----------------------------------------------------------------------------

def test_key_table_puts_the_window_first_and_counts_its_keys(wd):
    k = ref.keys(wd.rank(0))
    for r, row in enumerate(wd.keys):
        assert int(k.lens[r]) == len(row)
        assert int(k.swa[r]) == sum(c == "swa" for c, _ in row)
        assert k.slots[r, : len(row)].tolist() == [s for _, s in row]
        assert bool((k.slots[r, len(row):] == -1).all())


def test_a_pad_row_has_no_keys_and_no_output(wd, shards):
    """Row 1's metadata points past both caches and at a request that does not exist: any read
    would raise. It gets no keys and a zero attention output (the sink alone weighs nothing)."""
    x = wd.rank(0)
    k = ref.keys(x)
    assert int(k.lens[PAD]) == 0 and int(k.swa[PAD]) == 0
    values, valid = ref.gather(k, x.swa_cache, x.comp_cache)
    o = ref.attend(x.q, values, valid, shards[0].attn_sink)
    assert bool((o[PAD] == 0).all()) and bool(o.isfinite().all())


def test_attention_matches_dense_softmax_with_sink(wd, weights):
    """Both key paths (CSA through the block table, HCA global slots) against vLLM's dense
    formulation in f64; the reference's only rounding is o's bf16, so within 2 bf16 ulps."""
    torch.testing.assert_close(full_o(wd, weights.sink).float(), world_attention(wd, weights.sink).float(),
                               rtol=2 ** -7, atol=1e-5 * KV_GAIN)


def test_the_records_codes_cross_a_bytes_sign_bit_and_read_unsigned(wd):
    """The keys' UE8M0 codes lie on both sides of 128 (a code read sign-extended, as
    buffer_load_sbyte reads it, is a negative scale that flips its 64 dims), and the reference
    reads them unsigned: each NoPE value has its e4m3 byte's sign and the world's magnitude."""
    x = wd.inputs
    k = ref.keys(x)
    values, valid = ref.gather(k, x.swa_cache, x.comp_cache)
    records = torch.stack([wd.records[cache][slot] for row in wd.keys for cache, slot in row])
    codes = records[:, KV_DATA:KV_DATA + NOPE // 64]
    assert int(codes.min()) < 128 < int(codes.max())
    nope = values[valid][:, :NOPE]
    assert torch.equal(nope < 0, (records[:, :NOPE] & 0x80 != 0) & (records[:, :NOPE] & 0x7F != 0))
    assert 0.5 < float(nope.pow(2).mean().sqrt()) / KV_GAIN < 2


@pytest.mark.parametrize("chunk", [16, 64, 100, 4096])
def test_split_over_keys_merges_to_the_unsplit_softmax(wd, shards, chunk):
    """The log-sum-exp merge is exact: only f32 rounding separates it from the unsplit softmax
    (row 0 has fewer keys than row 2, so some of its chunks are wholly masked)."""
    x = wd.rank(2)
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    whole = ref.attend(x.q, values, valid, shards[2].attn_sink)
    torch.testing.assert_close(ref.attend_split(x.q, values, valid, shards[2].attn_sink, chunk), whole,
                               rtol=1e-5, atol=1e-6 * KV_GAIN)


def test_the_sink_changes_its_head_only():
    wd = world(4)
    x = wd.rank(0)
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    sink = torch.zeros(LOCAL)
    bumped = sink.clone()
    bumped[3] = 5.0  # e^5 beside ~100 keys of logit ~N(0, 1): about half the mass
    base, other = ref.attend(x.q, values, valid, sink), ref.attend(x.q, values, valid, bumped)
    live = [0, 2]
    assert rel(other[live, 3], base[live, 3]) > 0.3
    assert torch.equal(torch.cat([other[:, :3], other[:, 4:]], 1), torch.cat([base[:, :3], base[:, 4:]], 1))
    no_sink = ref.attend(x.q, values, valid, torch.full((LOCAL,), -math.inf))
    assert rel(no_sink[live], base[live]) > 0.01
    assert bool((no_sink[PAD] == 0).all())  # no key and no sink: zero, as vLLM's reduce writes


def test_masked_keys_are_never_read():
    """Past-the-window slots and -1 entries point at NaN records (the poison pages): the output
    stays finite, and rewriting those records changes no bit of it."""
    wd = world(4)
    x = wd.rank(0)
    sink = torch.zeros(LOCAL)
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    before = ref.attend(x.q, values, valid, sink)
    assert bool(before.isfinite().all())
    rmath.kv_insert(x.swa_cache.data, rmath.kv_record(torch.randn(len(POISON_SWA), D) * 100), torch.tensor(POISON_SWA),
                 SWA_STRIDE, SWA_BLOCK)
    values, valid = ref.gather(ref.keys(x), x.swa_cache, x.comp_cache)
    assert torch.equal(ref.attend(x.q, values, valid, sink), before)


def test_inverse_rope_undoes_rope_on_the_rope_dims_only(weights):
    positions = torch.tensor([3, 77, 500])
    o = torch.randn(3, LOCAL, D)
    cos, sin = rmath.rope_angles(weights.rope, positions)
    rotated = o.clone()
    rotated[..., NOPE:] = rmath.rope_gptj(o[..., NOPE:], cos[:, None], sin[:, None])
    back = ref.inverse_rope(rotated, weights.rope, positions)
    assert torch.equal(back[..., :NOPE], o[..., :NOPE])
    torch.testing.assert_close(back, o, rtol=1e-5, atol=1e-5)


def test_wo_a_reads_k_columns_only_and_each_group_its_heads(shards):
    """The 256 padding bytes of each row are NaN: a read past K would show. Group 1's output
    depends only on heads 8..15's columns."""
    w = shards[0]
    codes, scales = rmath.mxfp8_quantize(torch.randn(2, LOCAL * D))
    z = ref.wo_a(codes, scales, w)
    assert bool(z.isfinite().all())
    codes2 = codes.clone()
    codes2[:, :GROUP_K] = 0
    z2 = ref.wo_a(codes2, scales, w)
    assert torch.equal(z2[:, O_LORA:], z[:, O_LORA:]) and not torch.equal(z2[:, :O_LORA], z[:, :O_LORA])


def test_all_reduce_sums_bf16_partials_in_f32_in_rank_order():
    # 1 + 2^-8 + six 2^-24 in f32 keeps 1 + 2^-8 (each 2^-24 a tie to even), whose bf16 is 1 (a
    # tie to even); the six 2^-24 first add up to 3 x 2^-23 and the sum rounds to 1 + 2^-7: the
    # rank order is part of the contract, and every rank uses the same one
    values = [1.0, 2 ** -8] + [2 ** -24] * 6
    partials = [torch.full((1, 1), v, dtype=torch.bfloat16) for v in values]
    assert float(ref.all_reduce(partials).float()) == 1.0
    assert float(ref.all_reduce(partials[::-1]).float()) == 1.0 + 2 ** -7
    partials = [torch.randn(2, H).to(torch.bfloat16) for _ in range(TP)]
    acc = torch.zeros(2, H)
    for p in partials:
        acc = acc + p.float()
    assert torch.equal(ref.all_reduce(partials), acc.to(torch.bfloat16))


def test_ffn_seam_matches_vllms_mhc_torch(weights, shards):
    x = world(4).rank(0)
    y = torch.randn(3, H).to(torch.bfloat16)
    seam, want = ref.ffn_seam(y, x, shards[0]), world_seam(y, x, weights)
    torch.testing.assert_close(seam.r, want["r"], rtol=2 ** -7, atol=0)  # 1 bf16 ulp: the einsum's order
    torch.testing.assert_close(seam.post, want["post"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(seam.comb, want["comb"], rtol=1e-4, atol=1e-5)
    # 2 bf16 ulps: the gate's pre differs in f32 ulps (K1 adds the mixes in f64), which can move
    # one rounding of the bf16 collapse, and the norm's rounding follows it
    torch.testing.assert_close(seam.x_norm, want["x_norm"], rtol=2 ** -6, atol=1e-4)
    torch.testing.assert_close(rmath.mxfp8_dequantize(seam.x_codes, seam.x_scales), seam.x_norm.float(),
                               rtol=2 ** -4, atol=2 ** -4 * float(seam.x_norm.float().abs().max()))


# -- K2 part one over 8 ranks ---------------------------------------------------------------

# Tolerances. MXFP8 (e4m3: 3 mantissa bits, one power-of-two scale per 32) rounds each input of
# wo_a and of wo_b by up to 2^-4 of its value (RMS about 2-3% with the block scaling), independently
# per element, where vLLM's bf16 path keeps 2^-9. Over K = 4096 / 16384 random-sign terms a GEMV's
# output keeps about its inputs' relative RMS error, so: o after the inverse RoPE (xo, the wo_a
# input) ~2.7% from its own rounding (measured 0.027), y ~3.8% from xo's and z's together
# (measured 0.038), and the seam outputs, driven by y, about the same. The bounds leave ~1.8x; each
# wrong choice below moves xo by 18% (no sink) to 52% (no inverse RoPE), past twice the bound.
O_TOLERANCE = 0.05
Y_TOLERANCE = 0.07


@pytest.fixture(scope="module")
def csa() -> World:
    return world(4)


def run_ranks(wd: World, shards: list[ref.K2Weights]) -> list[ref.K2Outputs]:
    return ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)


@pytest.fixture(scope="module")
def run(csa, shards) -> list[ref.K2Outputs]:
    return run_ranks(csa, shards)


@pytest.fixture(scope="module")
def independent(csa, weights) -> dict[str, torch.Tensor]:
    o = inverse_rope_vllm(world_attention(csa, weights.sink), weights.rope, csa.inputs.positions)
    y = world_projections(o, weights)
    return {"o": o, "y": y, **world_seam(y, csa.inputs, weights)}


def live_rows(t: torch.Tensor) -> torch.Tensor:
    return t[[r for r in range(len(POSITIONS)) if r != PAD]]


def xo_error(outs: list[ref.K2Outputs], independent: dict[str, torch.Tensor]) -> float:
    """The ranks' wo_a inputs (dequantised, heads in rank order) against vLLM's o after its
    inverse RoPE: the comparison's first checkpoint, where the attention's choices show."""
    xo = torch.cat([rmath.mxfp8_dequantize(out.rank.xo_codes, out.rank.xo_scales).view(-1, LOCAL, D) for out in outs], 1)
    return rel(live_rows(xo), live_rows(independent["o"]))


def test_k2_part_one_on_8_ranks_matches_vllms_math(run, independent):
    assert xo_error(run, independent) < O_TOLERANCE
    assert rel(live_rows(run[0].y), live_rows(independent["y"])) < Y_TOLERANCE
    for name in ("r", "post", "comb", "x_norm"):
        assert rel(live_rows(getattr(run[0].seam, name)), live_rows(independent[name])) < Y_TOLERANCE, name


def test_every_rank_reduces_to_the_same_bits_and_pad_rows_add_nothing(run):
    for out in run[1:]:
        assert torch.equal(out.y, run[0].y) and torch.equal(out.seam.x_norm, run[0].seam.x_norm)
    for out in run:
        assert bool((out.rank.o[PAD] == 0).all()) and bool((out.rank.partial[PAD] == 0).all())
    assert bool((run[0].y[PAD] == 0).all())


def test_one_rank_given_its_peers_partials_is_the_group_run(csa, shards, run):
    peers: list[torch.Tensor | None] = [out.rank.partial for out in run]
    peers[5] = None
    one = ref.k2_part_one(csa.rank(5), shards[5], 5, peers)
    assert torch.equal(one.y, run[5].y) and torch.equal(one.seam.x_codes, run[5].seam.x_codes)
    with pytest.raises(ValueError):
        ref.k2_part_one(csa.rank(5), shards[5], 4, peers)


@pytest.mark.parametrize("wrong", ["natural_exp", "no_inverse_rope", "no_sink"])
def test_a_wrong_choice_fails_the_comparison(wrong, csa, shards, independent, monkeypatch):
    """The reference with one choice made wrong, through k2_part_one_ranks; wo_a / wo_b are
    stubbed (the wrong choices all sit before them, and they cost most of the run)."""
    monkeypatch.setattr(ref, "wo_a", lambda codes, scales, w: torch.zeros(codes.shape[0], 2 * O_LORA))
    monkeypatch.setattr(ref, "wo_b", lambda codes, scales, w: torch.zeros(codes.shape[0], H, dtype=torch.bfloat16))
    if wrong == "natural_exp":
        monkeypatch.setattr(ref, "LOG2E", 1.0)  # exp2 of natural logits
    elif wrong == "no_inverse_rope":
        monkeypatch.setattr(ref, "inverse_rope", lambda o, rope, positions: o.float())
    else:
        shards = [dataclasses.replace(w, attn_sink=torch.full_like(w.attn_sink, -math.inf)) for w in shards]
    assert xo_error(run_ranks(csa, shards), independent) > 2 * O_TOLERANCE
