"""tests/support/layer_math.py, vLLM's decode layer formulated independently, against vLLM's own torch pieces,
against its own layouts read back, and against mono_jit's references composed (K1 per rank, then
K2 over the 8 ranks): the bounds the end-to-end test asserts, and what a wrong choice does to them.

Bounds of decode_layer against the references (and, in the end-to-end test, against the runner).
Both sides quantise at the same points (MXFP8 per 32, e4m3 RNE, E8M0 ceil(log2(amax / 448))) and
take dot products in f64 (the routed experts in f32 here), so they differ only where an ulp of a
different summation order (f32 for vLLM's mHC mixes here, f64 partial sums in K1) moves a rounding:
a bf16 one (2^-8 relative on that element), or an MXFP8 one, which moves the element by one e4m3
step (3 mantissa bits: up to 2^-3 of it; a half-ulp error of 2^-4 that changes side). Such a flip
does not stay alone: every later MXFP8 quantisation of a value that depends on the flipped element
flips with it where its input moved past a rounding boundary, so an output's error grows like
sqrt(fraction of flipped codes) x 2^-4 and saturates at the full MXFP8 noise of its last
quantisation (measured: the MoE output moves 2.5e-2 when x_norm's codes are decorrelated, 0.4-0.7e-2
for 0.01-0.1% of x_norm's elements one bf16 ulp off).

- FRONT 1e-3: normed and qr are bf16 before any MXFP8 (qr after one, of normed): only bf16 flips on
  a few elements (one ulp of 4e-3 on < 6% of them would give 1e-3). Measured <= 3e-8.
- SEAM 1e-2: res_out, post_out, comb_out follow the attention output y, which went through two
  MXFP8 quantisations (o, z); y enters res_out at ~60% of its norm, so 1e-2 allows y ~1.7e-2 off,
  most of its decorrelated MXFP8 noise (~3%). Measured: y bit-identical, the seam outputs <= 4e-5
  (the attention seam's post / comb differ in f32 ulps, moving a few bf16 roundings).
- OUT 5e-2: out follows the MoE's MXFP8 of h; its noise saturates at 2.5e-2 (above), so 2x that.
  Measured 2e-6 to 4e-3 here (a few bf16 flips of x_norm upstream); 2.9e-2 at worst in
  test_e2e_layer, where y came out 2.5e-3 off on one step (summation orders) and 15% of res_out's
  bf16 roundings moved.
- records: byte-identical (both encode the same bf16 kv; the 64-block exponent ceil(log2(amax /
  448)) has no f32 tie for bf16 amax). Measured: identical.

Each wrong choice below moves res_out past 2x SEAM (or the records off bytes), so the comparison
would catch it.
"""

from __future__ import annotations

import dataclasses
import math

import layer_math as lm
import pytest
import torch

from composed import codes, compose

from mono_jit.runtime.weights import AttnWeights, MonoLayerWeights
from mono_jit.templates.k1 import reference as k1
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import moe_reference as moe

FRONT, SEAM, OUT = 1e-3, 1e-2, 5e-2
U8 = torch.uint8


class Dims:
    tp = 8


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2 ** 20


# -- fixtures --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt() -> lm.CheckpointLayer:
    return lm.random_checkpoint_layer(5, 4, False, seed=11)


@pytest.fixture(scope="module")
def hca0(ckpt) -> lm.CheckpointLayer:
    """Layer 0 (HCA, hash-routed) with the same weights: its experts are already in the cache."""
    return dataclasses.replace(ckpt, layer_id=0, ratio=128, hash_layer=True)


@pytest.fixture(scope="module")
def csa_step(ckpt) -> lm.LayerStep:
    return lm.random_step(ckpt, 4, seed=5, pads=(2,))


@pytest.fixture(scope="module")
def hca_step(hca0) -> lm.LayerStep:
    return lm.random_step(hca0, 3, seed=6, first=True)


# -- vLLM's layouts (its torch mHC reference: tests/vllm/test_vllm_torch_references.py) ----------

