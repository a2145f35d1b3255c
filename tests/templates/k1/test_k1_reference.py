"""K1's torch reference against independent formulations (CPU)."""

from __future__ import annotations

import dataclasses

import math
from fractions import Fraction

import pytest
import torch
from mono_jit.selfcheck.k1_world import random_activations, random_weights

from mono_jit.deepseek_v4 import EPS
from mono_jit.spec import Spec
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k1.layout import K1Layout

H = 7168


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def exact_code(amax: float) -> int:
    """Smallest s with amax <= 448 * 2^s, + 127, clamped to 0..254 (exact rational arithmetic)."""
    if amax == 0 or math.isnan(amax):
        return 0 if amax == 0 else 254
    if math.isinf(amax):
        return 254
    a, s = Fraction(amax), -200
    while a > 448 * Fraction(2) ** s:
        s += 1
    return min(max(s + 127, 0), 254)


EDGES = [0.0, 1e-45, 1e-40, 2.0 ** -126, 1e-4, 0.5, 1.0, 224.0, 447.99, 448.0,
         float(torch.tensor(448.0).nextafter(torch.tensor(1e9))), 449.0, 896.0, 897.0, 1e6, 3.4e38]


@pytest.mark.parametrize("amax", EDGES)
def test_e8m0_code_on_edges(amax):
    assert int(rmath.e8m0_code(torch.tensor([amax], dtype=torch.float32))[0]) == exact_code(
        float(torch.tensor(amax, dtype=torch.float32)))


def test_e8m0_code_random_and_special():
    values = torch.cat([torch.rand(2000) * 1000, torch.exp2(torch.randint(-140, 120, (500,)).float()) * 448,
                        torch.tensor([float("inf"), float("-inf")])])
    codes = rmath.e8m0_code(values)
    assert codes.tolist() == [exact_code(abs(v)) for v in values.tolist()]
    assert int(rmath.e8m0_code(torch.tensor([3.4e38]))[0]) == 247  # the largest finite code


def test_mxfp8_codes_on_edge_values():
    block = torch.zeros(4, 32)
    block[1, 0] = 448.0  # exactly representable at scale 1: code 127, byte 0x7E
    block[1, 1] = 2.0 ** -9  # the smallest e4m3 subnormal at scale 1
    block[2, 0] = 449.0  # above 448: the scale doubles
    block[3, 0] = 1e-42  # an f32 subnormal block
    codes, scales = rmath.mxfp8_quantize(block.flatten())
    codes = codes.view(4, 32)
    assert scales.tolist() == [0, 127, 128, 0]
    assert codes[0].eq(0).all()
    assert int(codes[1, 0]) == 0x7E and int(codes[1, 1]) == 0x01
    assert float(rmath.e4m3_value(codes[2, :1]) * 2) == 448.0  # 449 / 2 rounds to 224 (RNE)
    back = rmath.mxfp8_dequantize(codes.flatten(), scales).view(4, 32)
    assert back[1, 0] == 448.0 and back[1, 1] == 2.0 ** -9


def test_mxfp8_round_trip_error_is_e4m3_error():
    x = torch.randn(64, 256) * torch.exp2(torch.randint(-20, 20, (64, 1)).float())
    codes, scales = rmath.mxfp8_quantize(x)
    back = rmath.mxfp8_dequantize(codes, scales)
    blocks = x.view(64, 8, 32)
    quantum = rmath.e8m0_value(scales).unsqueeze(-1) * 2.0 ** -9  # e4m3 subnormal step at that scale
    err = (back.view(64, 8, 32) - blocks).abs()
    assert (err <= torch.maximum(blocks.abs() * 2.0 ** -4, quantum)).all()
    assert (back.view(64, 8, 32).abs().amax(-1) <= 448 * rmath.e8m0_value(scales)).all()


def test_sinkhorn_is_doubly_stochastic():
    logits = torch.randn(256, 4, 4)  # mixes * scale + base: O(1) logits
    comb = rmath.sinkhorn(logits)
    assert (comb > 0).all()
    # Columns are normalised last (exact); rows converge: 20 rounds leave < 5e-4 on O(1) logits.
    torch.testing.assert_close(comb.sum(-1), torch.ones(256, 4), atol=5e-4, rtol=0)
    torch.testing.assert_close(comb.sum(-2), torch.ones(256, 4), atol=1e-5, rtol=0)


def test_sinkhorn_first_step_is_row_softmax_then_columns():
    logits = torch.randn(3, 4, 4)
    one = rmath.sinkhorn(logits, rounds=1)
    soft = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) + EPS
    torch.testing.assert_close(one, soft / (soft.sum(-2, keepdim=True) + EPS))


