"""K1's index arithmetic (templates/k1/addressing.py, the same functions the kernel's address
code is traced from) run on the CPU: the two GEMV stages are emulated MFMA by MFMA, lane by
lane, through those functions and compared with the reference; the preshuffle and KV-record
offsets are checked against the reference layouts. A wrong lane map, task decode or split-K
slot shows up here as wrong or missing outputs."""

from __future__ import annotations

import pytest
import torch

from mono_jit.templates.k1 import addressing as ad
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates.k1.layout import CTAS, QKV, S3_TILES, THREADS, WAVES, K1Layout

H = 7168
LANES = torch.arange(64)
BYTES16 = torch.arange(16)


class Fp8Weight:
    """A weight as the kernel sees it: flat bytes, row-major with a stride or preshuffled."""

    def __init__(self, plain: torch.Tensor, scales: torch.Tensor, k: int, pad: int, shuffled: bool):
        n = plain.shape[0]
        self.k, self.scales, self.shuffled, self.stride = k, scales.flatten(), shuffled, k + pad
        if shuffled:
            self.flat = ref.preshuffle_16x16(plain).flatten()
        else:
            self.flat = torch.cat([plain, torch.full((n, pad), 0x7F, dtype=torch.uint8)], dim=1).flatten()

    def operand(self, rows: torch.Tensor, k0: torch.Tensor) -> torch.Tensor:
        """[64, 32] f32 values of each lane's 32 bytes."""
        if self.shuffled:
            lo, hi = ad.preshuffled_offset(rows, k0, self.k), ad.preshuffled_offset(rows, k0 + 16, self.k)
        else:
            lo = rows * self.stride + k0
            hi = lo + 16
        index = torch.cat([lo[:, None] + BYTES16, hi[:, None] + BYTES16], dim=1)
        return ref.e4m3_value(self.flat[index])


