"""The scaled-MFMA GEMVs of the persistent kernels emulated on the CPU, MFMA by MFMA, through the
kernels' own index functions (k1/addressing.py, k2/attention_addressing.py) and an independent model of
the MFMA (tests/support/mfma_model.py): operand bytes gathered from flat buffers at the offsets the
kernel loads, per-wave accumulators parked in LDS slots as the kernel parks them."""

from __future__ import annotations

import mfma_model
import torch

from mono_jit.templates import addressing as ad
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.geometry import THREADS, WAVES

LANES = torch.arange(64)
BYTES16 = torch.arange(16)


class Fp8Weight:
    """A weight as the kernel sees it: flat bytes, row-major with a stride or preshuffled."""

    def __init__(self, plain: torch.Tensor, scales: torch.Tensor, k: int, pad: int, shuffled: bool):
        n = plain.shape[0]
        self.k, self.scales, self.shuffled, self.stride = k, scales.flatten(), shuffled, k + pad
        if shuffled:
            self.flat = rmath.preshuffle_16x16(plain).flatten()
        else:
            self.flat = torch.cat([plain, torch.full((n, pad), 0x7F, dtype=torch.uint8)], dim=1).flatten()

    def offset(self, rows: torch.Tensor, k0: torch.Tensor) -> torch.Tensor:
        if self.shuffled:
            return ad.preshuffled_offset(rows, k0, self.k)
        return ad.row_major_offset(rows, k0, self.stride)


def _pieces(flat: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """[64, 32] bytes: each lane's 16 bytes at `low` then its 16 at `high` (as kernel._operand)."""
    return torch.cat([flat[low[:, None] + BYTES16], flat[high[:, None] + BYTES16]], dim=1)


class Mxfp8Scratch:
    """MXFP8 rows in a flat byte scratch at the layout's offsets; rows past m hold 0x7F (NaN)
    garbage, as never-written scratch may. `at(base_codes, base_scales)` reads the same rows
    from other bases (a group's columns of wider rows, as K2's wo_a does)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, m: int, operand_rows: int, k: int):
        self.k, self.codes_at, self.scales_at = k, 0, operand_rows * k
        self.flat = torch.full((operand_rows * (k + k // 32),), 0x7F, dtype=torch.uint8)
        self.flat[: m * k] = codes[:m].flatten()
        self.flat[self.scales_at: self.scales_at + m * (k // 32)] = scales[:m].flatten()

    def at(self, codes_at: int, scales_at: int) -> "Mxfp8Scratch":
        view = object.__new__(Mxfp8Scratch)
        view.k, view.codes_at, view.scales_at, view.flat = self.k, codes_at, scales_at, self.flat
        return view

    def operand(self, token, step):
        low, high = ad.operand_pieces(step, LANES)
        codes = _pieces(self.flat, ad.mx_code_offset(self.codes_at, token, low, self.k),
                        ad.mx_code_offset(self.codes_at, token, high, self.k))
        scales = self.flat[ad.mx_scale_offset(self.scales_at, token, ad.operand_block(step, LANES), self.k)]
        return codes, scales


def task_accumulators(weight: Fp8Weight, acts: Mxfp8Scratch, row_tiles: int, task: int, wave_work) -> torch.Tensor:
    """One GEMV task's LDS after its waves park their accumulators (_gemv.gemv_steps, then the
    kernel's lds_acc_slot stores): MFMAs over each wave's K steps, a dropped step (keep False)
    computed and not kept."""
    lds = torch.zeros(WAVES * row_tiles * 64 * 4, dtype=torch.float64)
    for wave in range(WAVES):
        w_row, steps, _ = wave_work(task, wave)
        rows = w_row + ad.operand_row(LANES)
        accs = [torch.zeros(64, 4, dtype=torch.float64) for _ in range(row_tiles)]
        for step, keep in steps:
            low, high = ad.operand_pieces(step, LANES)
            a = _pieces(weight.flat, weight.offset(rows, low), weight.offset(rows, high))
            scale_a = weight.scales[ad.block_scale_index(rows, step, weight.k)]
            for rt in range(row_tiles):
                b, scale_b = acts.operand(ad.operand_token(rt, LANES), step)
                acc = mfma_model.mfma(a, scale_a, b, scale_b, accs[rt])
                accs[rt] = acc if keep is None or keep else accs[rt]
        for rt in range(row_tiles):
            lds[ad.lds_acc_slot(wave, rt, LANES[:, None], torch.arange(4)[None, :], row_tiles)] = accs[rt]
    return lds


def emulate_gemv(weight: Fp8Weight, acts, m, row_tiles, tasks, wave_work, waves_per_tile, out_width, parts=1):
    """The kernel's GEMV stage: per task and wave, MFMAs over its K steps; per task, the split-K
    sum of its waves through the LDS slots (_gemv.gemv_reduce); outputs [parts, tokens,
    out_width] and write counts. `acts` is an Mxfp8Scratch, or a function of the task giving one."""
    tokens = row_tiles * 16
    out = torch.zeros(parts, tokens, out_width, dtype=torch.float64)
    writes = torch.zeros(parts, tokens, out_width, dtype=torch.int64)
    tiles = WAVES // waves_per_tile
    slots = torch.arange(((tiles * row_tiles * 256 + THREADS - 1) // THREADS) * THREADS)
    tile, t, src_lane, e, real = ad.split_k_sum(slots, waves_per_tile, row_tiles)
    for task in range(tasks):
        lds = task_accumulators(weight, acts(task) if callable(acts) else acts, row_tiles, task, wave_work)
        n0, _, part = wave_work(task, 0)
        last = lds.numel() - 1
        total = sum(lds[ad.lds_acc_slot(tile * waves_per_tile + w, t, src_lane, e, row_tiles).clamp_max(last)]
                    for w in range(waves_per_tile))
        i, j = ad.result_lane(src_lane, e)
        token = t * 16 + j
        keep = real & (token < m)
        column = n0 + tile * 16 + i
        out[part, token[keep], column[keep]] = total[keep]
        writes[part].index_put_((token[keep], column[keep]), torch.ones_like(token[keep]), accumulate=True)
    return out, writes


def problem(n, k, m, seed):
    """A weight with per-block codes and activations whose per-32 codes differ inside every
    128-step (each 32-block scaled by its own power of two), the case a misplaced scale breaks."""
    g = torch.Generator().manual_seed(seed)
    plain = (torch.randn(n, k, generator=g) * 16).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.randint(118, 124, (n // 128, k // 128), generator=g, dtype=torch.uint8)
    block_scale = torch.exp2(torch.randint(-6, 7, (m, k // 32), generator=g).float())
    x = torch.randn(m, k, generator=g) * block_scale.repeat_interleave(32, dim=1)
    x_codes, x_scales = rmath.mxfp8_quantize(x)
    assert (x_scales.view(m, -1, 4).amax(-1) != x_scales.view(m, -1, 4).amin(-1)).float().mean() > 0.9
    return plain, scales, x_codes, x_scales