def test_records_are_k1s_and_read_back():
    """vLLM's writer (cache_utils.py:44, formulated here) and K1's kv_record agree byte for byte, on
    blocks spanning many scales and on an all-zero block (the 1e-4 amax floor)."""
    g = torch.Generator().manual_seed(4)
    kv = torch.randn(64, 512, generator=g) * torch.exp2(torch.randint(-12, 12, (64, 1), generator=g).float())
    kv[0, :64] = 0
    kv = kv.bfloat16()
    records = lm.encode_records(kv)
    assert torch.equal(records, rmath.kv_record(kv.float()))
    assert torch.equal(lm.decode_record(records), rmath.kv_dequantize(records))
    cache = torch.full((3 * (4 * 584 + 40),), 0xAB, dtype=U8)
    slots = torch.tensor([5, -1, 0, 11])
    lm.insert_records(cache, records[:4], slots, 4 * 584 + 40, 4)
    for rec, slot in zip(records[:4], slots.tolist()):
        if slot >= 0:
            assert torch.equal(lm.read_record(cache, slot, 4 * 584 + 40, 4), rec)
            assert torch.equal(rmath.kv_read(cache, slot, 4 * 584 + 40, 4), rec)
    assert int((cache != 0xAB).sum()) <= 3 * 584


def test_front_pieces_match_k1s():
    g = torch.Generator().manual_seed(7)
    positions = torch.tensor([3, 900, 4000])
    rope = torch.rand(4096, 32, generator=g) * 6
    cos_sin = torch.cat([rope.cos(), rope.sin()], 1)
    q_raw = torch.randn(3, 16 * 512, generator=g) * 3
    want = k1.q_heads(q_raw, cos_sin, positions)
    assert torch.equal(lm.q_heads(q_raw.bfloat16().view(3, 16, 512), cos_sin, positions), want)
    kv = torch.randn(3, 512, generator=g).bfloat16()
    mine = lm.kv_rope(kv, cos_sin, positions)
    cos, sin = rmath.rope_angles(cos_sin, positions)
    theirs = torch.cat([kv[:, :448].float(), rmath.rope_gptj(kv[:, 448:], cos, sin)], 1).bfloat16()
    assert torch.equal(mine, theirs)


def test_block_gemv_and_fp4_decode_against_plain_dequantisation():
    g = torch.Generator().manual_seed(8)
    w = torch.randint(0, 256, (256, 384), generator=g, dtype=U8) & 0xBF
    s = torch.randint(118, 124, (2, 3), generator=g, dtype=U8)
    x = lm.mx8(torch.randn(3, 384, generator=g))
    want = x.double() @ lm.dequant_fp8_blocks(w, s).double().T
    torch.testing.assert_close(lm.block_gemv(x, w, s, chunk=128), want, rtol=1e-12, atol=1e-12)
    packed = torch.randint(0, 256, (5, 64), generator=g, dtype=U8)
    scales = torch.randint(120, 130, (5, 4), generator=g, dtype=U8)
    values = torch.stack([lm.e2m1(packed & 15), lm.e2m1(packed >> 4)], -1).view(5, 128)
    assert torch.equal(lm.dequant_mxfp4(packed, scales), values * torch.exp2(scales.float() - 127).repeat_interleave(32, 1))


@pytest.mark.slow
def test_moe_partials_are_the_per_rank_formulation():
    """The full-width MoE cut per rank equals vLLM's per-rank shared + routed loop (rank_slices)."""
    w = lm.global_weights()
    x = torch.randn(3, lm.H, generator=torch.Generator().manual_seed(9)).bfloat16()
    partials, ids, weights = lm.moe_partials(x, w)
    for rank in (0, 5):
        raw = lm.rank_slices(w, rank)
        want = (lm.vllm_shared(x, raw).float() + lm.vllm_routed(x, raw, ids, weights).float()).bfloat16()
        assert rel(partials[rank], want) < 1e-3


# -- the checkpoint and vLLM's per-rank layouts ------------------------------------------------------

