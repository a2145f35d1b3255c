"""K1's buffers for one bucket, one step's inputs, a launch and the comparison with the
reference. tests/test_gpu.py drives it with the compiled kernel on an MI355X; the CPU tests
drive it with a launcher that implements the contract through the reference, so the harness
(argument order, buffer views, tolerances, cache checks) is itself tested here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from k1_inputs import random_activations

from mono_jit.templates.k1 import reference as ref
from mono_jit.templates.k1.layout import K1Layout

H = 7168
BLOCK, PAGES = 64, 4
PAGE_STRIDE = 37440  # 64 x 584 rounded up to the 576-byte stride, as vLLM allocates
SENTINEL = -3.0


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
    """Device buffers of one K1 bucket (TP8) and the launcher that runs a step on them."""

    def __init__(self, bucket: int, w: ref.K1Weights, *, row_pad: int, shuffled: bool, device: str,
                 launcher: Callable):
        if shuffled:  # what vLLM's ROCm attention may do to fused_wqa_wkv (prepare_attn_preshuffle)
            w = dataclasses.replace(w, w_qkv=ref.preshuffle_16x16(w.w_qkv[:, :H].contiguous()), qkv_shuffled=True)
        self.lay, self.bucket, self.w, self.launcher = K1Layout(8, bucket), bucket, w, launcher
        qkv_stride = H if shuffled else H + row_pad
        self.layouts = (qkv_stride, int(w.qkv_shuffled), 1536 + row_pad, int(w.qb_shuffled))
        self.weights = [t.to(device).flatten() for t in (
            w.hc_fn, w.hc_base, w.hc_scale, w.attn_norm, w.w_qkv, w.s_qkv, w.q_norm, w.kv_norm, w.w_qb, w.s_qb,
            w.rope)]

        def zeros(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        def sentinel(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.full((n,), SENTINEL, dtype=dtype, device=device)

        rows, bf16 = bucket, torch.bfloat16
        self.inputs = [zeros(rows * H, bf16), zeros(rows * 4 * H, bf16), zeros(rows * 4), zeros(rows * 16)]
        self.positions = zeros(rows, torch.int64)
        self.slots = torch.full((rows,), -1, dtype=torch.int64, device=device)
        self.cache = torch.randint(0, 256, (PAGES * PAGE_STRIDE,), dtype=torch.uint8,
                                   generator=torch.Generator().manual_seed(7)).to(device)
        self.outputs = {"r": sentinel(rows * 4 * H, bf16), "post": sentinel(rows * 4), "comb": sentinel(rows * 16),
                        "x_norm": sentinel(rows * H, bf16), "qr": sentinel(rows * 1536, bf16),
                        "q": sentinel(rows * self.lay.q_width, bf16)}
        self.sync = zeros(self.lay.sync_words, torch.int32)
        self.work = [zeros(self.lay.f32_words), zeros(self.lay.bytes, torch.uint8)]

    def set_step(self, m: int, seed: int, do_fold: int) -> Step:
        """Random inputs for m rows, copied into the device buffers; even rows insert KV. The
        outputs go back to the sentinel, so rows an earlier step wrote never pass for this one's."""
        x, residual, post_mix, res_mix = random_activations(m, seed)
        positions = torch.randint(0, self.w.rope.shape[0], (m,), generator=torch.Generator().manual_seed(seed))
        slots = torch.tensor([(5 + 7 * i) % (PAGES * BLOCK) if i % 2 == 0 else -1 for i in range(m)])
        for buffer, value in zip(self.inputs + [self.positions, self.slots],
                                 (x, residual, post_mix, res_mix, positions, slots)):
            buffer[: value.numel()].copy_(value.flatten())
        for out in self.outputs.values():
            out.fill_(SENTINEL)
        return Step(m, do_fold, x, residual, post_mix, res_mix, positions, slots)

    def arguments(self, step: Step) -> tuple:
        """The launcher's arguments in the order of K1Template.arguments. On layer 0 (do_fold 0)
        x, post_mix and res_mix are unread (vLLM passes x in all three there): they go in empty,
        so a read of them is a null-pointer fault on the device and an error on the CPU."""
        x, residual, post_mix, res_mix = self.inputs
        if not step.do_fold:
            x = post_mix = res_mix = residual.new_empty(0, dtype=torch.float32)
        return (x, residual, post_mix, res_mix, *self.weights, self.positions, self.slots, self.cache,
                *self.outputs.values(), self.sync, *self.work, step.m, step.do_fold, *self.layouts, PAGE_STRIDE,
                BLOCK)

    def launch(self, step: Step) -> None:
        self.launcher(*self.arguments(step))

    def check(self, step: Step, cache_before: torch.Tensor) -> None:
        """Every output against reference.k1, rows past m untouched, the cache written only at
        the records of rows with a slot (pad bytes kept)."""
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
        # against its own S4 qr codes and scales (a flipped qr code moves a few q outputs by more
        # than 3 %), while q's mean bound stays end to end.
        s = scratch(self)
        own_gate = ref.seam_gate(got["r"][: want.r.numel()].view(want.r.shape), self.w.hc_fn, self.w.hc_base,
                                 self.w.hc_scale)
        q_raw = ref.fp8_gemv(s["qr_codes"][:m].cpu(), s["qr_scales"][:m].cpu(), self.w.w_qb, self.w.s_qb, ref.Q_LORA,
                             self.w.qb_shuffled)
        q_from_own_qr = ref.q_heads(q_raw, self.w.rope, step.positions)
        checks = (("r", want.r, want.r, 1e-2, 1e-3), ("post", own_gate.post, own_gate.post, 1e-4, 1e-5),
                  ("comb", own_gate.comb, own_gate.comb, 1e-3, 1e-4), ("x_norm", want.x_norm, want.x_norm, 2e-2, 2e-3),
                  ("qr", want.qr, want.qr, 3e-2, 3e-3), ("q", q_from_own_qr, want.q, 3e-2, 3e-3))
        for name, closest, expected, worst, mean in checks:
            actual = got[name][: expected.numel()].view(expected.shape).float()
            close(actual, closest.float(), rtol=worst, atol=worst, msg=lambda text: f"{name}: {text}")
            error = (actual - expected.float()).abs().mean().item()
            assert error <= mean, f"{name}: mean error {error:.2e} > {mean:.0e}"
        for name, out in got.items():
            assert out[m * out.numel() // self.bucket:].eq(SENTINEL).all(), f"{name}: rows past m were written"
        self.check_cache(step, want, cache_before)

    def check_cache(self, step: Step, want: ref.K1Outputs, cache_before: torch.Tensor) -> None:
        """Records at the rows' slots hold the reference KV; no other byte changed."""
        close = torch.testing.assert_close
        cache = self.cache.cpu()
        touched = torch.zeros_like(cache, dtype=torch.bool)
        for row, slot in enumerate(step.slots.tolist()):
            if slot < 0:
                continue
            record = ref.kv_read(cache, slot, PAGE_STRIDE, BLOCK)
            close(ref.kv_dequantize(record.unsqueeze(0))[0], want.kv[row], rtol=0.07, atol=0.05)  # e4m3 step
            assert (record[576:583] == want.records[row, 576:583]).sum() >= 6, "UE8M0 codes differ"
            assert record[583] == 0, "pad byte not 0 (vLLM's insert writes 0)"
            page, r = divmod(slot, BLOCK)
            base = page * PAGE_STRIDE
            touched[base + r * 576: base + (r + 1) * 576] = True
            touched[base + BLOCK * 576 + r * 8: base + BLOCK * 576 + r * 8 + 8] = True
        assert torch.equal(cache[~touched], cache_before[~touched]), "K1 wrote cache bytes outside its records"


# -- standalone stages ------------------------------------------------------------------------

def scratch(run: K1Run) -> dict[str, torch.Tensor]:
    """Views of the scratch regions one stage hands the next (K1Layout's offsets)."""
    f32, u8, lay, rows = run.work[0], run.work[1], run.lay, run.bucket
    return {
        "partials": f32[lay.partials: lay.qkv_raw].view(rows, 56, 25),
        "qkv_raw": f32[lay.qkv_raw: lay.q_raw].view(2, rows, 2048),
        "q_raw": f32[lay.q_raw: lay.f32_words].view(rows, lay.q_width),
        "x_codes": u8[lay.x_codes: lay.x_scales].view(-1, H),
        "x_scales": u8[lay.x_scales: lay.qr_codes].view(-1, H // 32),
        "qr_codes": u8[lay.qr_codes: lay.qr_scales].view(-1, 1536),
        "qr_scales": u8[lay.qr_scales: lay.bytes].view(-1, 1536 // 32),
    }


def prepare_stage(run: K1Run, stage: int, step: Step, want: ref.K1Outputs) -> None:
    """Put the reference's hand-off into the buffers a standalone `stage` reads."""
    m, s = step.m, scratch(run)
    if stage == 2:
        run.outputs["r"][: want.r.numel()].copy_(want.r.flatten())
        s["partials"][:m].copy_(want.partials)
    elif stage == 3:
        s["x_codes"][:m].copy_(want.x_codes)
        s["x_scales"][:m].copy_(want.x_scales)
    elif stage == 4:
        s["qkv_raw"][0, :m].copy_(want.qkv_raw)
        s["qkv_raw"][1, :m].zero_()
    elif stage == 5:
        s["qr_codes"][:m].copy_(want.qr_codes)
        s["qr_scales"][:m].copy_(want.qr_scales)
    elif stage == 6:
        s["q_raw"][:m].copy_(want.q_raw)


def _close_mx(codes, scales, want_codes, want_scales):
    """MXFP8 rows equal up to an e4m3 step where an input differs by an ulp."""
    got = ref.mxfp8_dequantize(codes.cpu(), scales.cpu())
    expected = ref.mxfp8_dequantize(want_codes, want_scales)
    torch.testing.assert_close(got, expected, rtol=0.07, atol=1e-3)
    assert (scales.cpu() == want_scales).float().mean() >= 0.99, "E8M0 codes differ"


def check_stage(run: K1Run, stage: int, step: Step, want: ref.K1Outputs, cache_before: torch.Tensor) -> None:
    """What a standalone `stage` writes, against the reference's hand-off and outputs."""
    m, s = step.m, {name: view.cpu() for name, view in scratch(run).items()}
    got = {name: out.cpu() for name, out in run.outputs.items()}
    close = torch.testing.assert_close
    if stage == 1:
        close(got["r"][: want.r.numel()].view_as(want.r), want.r, rtol=1e-2, atol=1e-2)
        close(s["partials"][:m], want.partials, rtol=1e-4, atol=1e-3)
    elif stage == 2:
        close(got["post"][: m * 4].view(m, 4), want.post, rtol=1e-4, atol=1e-5)
        close(got["comb"][: m * 16].view(m, 4, 4), want.comb, rtol=1e-3, atol=1e-4)
        close(got["x_norm"][: m * H].view(m, H), want.x_norm, rtol=1e-2, atol=1e-2)
        _close_mx(s["x_codes"][:m], s["x_scales"][:m], want.x_codes, want.x_scales)
    elif stage == 3:
        close(s["qkv_raw"][0, :m] + s["qkv_raw"][1, :m], want.qkv_raw, rtol=1e-4, atol=1e-3)
    elif stage == 4:
        close(got["qr"][: m * 1536].view(m, 1536), want.qr, rtol=1e-2, atol=1e-2)
        _close_mx(s["qr_codes"][:m], s["qr_scales"][:m], want.qr_codes, want.qr_scales)
        run.check_cache(step, want, cache_before)
    elif stage == 5:
        close(s["q_raw"][:m], want.q_raw, rtol=1e-4, atol=1e-3)
    elif stage == 6:
        close(got["q"][: want.q.numel()].view_as(want.q), want.q, rtol=1e-2, atol=1e-2)