def test_rms_norm_matches_torch():
    x = torch.randn(5, 512).to(torch.bfloat16)
    w = torch.randn(512).to(torch.bfloat16)
    expected = torch.nn.functional.rms_norm(x.float(), (512,), w.float(), eps=1e-6).to(torch.bfloat16)
    assert torch.equal(rmath.rms_norm(x, w), expected)


def test_rope_pairs_adjacent_dims_like_a_complex_rotation():
    x = torch.randn(6, 64)
    theta = torch.rand(6, 32) * 6
    out = rmath.rope_gptj(x, torch.cos(theta), torch.sin(theta))
    as_complex = torch.view_as_complex(x.view(6, 32, 2)) * torch.polar(torch.ones_like(theta), theta)
    torch.testing.assert_close(out, torch.view_as_real(as_complex).view(6, 64), atol=1e-5, rtol=1e-5)


def test_fold_against_loops():
    m = 2
    x = torch.randn(m, 8).to(torch.bfloat16)
    r = torch.randn(m, 4, 8).to(torch.bfloat16)
    post = torch.rand(m, 4, 1) * 2
    comb = torch.rand(m, 4, 4)
    out = rmath.fold(x, r, post, comb, True)
    for t in range(m):
        for j in range(4):
            want = post[t, j, 0] * x[t].float() + sum(comb[t, i, j] * r[t, i].float() for i in range(4))
            assert torch.equal(out[t, j], want.to(torch.bfloat16))
    assert torch.equal(rmath.fold(x, r, post, comb, False), r)


def test_seam_gate_against_loops():
    m, h = 2, 256  # two 128-column chunks
    r = torch.randn(m, 4, h).to(torch.bfloat16)
    fn, base, scale = torch.randn(24, 4 * h) * 0.05, torch.randn(24), torch.rand(3) + 0.5  # O(1) mixes
    gate = rmath.seam_gate(r, fn, base, scale)
    for t in range(m):
        flat = r[t].flatten().double()
        mixes = [(flat * fn[k].double()).sum() / math.sqrt(float((flat ** 2).mean()) + 1e-6) for k in range(24)]
        assert torch.allclose(gate.mixes[t].double(), torch.stack(mixes), rtol=1e-5, atol=1e-5)
        pre = [1 / (1 + math.exp(-(float(mixes[i]) * float(scale[0]) + float(base[i])))) + 1e-6 for i in range(4)]
        assert torch.allclose(gate.pre[t].double(), torch.tensor(pre, dtype=torch.float64), atol=1e-6)
    assert ((gate.post > 0) & (gate.post < 2)).all()
    torch.testing.assert_close(gate.comb.sum(-2), torch.ones(m, 4), atol=1e-5, rtol=0)


def test_fp8_gemv_against_blockwise_loops():
    n, k, m = 256, 256, 3
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n, k, generator=g) * 50).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    padded = torch.cat([w, torch.full((n, 32), 0x7F, dtype=torch.uint8)], dim=1)  # padded rows (NaN bytes)
    ws = torch.randint(120, 130, (2, 2), generator=g, dtype=torch.uint8)
    x = torch.randn(m, k, generator=g)
    xc, xs = rmath.mxfp8_quantize(x)
    out = rmath.fp8_gemv(xc, xs, padded, ws, k)
    xd = rmath.mxfp8_dequantize(xc, xs).double()
    want = torch.zeros(m, n, dtype=torch.float64)
    for bn in range(2):
        for bk in range(2):
            blk = rmath.e4m3_value(w[bn * 128:(bn + 1) * 128, bk * 128:(bk + 1) * 128]).double()
            want[:, bn * 128:(bn + 1) * 128] += xd[:, bk * 128:(bk + 1) * 128] @ blk.T * 2.0 ** (int(ws[bn, bk]) - 127)
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


def _records(m=4):
    kv = torch.randn(m, 512) * torch.exp2(torch.randint(-6, 6, (m, 1)).float())
    kv[0, :64] = 0  # an all-zero block: the amax floor applies
    kv = kv.to(torch.bfloat16).float()
    return kv, rmath.kv_record(kv)


def test_kv_record_round_trip_within_e4m3_error():
    kv, records = _records()
    assert records.shape == (4, 584) and records.dtype == torch.uint8
    back = rmath.kv_dequantize(records)
    assert torch.equal(back[:, 448:], kv[:, 448:])  # RoPE dims are stored as bf16
    scales = rmath.e8m0_value(records[:, 576:583]).repeat_interleave(64, dim=1)
    err = (back[:, :448] - kv[:, :448]).abs()
    assert (err <= torch.maximum(kv[:, :448].abs() * 2.0 ** -4, scales * 2.0 ** -9)).all()
    assert int(records[0, 576]) == exact_code(1e-4)  # zero block: code of the 1e-4 floor
    assert records[:, 583].eq(0).all()