def unshuffle_16x16(w: torch.Tensor) -> torch.Tensor:
    """AITER's (16, 16) layout [N/16][K/32][2][16 rows][16 bytes] back to row-major."""
    n, k = w.shape
    return w.view(n // 16, k // 32, 2, 16, 16).permute(0, 3, 1, 2, 4).reshape(n, k)


def unshuffle_a16w4(w: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """One expert's [N, K] bytes back from [tiles][gate, up][K / 64][4 lanes][16 rows][16 bytes]
    (gate_up: the tile's 16 gate rows, then its 16 up rows) or [N / 16][K / 64][4][16][16]."""
    n, k = w.shape
    if gate_up:
        return w.view(n // 32, 2, k // 64, 4, 16, 16).permute(1, 0, 4, 2, 3, 5).reshape(n, k)
    return w.view(n // 16, k // 64, 4, 16, 16).permute(0, 3, 1, 2, 4).reshape(n, k)


@pytest.mark.parametrize("rank", [0, 7])
def test_rank_tensors_read_back_to_the_checkpoint(ckpt, rank):
    d = lm.rank_tensors(ckpt, rank)
    heads, groups = slice(16 * 512 * rank, 16 * 512 * (rank + 1)), slice(2048 * rank, 2048 * (rank + 1))
    assert torch.equal(unshuffle_16x16(d["wqkv"].view(U8)), ckpt.wqkv)
    assert torch.equal(codes(d["wqkv_scale"]), ckpt.s_wqkv) and torch.equal(lm.mx32(codes(d["wqkv_scale"])), d["wqkv_scale"])
    for name, rows, scale in (("wq_b", heads, ckpt.s_wq_b), ("wo_a", groups, ckpt.s_wo_a)):
        t = d[name]
        k = t.shape[1]
        assert t.stride() == (k + 256, 1) and t.dtype == lm.E4M3
        storage = torch.as_strided(t.view(U8), (t.shape[0], k + 256), (k + 256, 1))
        assert torch.equal(storage[:, :k], getattr(ckpt, name)[rows]) and bool((storage[:, k:] == 0x7F).all())
        assert torch.equal(codes(d[f"{name}_scale"]), scale[rows.start // 128:rows.stop // 128])
    assert torch.equal(unshuffle_16x16(d["wo_b"].view(U8)), ckpt.wo_b[:, groups])
    assert torch.equal(codes(d["wo_b_scale"]), ckpt.s_wo_b[:, groups.start // 128:groups.stop // 128])
    assert torch.equal(d["attn_sink"], ckpt.attn_sink[16 * rank:16 * (rank + 1)])
    # the MoE: the rank's intermediate share of every reachable expert, gate rows then up rows
    g = ckpt.moe
    share = torch.arange(384 * rank, 384 * (rank + 1))
    rows = torch.cat([share, 3072 + share])
    w13, w2 = d["w13"].view(U8), d["w2"].view(U8)
    w13_s, w2_s = d["w13_s"].view(384, 768, 224), d["w2_s"].view(384, 7168, 16)
    for e in g.live()[:3] + g.live()[-1:]:
        assert torch.equal(unshuffle_a16w4(w13[e], True), g.w13[e][rows])
        assert torch.equal(unshuffle_a16w4(w2[e], False), g.w2[e][:, 192 * rank:192 * (rank + 1)])
        # scales: AITER's [rows / 32][cols / 8][K_Lane 4][N_Lane 16][K_Pack 2][N_Pack 2] order, read back
        # by mono's reader (a reader independent of layer_math's shuffles)
        assert torch.equal(moe.unshuffle_scales(w13_s[e].reshape(768, 224), 1, True)[0], g.w13_s[e][rows])
        assert torch.equal(moe.unshuffle_scales(w2_s[e].reshape(7168, 16), 1, False)[0][:, :12],
                           g.w2_s[e][:, 12 * rank:12 * (rank + 1)])
    assert torch.equal(unshuffle_16x16(d["sgu"].view(U8)), g.sgu[rows])
    assert torch.equal(codes(d["sgu_s"]), g.sgu_s[torch.cat([rows[:384:128], rows[384::128]]) // 128])
    assert torch.equal(d["sw2"].view(U8), g.sw2[:, share]) and torch.equal(codes(d["sw2_s"]), g.sw2_s[:, 3 * rank:3 * (rank + 1)])
    assert torch.equal(d["bias"], g.bias) and torch.equal(d["gate_w"], g.gate)


def test_rank_tensors_pass_the_runners_checks_and_cost_only_reachable_experts(ckpt, hca0):
    before = rss_mb()
    d = lm.rank_tensors(hca0, 3)
    grown = rss_mb() - before
    # the routed tensors span 1.7 GB; the rank's attention shares and reachable experts ~0.1 GB
    assert grown < 400, f"rank_tensors grew RSS by {grown:.0f} MB"
    assert d["bias"] is None and d["ratio"] == 128 and d["layer_id"] == 0
    attn = AttnWeights(**{k: d[k] for k in lm.ATTN_FIELDS})
    attn.check(Dims)
    MonoLayerWeights(attn=attn, **{k: v for k, v in d.items() if k not in lm.ATTN_FIELDS}).check(Dims)


def test_only_reachable_experts_are_routed_to(ckpt, hca0):
    x = torch.randn(64, lm.H, generator=torch.Generator().manual_seed(10)).bfloat16()
    ids, weights = lm.vllm_route(x, ckpt.moe.gate, ckpt.moe.bias, None)
    assert set(ids.flatten().tolist()) <= set(ckpt.moe.live()) and len(set(ids.flatten().tolist())) > 6
    torch.testing.assert_close(weights.sum(-1), torch.full((64,), 2.5))
    table = lm.route_table(hca0, 500)
    assert table.shape == (500, 6) and table.dtype == torch.int32
    assert all(len(set(row)) == 6 and set(row) <= set(hca0.moe.live()) for row in table.tolist())
    assert 383 in hca0.moe.live() and len(hca0.moe.live()) == 8


# -- decode_layer against mono_jit's references composed -------------------------------------------

BOUNDS = dict(normed=FRONT, qr=FRONT, res_out=SEAM, post_out=SEAM, comb_out=SEAM, out=OUT)


@pytest.fixture(scope="module")
def csa_case(ckpt, csa_step):
    return csa_step, ckpt, lm.decode_layer(csa_step, ckpt), compose(csa_step, ckpt)


@pytest.fixture(scope="module")
def hca_case(hca0, hca_step):
    return hca_step, hca0, lm.decode_layer(hca_step, hca0), compose(hca_step, hca0)


@pytest.fixture(params=["csa_case", "hca_case"])
def case(request):
    return (request.param, *request.getfixturevalue(request.param))


@pytest.mark.slow
def test_decode_layer_matches_the_references_composed(case):
    """CSA (bias routing, a fold, a pad row) and layer 0 (HCA, hash routing, no fold)."""
    name, step, _, mine, theirs = case
    errors = {k: rel(getattr(mine, k), theirs[k]) for k in BOUNDS}
    diff = (mine.records.int() - theirs["records"].int()).abs()
    print(f"\n{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items())
          + f"; records: {int((diff > 0).sum())} bytes differ, max {int(diff.max())}")
    for k, bound in BOUNDS.items():
        assert errors[k] < bound, (k, errors[k])
    assert torch.equal(mine.records, theirs["records"]) and torch.equal(mine.swa_cache, theirs["swa_cache"])
    assert torch.equal(mine.expert_ids, theirs["expert_ids"])
    assert mine.out.dtype == torch.bfloat16 and mine.post_out.shape == (step.positions.shape[0], 4, 1)


@pytest.mark.slow
def test_pad_rows_write_nothing_and_attend_to_nothing(case):
    _, step, _, mine, _ = case
    pads = [r for r, s in enumerate(step.slot_mapping.tolist()) if s < 0]
    live = [r for r in range(len(step.slot_mapping)) if r not in pads]
    assert bool((mine.attn_out[pads] == 0).all()) and bool((mine.attn_out[live] != 0).any(-1).all())
    changed = torch.nonzero(mine.swa_cache != step.swa_cache).flatten()
    assert len(changed) <= len(live) * 584  # the live rows' records, nowhere else
    assert bool(mine.out.isfinite().all()) and bool(mine.res_out.isfinite().all())


# -- a wrong choice fails the comparison ------------------------------------------------------------

def neox_q_heads(q, cos_sin, positions, eps=lm.EPS):
    """Wrong: RoPE pairs (i, i + 32) instead of (2i, 2i + 1)."""
    cos, sin = lm._angles(cos_sin, positions)
    qf = q.float()
    qf = qf * torch.rsqrt(qf.square().sum(-1, keepdim=True) / 512 + eps)
    a, b = qf[..., 448:480].clone(), qf[..., 480:].clone()
    qf[..., 448:480], qf[..., 480:] = a * cos[:, None] - b * sin[:, None], a * sin[:, None] + b * cos[:, None]
    return qf.bfloat16()


def neox_kv_rope(kv, cos_sin, positions):
    cos, sin = lm._angles(cos_sin, positions)
    out = kv.float()
    a, b = out[:, 448:480].clone(), out[:, 480:].clone()
    out[:, 448:480], out[:, 480:] = a * cos - b * sin, a * sin + b * cos
    return out.bfloat16()


WRONG = {
    "no_sink": lambda mp, orig: mp.setattr(lm, "dense_attention", lambda q, keys, sink: orig["attn"](
        q, keys, torch.full_like(sink, -math.inf))),
    # a base-2 softmax whose sink was not scaled by log2(e): the sink acts as sink x ln 2
    "sink_not_base2": lambda mp, orig: mp.setattr(lm, "dense_attention", lambda q, keys, sink: orig["attn"](
        q, keys, sink * math.log(2))),
    "neox_rope_pairs": lambda mp, orig: (mp.setattr(lm, "q_heads", neox_q_heads), mp.setattr(lm, "kv_rope", neox_kv_rope)),
    "no_inverse_rope": lambda mp, orig: mp.setattr(lm, "inverse_rope_vllm", lambda o, rope, p, dtype=None: o.float()),
    "attend_before_insert": lambda mp, orig: mp.setattr(lm, "step_keys", lambda step, cache: orig["keys"](
        step, step.swa_cache)),
}


@pytest.mark.slow
@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_a_wrong_choice_fails_the_bounds(wrong, csa_case, monkeypatch):
    """decode_layer with one attention choice made wrong (the MoE stubbed: every choice sits before
    it, and res_out already shows them) against the references composed."""
    csa_step, ckpt, _, theirs = csa_case
    orig = {"attn": lm.dense_attention, "keys": lm.step_keys}
    WRONG[wrong](monkeypatch, orig)
    monkeypatch.setattr(lm, "moe_partials", lambda x, w, ids, tp: (
        [torch.zeros_like(x)] * tp, torch.zeros(x.shape[0], 6, dtype=torch.int32), None))
    mine = lm.decode_layer(csa_step, ckpt)
    res = rel(mine.res_out, theirs["res_out"])
    records_off = int((mine.records != theirs["records"]).sum())
    print(f"\n{wrong}: res_out {res:.2e}, post_out {rel(mine.post_out, theirs['post_out']):.2e}, "
          f"records {records_off} bytes off")
    assert res > 2 * SEAM or records_off > 0


MOE_WRONG = {
    "no_swiglu_clamp": lambda mp, orig: mp.setattr(lm, "clamped_swiglu", lambda gu, limit=lm.LIMIT: orig(gu, math.inf)),
    "no_routed_scaling": lambda mp, orig: mp.setattr(lm, "SCALE", 1.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("wrong", sorted(MOE_WRONG))
def test_a_wrong_moe_choice_fails_the_out_bound(wrong, csa_case, monkeypatch):
    csa_step, ckpt, _, theirs = csa_case
    MOE_WRONG[wrong](monkeypatch, lm.clamped_swiglu)
    out = rel(lm.decode_layer(csa_step, ckpt).out, theirs["out"])
    print(f"\n{wrong}: out {out:.2e}")
    assert out > 2 * OUT
