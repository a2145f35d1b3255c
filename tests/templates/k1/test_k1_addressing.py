"""K1's index arithmetic (templates/addressing.py and templates/k1/addressing.py, the same functions
the kernel's address code is traced from) run on the CPU: the two GEMV stages are emulated MFMA by MFMA through
those functions, with operand bytes gathered from flat buffers at the offsets the kernel loads,
and multiplied by an independent model of the scaled MFMA (tests/support/mfma_model.py, tables from
vLLM's in-tree mono kernels, AITER and Triton). A wrong lane map, piece offset, scale index,
task decode or split-K slot shows up as wrong or missing outputs; so does the operand layout an
earlier K1 used (32 contiguous K a lane), which a test here keeps failing on purpose."""

from __future__ import annotations

import pytest
import torch
from gemv_model import BYTES16, Fp8Weight, Mxfp8Scratch, emulate_gemv, problem

from mono_jit.templates import addressing as ad
from mono_jit.templates.k1 import addressing as k1ad
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.geometry import CTAS, WAVES
from mono_jit.templates.k1.layout import QKV, S3_TILES, K1Layout

H = 7168


def _s3(m, shuffled, seed=3):
    plain, scales, x_codes, x_scales = problem(QKV, H, m, seed)
    weight = Fp8Weight(plain, scales, H, pad=256, shuffled=shuffled)
    lay = K1Layout(8, m)
    acts = Mxfp8Scratch(x_codes, x_scales, m, lay.operand_rows, H)

    def wave_work(task, wave):
        n0, part = k1ad.s3_task(task)
        return n0, k1ad.s3_steps(part, wave), part

    out, writes = emulate_gemv(weight, acts, m, lay.row_tiles, lay.tasks(3), wave_work, WAVES, QKV, parts=2)
    want = rmath.fp8_gemv(x_codes, x_scales, plain, scales, H).double()
    return out, writes, want


def _s5(m, shuffled, seed=4, emulate_tasks=32):
    q_width = 16 * 512
    plain, scales, x_codes, x_scales = problem(q_width, 1536, m, seed)
    weight = Fp8Weight(plain, scales, 1536, pad=256, shuffled=shuffled)
    lay = K1Layout(8, m)
    assert lay.tasks(5) == CTAS
    acts = Mxfp8Scratch(x_codes, x_scales, m, lay.operand_rows, 1536)

    def wave_work(task, wave):
        row, first = k1ad.s5_tile(task, wave)
        return row, [(first + s, None) for s in range(k1ad.S5_STEPS)], 0

    out, writes = emulate_gemv(weight, acts, m, lay.row_tiles, emulate_tasks, wave_work, k1ad.S5_WAVES_PER_TILE,
                               q_width)
    want = rmath.fp8_gemv(x_codes, x_scales, plain, scales, 1536).double()
    return out, writes, want


@pytest.mark.slow
@pytest.mark.parametrize("shuffled", [False, True])
def test_s3_through_the_kernels_addressing_and_the_mfma_model_matches_the_reference(shuffled):
    m = 5
    out, writes, want = _s3(m, shuffled)
    assert writes[:, :m].eq(1).all() and writes[:, m:].eq(0).all(), "each output once per K half"
    torch.testing.assert_close(out[0, :m] + out[1, :m], want, rtol=1e-6, atol=1e-5)  # f32 reference


@pytest.mark.parametrize("shuffled", [False, True])
def test_s5_through_the_kernels_addressing_and_the_mfma_model_matches_the_reference(shuffled):
    m, covered = 3, 32 * 32  # the first 32 tasks (two heads) keep the emulation quick
    out, writes, want = _s5(m, shuffled)
    assert writes[0, :m, :covered].eq(1).all() and writes[0, :, covered:].eq(0).all()
    torch.testing.assert_close(out[0, :m, :covered], want[:, :covered], rtol=1e-6, atol=1e-5)


def test_the_mfma_model_rejects_the_contiguous_32_layout(monkeypatch):
    """The layout K1 had before (lane group g: K 32 g .. 32 g + 31 of the step, with block g's
    scale) puts the activations' per-32 scales on the wrong K under the hardware's layout; the
    model must see that (about 28 % relative error on realistic activations)."""
    monkeypatch.setattr(ad, "operand_pieces", lambda step, lane: (step * 128 + (lane // 16) * 32,
                                                                   step * 128 + (lane // 16) * 32 + 16))
    m = 2
    out, _, want = _s5(m, shuffled=False, emulate_tasks=4)
    got, expected = out[0, :m, :128], want[:, :128]
    assert (got - expected).norm() / expected.norm() > 0.05


def test_every_s5_task_owns_two_distinct_tiles_and_all_k_steps():
    seen = {}
    for task in range(CTAS):
        for wave in range(WAVES):
            row, first = k1ad.s5_tile(task, wave)
            for s in range(k1ad.S5_STEPS):
                seen.setdefault(row, []).append(first + s)
    assert sorted(seen) == list(range(0, 16 * 512, 16))
    assert all(sorted(steps) == list(range(12)) for steps in seen.values())


def test_s3_steps_partition_each_k_half():
    for part in range(2):
        kept = [step for wave in range(WAVES) for step, keep in k1ad.s3_steps(part, wave) if keep in (None, True)]
        assert sorted(kept) == list(range(part * 28, part * 28 + 28))
    assert sorted({k1ad.s3_task(t) for t in range(2 * S3_TILES)}) == sorted(
        (n0, p) for n0 in range(0, QKV, 16) for p in range(2))


def test_preshuffled_offset_matches_the_reference_layout():
    n, k = 64, 7168
    w = torch.randint(0, 256, (n, k), dtype=torch.uint8)
    flat = rmath.preshuffle_16x16(w).flatten()
    rows = torch.arange(n)[:, None]
    k0 = torch.arange(0, k, 16)[None, :]
    offsets = ad.preshuffled_offset(rows, k0, k)
    got = flat[offsets[..., None] + BYTES16]
    assert torch.equal(got.flatten(1), w)


def test_kv_offsets_match_the_reference_insert():
    _, records = rmath.kv_dequantize, rmath.kv_record(torch.randn(3, 512).to(torch.bfloat16).float())
    block, stride = 16, 16 * 584 + 32
    cache = torch.zeros(4 * stride, dtype=torch.uint8)
    slots = [3, 17, 63]
    rmath.kv_insert(cache, records, torch.tensor(slots), stride, block)
    for record, slot in zip(records, slots):
        data, scales = ad.kv_offsets(slot, block, stride)
        assert torch.equal(cache[data:data + 576], record[:576])
        assert torch.equal(cache[scales:scales + 7], record[576:583])