def test_kv_insert_writes_pages_and_skips_minus_one():
    _, records = _records(4)
    block, stride, pages = 4, 4 * 584 + 64, 3  # a page padded past its records
    cache = torch.full((pages * stride,), 0xAB, dtype=torch.uint8)
    slots = torch.tensor([5, -1, 0, 11])
    rmath.kv_insert(cache, records, slots, stride, block)
    for rec, slot in zip(records, slots.tolist()):
        if slot >= 0:
            got = rmath.kv_read(cache, slot, stride, block)
            assert torch.equal(got, rec)
            assert int(got[583]) == 0  # the pad byte, written 0 as vLLM's insert writes it
    written = torch.zeros_like(cache, dtype=torch.bool)
    for slot in (5, 0, 11):
        page, row = divmod(slot, block)
        written[page * stride + row * 576: page * stride + (row + 1) * 576] = True
        s = page * stride + block * 576 + row * 8
        written[s:s + 8] = True
    assert cache[~written].eq(0xAB).all(), "bytes outside the three records changed (the -1 row wrote?)"


def test_k1_reference_end_to_end_invariants():
    m = 3
    w = random_weights(row_pad=256)
    x, residual, post_mix, res_mix = random_activations(m)
    out = ref.k1(x, residual, post_mix, res_mix, True, w, torch.tensor([0, 17, 63]))
    assert out.q.shape == (m, 16, 512) and out.qr.shape == (m, 1536) and out.x_norm.shape == (m, H)
    torch.testing.assert_close(out.comb.sum(-2), torch.ones(m, 4), atol=1e-5, rtol=0)
    # q_norm / kv_norm (random weights) and the head RMS: RMS 1 once the weight is divided out
    # and kv's RoPE is rotated back (RoPE rotates pairs, keeping norms).
    torch.testing.assert_close((out.qr.float() / w.q_norm.float()).pow(2).mean(-1), torch.ones(m), atol=3e-2, rtol=0)
    torch.testing.assert_close(out.q.float().pow(2).mean(-1), torch.ones(m, 16), atol=2e-2, rtol=0)
    cos, sin = rmath.rope_angles(w.rope, torch.tensor([0, 17, 63]))
    kv = torch.cat([out.kv[:, :448], rmath.rope_gptj(out.kv[:, 448:], cos, -sin)], dim=1) / w.kv_norm.float()
    torch.testing.assert_close(kv.pow(2).mean(-1), torch.ones(m), atol=3e-2, rtol=0)
    back = rmath.kv_dequantize(out.records)
    torch.testing.assert_close(back, out.kv, atol=0.1, rtol=0.07)
    # Layer 0: vLLM passes the bf16 x [M, 4, H] in the x, post_mix and res_mix slots; unread.
    layer0 = residual.clone()
    assert torch.equal(ref.k1(layer0, residual, layer0, layer0, False, w, torch.zeros(m, dtype=torch.long)).r, residual)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_layout_offsets_are_aligned_and_disjoint(rows):
    lay = K1Layout.of(Spec(8, 4, 1024, rows))
    assert lay.tasks(5) == 256 and lay.tasks(3) == 256 and lay.heads == 16  # one task per CTA
    f32_regions = [lay.partials, lay.qkv_raw, lay.q_raw, lay.f32_words]
    byte_regions = [lay.x_codes, lay.x_scales, lay.qr_codes, lay.qr_scales, lay.bytes]
    assert f32_regions == sorted(f32_regions) and byte_regions == sorted(byte_regions)
    assert all(o % 8 == 0 for o in f32_regions[1:3])  # 8-wide f32 loads
    assert all(o % 16 == 0 for o in (lay.x_codes, lay.qr_codes))  # 16-byte MFMA operand loads
    assert lay.sync_words == 3 + lay.tasks(1) + rows + 256 + rows + 256  # epoch, exit, arrival, flags


