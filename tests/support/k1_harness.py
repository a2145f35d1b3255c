"""K1's standalone stages: the reference's hand-off put where a stage-subset build reads it, and
what that stage writes checked against the reference. The whole kernel's world, launch and check
are `mono_jit.selfcheck.k1_world` (shared with `mono-jit selftest --emulate`)."""

from __future__ import annotations

import torch

from mono_jit.selfcheck.k1_world import BLOCK, H, PAGE_STRIDE, K1Run, Step, scratch
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates import reference_math as rmath

__all__ = ["BLOCK", "H", "PAGE_STRIDE", "K1Run", "Step", "check_stage", "prepare_stage", "scratch"]


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
    got = rmath.mxfp8_dequantize(codes.cpu(), scales.cpu())
    expected = rmath.mxfp8_dequantize(want_codes, want_scales)
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