# The hardware, modelled independently of addressing.py: FlyDSL's CDNA4 MFMA_Scale atom
# (lib/Dialect/FlyROCDL/CDNA4/MmaAtom.cpp) lays operand lane l out as row l % 16, K values
# 32 (l / 16) .. + 31, and result lane l element e as D[4 (l / 16) + e, l % 16].
HW_ROW, HW_K = LANES % 16, (LANES // 16) * 32
HW_D_ROW, HW_D_COL = (LANES[:, None] // 16) * 4 + torch.arange(4)[None, :], (LANES % 16)[:, None].expand(64, 4)


def _lane_tile(values: torch.Tensor) -> torch.Tensor:
    """The 16 x 128 operand the hardware forms from per-lane [64, 32] values."""
    tile = torch.zeros(16, 128, dtype=torch.float64)
    tile[HW_ROW[:, None], HW_K[:, None] + torch.arange(32)] = values.double()
    return tile


def emulate_gemv(weight: Fp8Weight, x_codes, x_scales, k, m, row_tiles, tasks, wave_work, waves_per_tile,
                 out_width, parts=1):
    """The kernel's GEMV stage: per task and wave, MFMAs over its K steps; per task, the split-K
    sum of its waves through the LDS slots; outputs [parts, tokens, out_width] and write counts."""
    tokens = row_tiles * 16
    out = torch.zeros(parts, tokens, out_width, dtype=torch.float64)
    writes = torch.zeros(parts, tokens, out_width, dtype=torch.int64)
    x = ref.e4m3_value(x_codes)
    row_in_tile = ad.operand_lane(LANES)[0]
    tiles = WAVES // waves_per_tile
    slots = torch.arange(((tiles * row_tiles * 256 + THREADS - 1) // THREADS) * THREADS)
    tile, t, src_lane, e, real = ad.split_k_sum(slots, waves_per_tile, row_tiles)
    for task in range(tasks):
        lds = torch.zeros(WAVES * row_tiles * 64 * 4, dtype=torch.float64)
        for wave in range(WAVES):
            w_row, steps, part = wave_work(task, wave)
            rows = w_row + row_in_tile
            accs = torch.zeros(row_tiles, 16, 16, dtype=torch.float64)
            for step, keep in steps:
                k0 = ad.step_k(step, LANES)
                scale_a = weight.scales[ad.block_scale_index(rows, step, weight.k)]
                a_tile = _lane_tile(weight.operand(rows, k0) * ref.e8m0_value(scale_a)[:, None])
                for rt in range(row_tiles):
                    token = rt * 16 + row_in_tile
                    b = x[token[:, None], k0[:, None] + torch.arange(32)] * ref.e8m0_value(x_scales[token, k0 // 32])[:, None]
                    if keep is None or keep:
                        accs[rt] += a_tile @ _lane_tile(b).T  # D[weight row, token]
            for rt in range(row_tiles):
                lds[ad.lds_acc_slot(wave, rt, LANES[:, None], torch.arange(4)[None, :], row_tiles)] = \
                    accs[rt][HW_D_ROW, HW_D_COL]
        n0, _, part = wave_work(task, 0)
        total = sum(lds[ad.lds_acc_slot(tile * waves_per_tile + w, t, src_lane, e, row_tiles).clamp_max(lds.numel() - 1)]
                    for w in range(waves_per_tile))
        i, j = ad.result_lane(src_lane, e)
        token = t * 16 + j
        keep = real & (token < m)
        column = n0 + tile * 16 + i
        out[part, token[keep], column[keep]] = total[keep]
        writes[part].index_put_((token[keep], column[keep]), torch.ones_like(token[keep]), accumulate=True)
    return out, writes


def _problem(n, k, m, seed):
    g = torch.Generator().manual_seed(seed)
    plain = (torch.randn(n, k, generator=g) * 16).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.randint(118, 124, (n // 128, k // 128), generator=g, dtype=torch.uint8)
    x_codes, x_scales = ref.mxfp8_quantize(torch.randn(16, k, generator=g))  # a full row tile of tokens
    return plain, scales, x_codes, x_scales


@pytest.mark.parametrize("shuffled", [False, True])
def test_s3_emulated_through_the_kernels_addressing_matches_the_reference(shuffled):
    m = 5
    plain, scales, x_codes, x_scales = _problem(QKV, H, m, seed=3)
    weight = Fp8Weight(plain, scales, H, pad=256, shuffled=shuffled)

    def wave_work(task, wave):
        n0, part = ad.s3_task(task)
        return n0, ad.s3_steps(part, wave), part

    lay = K1Layout(8, m)
    out, writes = emulate_gemv(weight, x_codes, x_scales, H, m, lay.row_tiles, lay.s3_tasks, wave_work, WAVES,
                               QKV, parts=2)
    assert writes[:, :m].eq(1).all() and writes[:, m:].eq(0).all(), "each output once per K half"
    want = ref.fp8_gemv(x_codes[:m], x_scales[:m], plain, scales, H).double()
    torch.testing.assert_close(out[0, :m] + out[1, :m], want, rtol=1e-6, atol=1e-5)  # f32 reference


@pytest.mark.parametrize("shuffled", [False, True])
def test_s5_emulated_through_the_kernels_addressing_matches_the_reference(shuffled):
    m, q_width = 3, 16 * 512
    plain, scales, x_codes, x_scales = _problem(q_width, 1536, m, seed=4)
    weight = Fp8Weight(plain, scales, 1536, pad=256, shuffled=shuffled)

    def wave_work(task, wave):
        row, first = ad.s5_tile(task, wave)
        return row, [(first + s, None) for s in range(ad.S5_STEPS)], 0

    lay = K1Layout(8, m)
    assert lay.s5_tasks == CTAS
    emulate_tasks = 32  # the first 32 tasks (two heads) keep the emulation quick
    out, writes = emulate_gemv(weight, x_codes, x_scales, 1536, m, lay.row_tiles, emulate_tasks, wave_work,
                               ad.S5_WAVES_PER_TILE, q_width)
    covered = emulate_tasks * 32
    assert writes[0, :m, :covered].eq(1).all() and writes[0, :, covered:].eq(0).all()
    want = ref.fp8_gemv(x_codes[:m], x_scales[:m], plain, scales, 1536).double()
    torch.testing.assert_close(out[0, :m, :covered], want[:, :covered], rtol=1e-6, atol=1e-5)


def test_every_s5_task_owns_two_distinct_tiles_and_all_k_steps():
    seen = {}
    for task in range(CTAS):
        for wave in range(WAVES):
            row, first = ad.s5_tile(task, wave)
            for s in range(ad.S5_STEPS):
                seen.setdefault(row, []).append(first + s)
    assert sorted(seen) == list(range(0, 16 * 512, 16))
    assert all(sorted(steps) == list(range(12)) for steps in seen.values())


def test_s3_steps_partition_each_k_half():
    for part in range(2):
        kept = [step for wave in range(WAVES) for step, keep in ad.s3_steps(part, wave) if keep in (None, True)]
        assert sorted(kept) == list(range(part * 28, part * 28 + 28))
    assert sorted({ad.s3_task(t) for t in range(2 * S3_TILES)}) == sorted(
        (n0, p) for n0 in range(0, QKV, 16) for p in range(2))


def test_preshuffled_offset_matches_the_reference_layout():
    n, k = 64, 7168
    w = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    flat = ref.preshuffle_16x16(w).flatten()
    rows = torch.arange(n)[:, None]
    k0 = torch.arange(0, k, 16)[None, :]
    offsets = ad.preshuffled_offset(rows, k0, k)
    got = flat[offsets[..., None] + BYTES16]
    assert torch.equal(got.flatten(1), w)


def test_kv_offsets_match_the_reference_insert():
    _, records = ref.kv_dequantize, ref.kv_record(torch.randn(3, 512).to(torch.bfloat16).float())
    block, stride = 16, 16 * 584 + 32
    cache = torch.zeros(4 * stride, dtype=torch.uint8)
    slots = [3, 17, 63]
    ref.kv_insert(cache, records, torch.tensor(slots), stride, block)
    for record, slot in zip(records, slots):
        data, scales = ad.kv_offsets(slot, block, stride)
        assert torch.equal(cache[data:data + 576], record[:576])
        assert torch.equal(cache[scales:scales + 7], record[576:583])