def test_preshuffle_matches_aiters_index_formula_and_round_trips():
    w = torch.randint(0, 256, (64, 128), dtype=torch.uint8)
    packed = rmath.preshuffle_16x16(w)
    for n, k in [(0, 0), (5, 17), (16, 31), (17, 32), (63, 127), (40, 100)]:
        at = ((n // 16) * (128 // 32) + k // 32) * 512 + ((k % 32) // 16) * 256 + (n % 16) * 16 + k % 16
        assert packed.flatten()[at] == w[n, k]
    assert torch.equal(rmath.unshuffle_16x16(packed), w)


def test_fp8_gemv_reads_a_preshuffled_weight_like_the_plain_one():
    w = (torch.randn(256, 256) * 30).to(torch.float8_e4m3fn).view(torch.uint8)
    ws = torch.randint(120, 130, (2, 2), dtype=torch.uint8)
    xc, xs = rmath.mxfp8_quantize(torch.randn(2, 256))
    assert torch.equal(rmath.fp8_gemv(xc, xs, rmath.preshuffle_16x16(w), ws, 256, shuffled=True),
                       rmath.fp8_gemv(xc, xs, w, ws, 256))


def test_e8m0_from_scale_is_exact_and_refuses_non_powers_of_two():
    codes = torch.tensor([0, 1, 100, 127, 200, 254], dtype=torch.uint8)
    assert torch.equal(ref.e8m0_from_scale(rmath.e8m0_value(codes[1:])), codes[1:])
    with pytest.raises(ValueError, match="powers of two"):
        ref.e8m0_from_scale(torch.tensor([0.75]))


def test_seam_partials_add_up_to_the_whole_row():
    r = torch.randn(2, 4, 384).to(torch.bfloat16)
    fn = torch.randn(24, 4 * 384)
    partials = rmath.seam_partials(r, fn)
    assert partials.shape == (2, 3, 25)
    flat = r.flatten(1).double()
    torch.testing.assert_close(partials.double().sum(1)[:, :24], flat @ fn.double().T, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(partials.double().sum(1)[:, 24], flat.pow(2).sum(-1), rtol=1e-6, atol=1e-4)
    # chunk c covers columns 128c .. 128c + 127 of every stream
    torch.testing.assert_close(partials[:, 1, 24].double(), r[:, :, 128:256].double().pow(2).sum((1, 2)),
                               rtol=1e-6, atol=1e-4)


def test_random_norm_weights_reach_the_outputs():
    """K1's inputs carry random q_norm / kv_norm weights, so a swapped or misindexed weight
    changes qr and the KV record."""
    m = 2
    w = random_weights()
    assert w.q_norm.float().std() > 0.1 and w.kv_norm.float().std() > 0.1
    x, residual, post_mix, res_mix = random_activations(m)
    out = ref.k1(x, residual, post_mix, res_mix, True, w, torch.tensor([3, 9]))
    flipped = dataclasses.replace(w, q_norm=w.q_norm.flip(0), kv_norm=w.kv_norm.flip(0))
    other = ref.k1(x, residual, post_mix, res_mix, True, flipped, torch.tensor([3, 9]))
    assert not torch.equal(out.qr, other.qr) and not torch.equal(out.records, other.records)


def test_nan_activation_gives_an_e4m3_nan_and_code_254():
    """A NaN propagates as vLLM's torch path propagates it: its byte is an e4m3 NaN, its block's
    code 254 and the block's multiplier 2^-126 (e8m0_inverse); other blocks are untouched. The
    kernel's clamp and amax are NaN-propagating too (v_maximum3 / v_minimum3, test_k1_gates)."""
    x = torch.randn(2, 128)
    x[1, 37] = float("nan")
    codes, scales = rmath.mxfp8_quantize(x)
    clean_codes, clean_scales = rmath.mxfp8_quantize(torch.nan_to_num(x, nan=0.0))
    assert int(codes[1, 37]) & 0x7F == 0x7F  # S.1111.111: e4m3's only NaN
    assert int(scales[1, 1]) == 254
    assert torch.equal(scales[0], clean_scales[0]) and torch.equal(codes[0], clean_codes[0])
    keep = torch.ones(128, dtype=torch.bool)
    keep[32:64] = False
    assert torch.equal(codes[1, keep], clean_codes[1, keep])
    finite = torch.cat([x[1, 32:37], x[1, 38:64]])
    assert torch.equal(rmath.e4m3_value(torch.cat([codes[1, 32:37], codes[1, 38:64]])),
                       (finite * 2.0 ** -126).clamp(-448, 448).to(torch.float8_e4m3fn).float())
    record = rmath.kv_record(torch.where(torch.arange(512) == 5, float("nan"), 1.0).unsqueeze(0))
    assert int(record[0, 5]) & 0x7F == 0x7F and int(record[0, 576]) == 254


def test_e8m0_inverse_is_exact_for_finite_codes_and_normal_for_254():
    codes = torch.arange(0, 255, dtype=torch.int32).to(torch.uint8)
    inverse = rmath.e8m0_inverse(codes)
    assert torch.equal(inverse[:254] * rmath.e8m0_value(codes[:254]), torch.ones(254))
    assert float(inverse[254]) == 2.0 ** -126  # the smallest normal f32: the kernel's exponent bits
