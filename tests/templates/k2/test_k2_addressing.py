"""K2's index arithmetic (templates/k2/attention_addressing.py and the layout's offsets, what the kernel's
address code is traced from) run on the CPU: wo_a and wo_b emulated MFMA by MFMA through the
shared operand layout and the independent MFMA model (tests/support/gemv_model.py, tests/support/mfma_model.py),
wo_b's pair slots checked against the pushes they must make, and every scratch, record, operand
and weight access of every bucket and ratio bounded by its region."""

from __future__ import annotations

import pytest
import torch
from gemv_model import Fp8Weight, Mxfp8Scratch, problem, task_accumulators

from mono_jit import deepseek_v4
from mono_jit.spec import STANDARD_MAX_TOKENS
from mono_jit.templates import addressing as ad
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.geometry import KV_DATA, KV_SCALES, THREADS, WAVES
from mono_jit.templates.k2 import attention_addressing as k2a
from mono_jit.templates.k2.attention_layout import K2Layout

H = deepseek_v4.HIDDEN
GROUP_K = 8 * 512  # a wo_a group: 8 heads x 512
LAYOUTS = [K2Layout(8, ratio, width, rows) for ratio, width in ((4, 1024), (128, 8192)) for rows in STANDARD_MAX_TOKENS]


def _id(lay: K2Layout) -> str:
    return f"r{lay.ratio}-m{lay.rows}"


