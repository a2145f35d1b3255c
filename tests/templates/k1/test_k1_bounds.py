"""Every GEMV buffer access of K1 stays inside its buffer, for every bucket: the largest byte
each access can touch, computed over all tasks, waves, steps, lanes and row tiles with the
addressing functions the kernel traces (addressing.py), against the buffer's size in the
contract (K1Layout for the scratch, the weight shapes vLLM passes). Buffer resources carry real
sizes too (_dsl.flat_view), so a read past the end would read 0 rather than fault, but K1 must
not rely on that (buckets 1-8 read up to 105 KB past work_u8)."""

from __future__ import annotations

import pytest
import torch

from mono_jit.spec import STANDARD_MAX_TOKENS
from mono_jit.templates import addressing as ad
from mono_jit.templates.k1 import addressing as k1ad
from mono_jit.deepseek_v4 import Q_LORA
from mono_jit.templates.geometry import CTAS, WAVES
from mono_jit.templates.k1.layout import QKV, S3_TILES, K1Layout

H = 7168
LANES = torch.arange(64)
PIECE_END = 16  # each operand piece is a 16-byte load
ROW_PAD = 256  # VLLM_ROCM_FP8_PADDING's extra bytes a row


def _gemv_work(lay: K1Layout, stage: int):
    """(weight rows [64], step, lane-group block) for every wave-step of S3 or S5, as tensors."""
    rows, steps = [], []
    for task in range(lay.tasks(3) if stage == 3 else lay.tasks(5)):
        for wave in range(WAVES):
            if stage == 3:
                n0, part = k1ad.s3_task(task)
                wave_steps = [step for step, _ in k1ad.s3_steps(part, wave)]
            else:
                n0, first = k1ad.s5_tile(task, wave)
                wave_steps = [first + s for s in range(k1ad.S5_STEPS)]
            for step in wave_steps:
                rows.append(n0 + ad.operand_row(LANES))
                steps.append(torch.full((64,), step))
    return torch.stack(rows), torch.stack(steps)


def _operand_extent(lay: K1Layout, stage: int) -> dict[str, int]:
    """One past the largest byte each access of the stage reads or writes."""
    k, n = (H, QKV) if stage == 3 else (Q_LORA, lay.q_width)
    codes, scales = (lay.x_codes, lay.x_scales) if stage == 3 else (lay.qr_codes, lay.qr_scales)
    rows, steps = _gemv_work(lay, stage)
    low, high = ad.operand_pieces(steps, LANES)
    blocks = ad.operand_block(steps, LANES)
    extent = {
        "weight row-major": int(ad.row_major_offset(rows, torch.maximum(low, high), k + ROW_PAD).max()) + PIECE_END,
        "weight preshuffled": int(torch.maximum(ad.preshuffled_offset(rows, low, k),
                                                ad.preshuffled_offset(rows, high, k)).max()) + PIECE_END,
        "weight K": int(torch.maximum(low, high).max()) + PIECE_END,
        "weight scale": int(ad.block_scale_index(rows, steps, k).max()) + 1,
        "codes": 0, "scales": 0,
    }
    for t in range(lay.row_tiles):
        token = ad.operand_token(t, LANES)
        extent["codes"] = max(extent["codes"], int(ad.mx_code_offset(codes, token, torch.maximum(low, high), k).max())
                              + PIECE_END)
        extent["scales"] = max(extent["scales"], int(ad.mx_scale_offset(scales, token, blocks, k).max()) + 1)
    extent["n"], extent["k"] = n, k
    return extent


@pytest.mark.parametrize("rows", STANDARD_MAX_TOKENS)
@pytest.mark.parametrize("stage", [3, 5])
def test_gemv_reads_stay_inside_their_buffers(rows, stage):
    lay = K1Layout(8, rows)
    e = _operand_extent(lay, stage)
    n, k = e["n"], e["k"]
    assert e["weight K"] <= k, "a weight row is read past K (into vLLM's 0x7F padding)"
    assert e["weight row-major"] <= n * (k + ROW_PAD)
    assert e["weight preshuffled"] <= n * k
    assert e["weight scale"] <= (n // 128) * (k // 128)
    codes_end, scales_end = (lay.x_scales, lay.qr_codes) if stage == 3 else (lay.qr_scales, lay.bytes)
    assert e["codes"] <= codes_end, f"MXFP8 codes read {e['codes'] - codes_end} bytes past their region"
    assert e["scales"] <= scales_end <= lay.bytes


@pytest.mark.parametrize("rows", STANDARD_MAX_TOKENS)
def test_gemv_stores_stay_inside_their_scratch_regions(rows):
    """S3 and S5 store token < m only; at m = rows every store lands inside its f32 region."""
    lay = K1Layout(8, rows)
    for waves_per_tile, tasks, width, first, end, n0_of in (
            (WAVES, lay.tasks(3), QKV, lay.qkv_raw, lay.q_raw,
             lambda task: (k1ad.s3_task(task)[0], k1ad.s3_task(task)[1] * rows * QKV)),
            (k1ad.S5_WAVES_PER_TILE, lay.tasks(5), lay.q_width, lay.q_raw, lay.f32_words,
             lambda task: (task * 32, 0))):
        tiles = WAVES // waves_per_tile
        slots = torch.arange(tiles * lay.row_tiles * 256)
        tile, t, src_lane, e, real = ad.split_k_sum(slots, waves_per_tile, lay.row_tiles)
        row, column = ad.result_lane(src_lane, e)
        token = t * 16 + column
        stored = real & (token < rows)
        largest = 0
        for task in range(tasks):
            n0, base = n0_of(task)
            offset = first + base + token * width + n0 + tile * 16 + row
            largest = max(largest, int(offset[stored].max()))
        assert largest < end


def test_the_bounds_test_sees_the_reads_the_review_found():
    """Before operand rows were padded to whole tiles, bucket 1's S3 read x codes up to
    114,688 bytes into a 8,976-byte work_u8; the same arithmetic over an unpadded
    layout must say so."""
    lay = K1Layout(8, 1)
    e = _operand_extent(lay, 3)
    unpadded_bytes = 1 * (H + H // 32 + Q_LORA + Q_LORA // 32)
    assert e["codes"] == lay.operand_rows * H == 114_688 > unpadded_bytes


def test_every_s3_and_s5_task_is_a_cta():
    assert K1Layout(8, 1).tasks(3) == 2 * S3_TILES == CTAS and K1Layout(8, 1).tasks(5) == CTAS
