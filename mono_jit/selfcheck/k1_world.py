"""K1's world for checks of its code object: seeded weights and activations in vLLM's layouts
(fp8 weights as bytes, E8M0 block scales), one bucket's device buffers, a launch with them by
argument name (put in the order K1Template.arguments declares) and the comparison of everything
K1 writes with `reference.k1`.

`mono-jit selftest --emulate` and the test suite (on the emulator, and on a gfx950 where there
is one) share it, so the check a user runs is the one CI runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..deepseek_v4 import HIDDEN as H, Q_LORA, per_rank
from ..errors import MonoJitError
from ..templates.base import in_order
from ..spec import Spec
from ..templates import get
from ..templates.geometry import KV_DATA, KV_RECORD, KV_SCALES
from ..templates.k1 import reference as ref
from ..templates.reference_math import fp8_gemv, kv_dequantize, kv_read, mxfp8_quantize, preshuffle_16x16, seam_gate, sinkhorn
from ..templates.k1.layout import K1Layout


class Mismatch(MonoJitError, AssertionError):
    """An output of the kernel disagrees with its reference beyond the stated bound."""


BLOCK, PAGES = 64, 4
# 37440: the page's records rounded up to whole 576-byte data rows, as vLLM allocates
PAGE_STRIDE = -(-BLOCK * KV_RECORD // KV_DATA) * KV_DATA
SENTINEL = -3.0


def rope_table(positions: int, g: torch.Generator) -> torch.Tensor:
    theta = torch.rand(positions, 32, generator=g) * 6
    return torch.cat([torch.cos(theta), torch.sin(theta)], dim=1)


def random_weights(tp: int = 8, positions: int = 64, seed: int = 0, row_pad: int = 0) -> ref.K1Weights:
    """Weights whose GEMV outputs are O(1); row_pad bytes of 0x7F (NaN) pad each fp8 row, as
    VLLM_ROCM_FP8_PADDING does, so a kernel that reads past K shows it."""
    g = torch.Generator().manual_seed(seed)
    heads = per_rank(tp).heads

    def fp8(n: int, k: int) -> torch.Tensor:
        w = (torch.randn(n, k, generator=g) * 16).to(torch.float8_e4m3fn).view(torch.uint8)
        return torch.cat([w, torch.full((n, row_pad), 0x7F, dtype=torch.uint8)], dim=1)

    return ref.K1Weights(
        hc_fn=torch.randn(24, 4 * H, generator=g) * 0.01, hc_base=torch.randn(24, generator=g) * 0.1,
        hc_scale=torch.rand(3, generator=g) + 0.5,
        attn_norm=(1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16),
        w_qkv=fp8(2048, H), s_qkv=torch.randint(118, 122, (16, 56), generator=g, dtype=torch.uint8),
        q_norm=(1 + 0.2 * torch.randn(1536, generator=g)).to(torch.bfloat16),
        kv_norm=(1 + 0.2 * torch.randn(512, generator=g)).to(torch.bfloat16),
        w_qb=fp8(heads * 512, 1536), s_qb=torch.randint(118, 122, (heads * 4, 12), generator=g, dtype=torch.uint8),
        rope=rope_table(positions, g))


def random_activations(m: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """x, residual, post_mix, res_mix for m rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, H, generator=g).to(torch.bfloat16)
    residual = torch.randn(m, 4, H, generator=g).to(torch.bfloat16)
    post_mix = torch.rand(m, 4, 1, generator=g) * 2
    res_mix = sinkhorn(torch.randn(m, 4, 4, generator=g))
    return x, residual, post_mix, res_mix


@dataclass
class Step:
    m: int
    do_fold: int
    x: torch.Tensor
    residual: torch.Tensor
    post_mix: torch.Tensor
    res_mix: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor


class K1Run:
    """Device buffers of one K1 bucket (TP8) and the launcher that runs a step on them (its
    arguments positional, as FlyDSL's launcher takes them)."""

    def __init__(self, bucket: int, w: ref.K1Weights, *, row_pad: int, shuffled: bool, device: str,
                 launcher: Callable):
        if shuffled:  # what vLLM's ROCm attention may do to fused_wqa_wkv (prepare_attn_preshuffle)
            w = dataclasses.replace(w, w_qkv=preshuffle_16x16(w.w_qkv[:, :H].contiguous()), qkv_shuffled=True)
        self.lay, self.bucket, self.w, self.launcher = K1Layout(8, bucket), bucket, w, launcher
        self.names = tuple(a.name for a in get("k1").arguments(Spec(8, 4, 1024, bucket)))
        self.scalars = {"qkv_stride": H if shuffled else H + row_pad, "qkv_shuffled": int(w.qkv_shuffled),
                        "qb_stride": 1536 + row_pad, "qb_shuffled": int(w.qb_shuffled), "page_stride": PAGE_STRIDE,
                        "block_size": BLOCK}
        # K1Weights' tensors are named as K1's arguments
        self.weights = {f.name: value.to(device).flatten() for f in dataclasses.fields(w)
                        if isinstance(value := getattr(w, f.name), torch.Tensor)}

        def zeros(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        def sentinel(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.full((n,), SENTINEL, dtype=dtype, device=device)

        rows, bf16 = bucket, torch.bfloat16
        self.inputs = {"x": zeros(rows * H, bf16), "residual": zeros(rows * 4 * H, bf16), "post_mix": zeros(rows * 4),
                       "res_mix": zeros(rows * 16)}
        self.positions = zeros(rows, torch.int64)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.cache = torch.randint(0, 256, (PAGES * PAGE_STRIDE,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(7)).to(device)
        self.outputs = {"r": sentinel(rows * 4 * H, bf16), "post": sentinel(rows * 4), "comb": sentinel(rows * 16),
                        "x_norm": sentinel(rows * H, bf16), "qr": sentinel(rows * 1536, bf16),
                        "q": sentinel(rows * self.lay.q_width, bf16)}
        self.sync = zeros(self.lay.sync_words, torch.int32)
        self.work = {"work_f32": zeros(self.lay.f32_words), "work_u8": zeros(self.lay.bytes, torch.uint8)}

    def set_step(self, m: int, seed: int, do_fold: int) -> Step:
        """Random inputs for m rows, copied into the device buffers; even rows insert KV. The
        outputs go back to the sentinel, so rows an earlier step wrote never pass for this one's."""
        x, residual, post_mix, res_mix = random_activations(m, seed)
        positions = torch.randint(0, self.w.rope.shape[0], (m,), generator=torch.Generator().manual_seed(seed))
        slots = torch.tensor([(5 + 7 * i) % (PAGES * BLOCK) if i % 2 == 0 else -1 for i in range(m)])
        given = {"x": x, "residual": residual, "post_mix": post_mix, "res_mix": res_mix}
        pairs = [(self.inputs[name], value) for name, value in given.items()]
        for buffer, value in pairs + [(self.positions, positions), (self.slots, slots)]:
            buffer[: value.numel()].copy_(value.flatten())
        for out in self.outputs.values():
            out.fill_(SENTINEL)
        return Step(m, do_fold, x, residual, post_mix, res_mix, positions, slots)

    def arguments(self, step: Step) -> dict[str, Any]:
        """K1Template.arguments' names -> this step's values. On layer 0 (do_fold 0) x, post_mix
        and res_mix are unread (vLLM passes x in all three there): they go in empty, so a read of
        them is a null-pointer fault on the device and an error on the CPU."""
        inputs = dict(self.inputs)
        if not step.do_fold:
            unread = self.inputs["residual"].new_empty(0, dtype=torch.float32)
            inputs.update(x=unread, post_mix=unread, res_mix=unread)
        out = self.outputs
        return {**inputs, **self.weights, "positions": self.positions, "slot_mapping": self.slots,
                "kv_cache": self.cache, "r_out": out["r"], "post_out": out["post"], "comb_out": out["comb"],
                "x_norm": out["x_norm"], "qr_out": out["qr"], "q_out": out["q"], "sync": self.sync, **self.work,
                "m": step.m, "do_fold": step.do_fold, **self.scalars}

    def launch(self, step: Step) -> None:
        """The step's arguments, by name, in the template's order (a name it does not declare, or
        one it declares and the step lacks, is a KernargError naming it)."""
        self.launcher(*in_order("k1", self.names, self.arguments(step)))

    def check(self, step: Step, cache_before: torch.Tensor, cache_at: int = 0) -> dict[str, tuple[float, float]]:
        """Every output against reference.k1, rows past m untouched, the cache written only at
        the records of rows with a slot (pad bytes kept); raises Mismatch, else returns each
        output's mean error and its bound. `cache_before` holds the cache's bytes from byte
        `cache_at` on (a window of a cache too large to copy whole), the slots' records inside it."""
        m = step.m
        want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, bool(step.do_fold), self.w, step.positions)
        got = {name: out.cpu() for name, out in self.outputs.items()}
        close = torch.testing.assert_close
        # Tolerances: f32 sums run in another order (fold, mixes, norms) and a bf16 output may
        # differ by an ulp (0.4-0.8 %); where that flips an fp8 code of a GEMV input, a few
        # outputs move further. The mean error is held much tighter than the worst element, so a
        # wrong scale or a misplaced block (a few % on many outputs) cannot hide under the max.
        # Where a stage's input is the kernel's own earlier output, a rounding tie there moves a
        # few later outputs without any error in that stage, so those are held against the
        # reference fed the kernel's own hand-off: post and comb against the gate of the kernel's
        # R (2 of 28,672 bf16 values of R flipping at a tie move post by 1e-4), q's worst element
        # against the MXFP8 of its own qr output, which S5 reads (a flipped qr code moves a few
        # q outputs by more than 3 %), while q's mean bound stays end to end.
        own_gate = seam_gate(got["r"][: want.r.numel()].view(want.r.shape), self.w.hc_fn, self.w.hc_base,
                                 self.w.hc_scale)
        own_qr = mxfp8_quantize(got["qr"][: want.qr.numel()].view(want.qr.shape))
        q_raw = fp8_gemv(*own_qr, self.w.w_qb, self.w.s_qb, Q_LORA, self.w.qb_shuffled)
        q_from_own_qr = ref.q_heads(q_raw, self.w.rope, step.positions)
        checks = (("r", want.r, want.r, 1e-2, 1e-3), ("post", own_gate.post, own_gate.post, 1e-4, 1e-5),
                  ("comb", own_gate.comb, own_gate.comb, 1e-3, 1e-4), ("x_norm", want.x_norm, want.x_norm, 2e-2, 2e-3),
                  ("qr", want.qr, want.qr, 3e-2, 3e-3), ("q", q_from_own_qr, want.q, 3e-2, 3e-3))
        measured = {}
        for name, closest, expected, worst, mean in checks:
            actual = got[name][: expected.numel()].view(expected.shape).float()
            close(actual, closest.float(), rtol=worst, atol=worst, msg=lambda text: f"{name}: {text}")
            error = (actual - expected.float()).abs().mean().item()
            if not (error <= mean):
                raise Mismatch(f"{name}: mean error {error:.2e} > {mean:.0e}")
            measured[name] = (error, mean)
        for name, out in got.items():
            if not (out[m * out.numel() // self.bucket:].eq(SENTINEL).all()):
                raise Mismatch(f"{name}: rows past m were written")
        self.check_cache(step, want, cache_before, cache_at)
        return measured

    def check_cache(self, step: Step, want: ref.K1Outputs, cache_before: torch.Tensor, cache_at: int = 0) -> None:
        """Records at the rows' slots hold the reference KV; no other byte of the window
        `cache_before` holds (from byte `cache_at`) changed."""
        close = torch.testing.assert_close
        cache = self.cache[cache_at: cache_at + cache_before.numel()].cpu()
        touched = torch.zeros_like(cache, dtype=torch.bool)
        for row, slot in enumerate(step.slots.tolist()):
            if slot < 0:
                continue
            record = kv_read(self.cache, slot, PAGE_STRIDE, BLOCK).cpu()
            close(kv_dequantize(record.unsqueeze(0))[0], want.kv[row], rtol=0.07, atol=0.05)  # e4m3 step
            if not ((record[KV_DATA:KV_RECORD - 1] == want.records[row, KV_DATA:KV_RECORD - 1]).sum() >= 6):
                raise Mismatch("UE8M0 codes differ")
            if not (record[KV_RECORD - 1] == 0):
                raise Mismatch("pad byte not 0 (vLLM's insert writes 0)")
            page, r = divmod(slot, BLOCK)
            base = page * PAGE_STRIDE - cache_at
            data, scales = base + r * KV_DATA, base + BLOCK * KV_DATA + r * KV_SCALES
            touched[data: data + KV_DATA] = True
            touched[scales: scales + KV_SCALES] = True
        if not (torch.equal(cache[~touched], cache_before[~touched])):
            raise Mismatch("K1 wrote cache bytes outside its records")


def scratch(run: K1Run) -> dict[str, torch.Tensor]:
    """Views of the scratch regions one stage hands the next (K1Layout's offsets)."""
    f32, u8, lay, rows = run.work["work_f32"], run.work["work_u8"], run.lay, run.bucket
    return {
        "partials": f32[lay.partials: lay.qkv_raw].view(rows, 56, 25),
        "qkv_raw": f32[lay.qkv_raw: lay.q_raw].view(2, rows, 2048),
        "q_raw": f32[lay.q_raw: lay.f32_words].view(rows, lay.q_width),
        "x_codes": u8[lay.x_codes: lay.x_scales].view(-1, H),
        "x_scales": u8[lay.x_scales: lay.qr_codes].view(-1, H // 32),
        "qr_codes": u8[lay.qr_codes: lay.qr_scales].view(-1, 1536),
        "qr_scales": u8[lay.qr_scales: lay.bytes].view(-1, 1536 // 32),
    }