def _activations(m: int, k: int, seed: int):
    """MXFP8 rows whose per-32 codes differ inside every 128-step (a misplaced scale shows)."""
    g = torch.Generator().manual_seed(seed)
    block_scale = torch.exp2(torch.randint(-6, 7, (m, k // 32), generator=g).float())
    return rmath.mxfp8_quantize(torch.randn(m, k, generator=g) * block_scale.repeat_interleave(32, dim=1))


@pytest.mark.parametrize("shuffled", [False, True])
def test_wo_a_through_k2s_addressing_and_the_mfma_model_is_each_groups_gemv(shuffled):
    """Tasks of both groups and both K halves: the f32 halves add up to each group's GEMV over
    its own heads' columns (group g: xo columns 4096 g ..), every output once a half."""
    m = 3
    lay = K2Layout(8, 4, 1024, 4)
    plain, scales, _, _ = problem(lay.o_width, GROUP_K, m, seed=5)
    xo_codes, xo_scales = _activations(m, lay.heads * 512, seed=6)
    weight = Fp8Weight(plain, scales, GROUP_K, pad=256, shuffled=shuffled)
    scratch = Mxfp8Scratch(xo_codes, xo_scales, m, lay.operand_rows, lay.heads * 512)
    assert (lay.xo_codes, lay.xo_scales) == (0, lay.operand_rows * lay.heads * 512)  # the scratch's bases
    tasks = [0, 1, 2, 3] + [lay.tasks(4) // 2 + t for t in range(4)]  # group 0 and group 1, both halves
    out = torch.zeros(2, lay.operand_rows, lay.o_width, dtype=torch.float64)
    writes = torch.zeros_like(out, dtype=torch.int64)
    slots = torch.arange(((lay.row_tiles * 256 + THREADS - 1) // THREADS) * THREADS)
    tile, t, src_lane, e, real = ad.split_k_sum(slots, WAVES, lay.row_tiles)
    for task in tasks:
        n0, part, group = k2a.woa_task(lay, task)
        codes_at, scales_at, width = k2a.woa_operand(lay, group)
        assert width == scratch.k
        lds = task_accumulators(weight, scratch.at(codes_at, scales_at), lay.row_tiles, task,
                                lambda task, wave: (n0, k2a.woa_steps(part, wave), part))
        total = sum(lds[ad.lds_acc_slot(w, t, src_lane, e, lay.row_tiles)] for w in range(WAVES))
        i, j = ad.result_lane(src_lane, e)
        token = t * 16 + j
        keep = real & (token < m)
        out[part, token[keep], (n0 + i)[keep]] = total[keep]
        writes[part].index_put_((token[keep], (n0 + i)[keep]), torch.ones_like(token[keep]), accumulate=True)
    columns = torch.cat([torch.arange(n, n + 32) for n in (0, lay.o_width // 2)])
    assert writes[:, :m, columns].eq(1).all() and writes.sum() == 2 * m * len(columns)
    want = torch.cat([rmath.fp8_gemv(xo_codes[:, g * GROUP_K:(g + 1) * GROUP_K], xo_scales[:, g * 128:(g + 1) * 128],
                                     plain[g * 1024:(g + 1) * 1024], scales[g * 8:(g + 1) * 8], GROUP_K)
                      for g in range(lay.groups)], dim=1).double()
    torch.testing.assert_close(out[0, :m, columns] + out[1, :m, columns], want[:, columns], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("shuffled", [True, False])
def test_wo_b_pair_slots_push_each_bf16_pair_once_and_pad_tokens_as_zeros(shuffled):
    m, lay = 3, K2Layout(8, 4, 1024, 4)
    plain, scales, _, _ = problem(H, lay.o_width, m, seed=7)
    z_codes, z_scales = _activations(m, lay.o_width, seed=8)
    weight = Fp8Weight(plain, scales, lay.o_width, pad=256, shuffled=shuffled)
    scratch = Mxfp8Scratch(z_codes, z_scales, m, lay.operand_rows, lay.o_width)
    want = rmath.fp8_gemv(z_codes, z_scales, plain, scales, lay.o_width).to(torch.bfloat16)
    row_tiles = lay.row_tiles
    for task in (0, 1, 55, 56, 447):
        lds = task_accumulators(weight, scratch, row_tiles, task,
                                lambda task, wave: (task * 16, k2a.wob_steps(lay, wave), 0))
        pushed = {}
        for index in range(((row_tiles * 128 + THREADS - 1) // THREADS) * THREADS):
            t, src_lane, e0, real = k2a.wob_pair(index, row_tiles)
            t = min(t, row_tiles - 1)
            pair = [sum(lds[ad.lds_acc_slot(w, t, src_lane, e0 + d, row_tiles)] for w in range(WAVES))
                    for d in range(2)]
            token, col = k2a.wob_pair_target(task, src_lane, e0, t)
            if real and token < lay.rows:
                assert (token, col) not in pushed
                pushed[(token, col)] = [float(v) if token < m else 0.0 for v in pair]
        assert sorted(pushed) == [(token, col) for token in range(lay.rows) for col in range(task * 16, task * 16 + 16, 2)]
        for (token, col), (lo, hi) in pushed.items():
            got = torch.tensor([lo, hi]).to(torch.bfloat16)
            expected = want[token, col:col + 2] if token < m else torch.zeros(2, dtype=torch.bfloat16)
            torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-6)


def test_s2_lanes_cover_each_head_and_dim_once_and_records_stay_inside():
    heads, slices = zip(*(k2a.s2_lane(tid) for tid in range(THREADS)))
    assert sorted(set(heads)) == list(range(16)) and [heads.count(h) for h in range(16)] == [32] * 16
    data, scales = 1000, 5000
    pieces = [k2a.record_piece(data, s) - data for s in range(32)]
    assert pieces[:28] == [16 * s for s in range(28)] and pieces[28:] == [448 + 32 * i for i in range(4)]
    assert all(p % 16 == 0 and p + 32 <= KV_DATA for p in pieces)  # two 16-byte loads inside the 576
    codes = [k2a.record_code(scales, s) - scales for s in range(32)]
    assert codes[:28] == [s // 4 for s in range(28)] and set(codes[28:]) == {6}
    assert max(codes) < KV_SCALES - 1  # the 7 codes, never the pad byte


def _within(offsets: list[int], low: int, high: int) -> None:
    assert low <= min(offsets) and max(offsets) < high, (min(offsets), max(offsets), low, high)


@pytest.mark.parametrize("lay", LAYOUTS, ids=_id)
def test_every_k2_access_stays_in_its_region(lay):
    rows, last = lay.rows, lay.rows - 1
    heads, o_width = lay.heads, lay.o_width
    # the key table (i32 region) and the attention partials (f32)
    _within([lay.key_slots + last * lay.keys + lay.keys - 1], lay.key_slots, lay.key_counts)
    _within([lay.key_counts + 2 * last + 1], lay.key_counts, lay.i32_words)
    _within([lay.attn_ml_at(lay.tasks(2) - 1, 1, 15)], lay.attn_ml, lay.attn_acc)
    _within([lay.attn_acc_at(lay.tasks(2) - 1, 15, 511)], lay.attn_acc, lay.woa_raw)
    first = (last * lay.head_tiles + (heads - 1) // 16) * lay.chunks  # the merge's last chunk read
    _within([lay.attn_acc_at(first + lay.chunks - 1, (heads - 1) % 16, 504) + 7], lay.attn_acc, lay.woa_raw)
    _within([k2a.q_chunk(lay, last, heads - 1, 31) + 1], 0, rows * heads * 512 // 8)
    # the MXFP8 operand rows (byte region), written by the merge, z quant and the seam
    codes, scales = k2a.xo_row(lay, last, heads - 1)
    _within([codes + 511], lay.xo_codes, lay.xo_scales)
    _within([scales + 15], lay.xo_scales, lay.z_codes)
    codes, scales = k2a.z_row(lay, last)
    _within([codes + o_width - 1], lay.z_codes, lay.z_scales)
    _within([scales + o_width // 32 - 1], lay.z_scales, lay.partial)
    _within([ad.mx_code_offset(lay.ffn_codes, last, H - 1, H)], lay.ffn_codes, lay.ffn_scales)
    _within([ad.mx_scale_offset(lay.ffn_scales, last, H // 32 - 1, H)], lay.ffn_scales, lay.bytes)
    # the GEMVs' operand reads: every task, wave, step, lane and token of whole 16-token tiles
    lanes = torch.arange(64)
    tokens = torch.arange(lay.operand_rows)[:, None]
    woa_codes, woa_scales, woa_w = [], [], []
    for task in range(lay.tasks(4)):
        n0, part, group = k2a.woa_task(lay, task)
        base, scale_base, width = k2a.woa_operand(lay, group)
        for wave in range(WAVES):
            for step, _ in k2a.woa_steps(part, wave):
                low, high = ad.operand_pieces(step, lanes)
                woa_codes += [int(ad.mx_code_offset(base, tokens, high, width).max()) + 15,
                              int(ad.mx_code_offset(base, tokens, low, width).min())]
                woa_scales.append(int(ad.mx_scale_offset(scale_base, tokens, ad.operand_block(step, lanes), width).max()))
                row = n0 + 15
                woa_w.append(int(ad.row_major_offset(row, high.max(), GROUP_K + 256)) + 15)
                woa_w.append(int(ad.preshuffled_offset(row, high.max(), GROUP_K)) + 15)
                assert step < GROUP_K // 128
    _within(woa_codes, lay.xo_codes, lay.xo_scales)
    _within(woa_scales, lay.xo_scales, lay.z_codes)
    _within(woa_w[0::2], 0, o_width * (GROUP_K + 256))
    _within(woa_w[1::2], 0, o_width * GROUP_K)
    z_codes = []
    for wave in range(WAVES):
        for step, _ in k2a.wob_steps(lay, wave):
            low, high = ad.operand_pieces(step, lanes)
            z_codes.append(int(ad.mx_code_offset(lay.z_codes, tokens, high, o_width).max()) + 15)
            assert int(ad.preshuffled_offset(H - 1, high.max(), o_width)) + 15 < H * o_width
    _within(z_codes, lay.z_codes, lay.z_scales)
    # wo_a's f32 halves and the seam's partials
    _within([lay.woa_raw + (lay.rows + last) * o_width + o_width - 1], lay.woa_raw, lay.partials)
    _within([lay.partials + (last * 56 + 55) * 25 + 24], lay.partials, lay.f32_words)
    # the work buffer holds the three regions, each starting aligned
    assert lay.i32_at == 4 * lay.f32_words and lay.u8_at % 256 == 0
    assert lay.u8_at + lay.bytes == 4 * lay.work_words
    # the peer buffer: each pair index of both halves inside the mailbox
    half_words = lay.half_bytes // 8
    if lay.two_hop:
        top = max(lay.rs_pair(lay.tp - 1, last, lay.owned_cols - 2), lay.ag_pair(last, H - 2))
    else:
        top = lay.part_pair(lay.tp - 1, last, H - 2)
    _within([half_words + top // 8], 0, lay.peer_bytes // 8)


def test_a_record_past_its_cache_reads_zeros_not_another_buffer():
    """Records are read through the cache's own buffer resource: a slot past the cache's pages
    gives offsets past its size, which the hardware returns as 0 (_dsl.flat_view)."""
    block, stride, pages = 64, 64 * 584, 4
    data, _ = ad.kv_offsets(pages * block + 5, block, stride)
    assert k2a.record_piece(data, 0) >= pages * stride
