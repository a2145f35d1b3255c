"""Self-tests of the gfx950 launch test's harness, on the CPU: a launcher that implements K1's
contract through the reference stands in for the kernel, so these test the harness (argument
order, buffer views, layer 0's empty slots, tolerances, cache checks), never K1 itself. The
harness must accept the reference and catch each way of breaking the contract."""

from __future__ import annotations

import pytest
from k1_harness import BLOCK, H, PAGE_STRIDE, K1Run, check_stage, prepare_stage, scratch
from mono_jit.selfcheck.k1_world import random_weights

from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates import reference_math as rmath


def reference_launcher(bucket: int, break_it: str = ""):
    """A stand-in for the compiled K1 that reads its arguments by K1Template.arguments' names
    (reference.run, the runtime's reference backend), optionally broken one way."""
    names = [a.name for a in get("k1").arguments(Spec(8, 4, 1024, bucket))]

    def launch(*values):
        a = dict(zip(names, values, strict=True))
        m = a["m"]
        if break_it == "one block scale":  # one 128 x 128 block of fused_wqa_wkv read at twice its scale
            a["s_qkv"] = a["s_qkv"].clone()
            a["s_qkv"][2 * 56 + 5] += 1
        ref.run(a)
        if break_it == "extra row":  # one row more than m of every output
            for name in ("r_out", "post_out", "comb_out", "x_norm", "qr_out", "q_out"):
                row = a[name].numel() // bucket
                a[name][m * row: (m + 1) * row].copy_(a[name][:row])
        if break_it == "pad byte":  # flip the pad byte of every inserted record
            for slot in a["slot_mapping"][:m].tolist():
                if slot >= 0:
                    page, row = divmod(slot, a["block_size"])
                    a["kv_cache"][page * a["page_stride"] + a["block_size"] * 576 + row * 8 + 7] ^= 0xFF

    return launch


def _run(bucket: int, shuffled: bool, break_it: str = "") -> K1Run:
    return K1Run(bucket, random_weights(row_pad=256), row_pad=256, shuffled=shuffled, device="cpu",
                 launcher=reference_launcher(bucket, break_it))


@pytest.mark.parametrize("m, bucket, shuffled, do_fold", [(1, 1, False, 1), (3, 4, True, 1), (2, 4, False, 0)])
def test_harness_self_test_accepts_the_reference(m, bucket, shuffled, do_fold):
    run = _run(bucket, shuffled)
    step = run.set_step(m, seed=m, do_fold=do_fold)
    before = run.cache.clone()
    run.launch(step)
    run.check(step, cache_before=before)
    assert int(run.sync[0]) == 1
    assert PAGE_STRIDE >= BLOCK * 584


@pytest.mark.parametrize("break_it, message", [("extra row", "rows past m"), ("pad byte", "pad byte"),
                                               ("one block scale", "qr")])
def test_harness_self_test_catches_a_kernel_that_breaks_it(break_it, message):
    run = _run(4, False, break_it)
    step = run.set_step(3, seed=3, do_fold=1)
    before = run.cache.clone()
    run.launch(step)
    with pytest.raises(AssertionError, match=message):
        run.check(step, cache_before=before)


def reference_stage_launcher(run_box: list, stage: int, bucket: int, break_it: bool = False):
    """A stand-in for a standalone stage: reads the stage's inputs where the kernel would (the
    prepared buffers), writes its outputs there, through the reference's stage functions."""
    names = [a.name for a in get("k1").arguments(Spec(8, 4, 1024, bucket))]

    def launch(*values):
        a = dict(zip(names, values, strict=True))
        run, m = run_box[0], a["m"]
        s, w = scratch(run), run.w
        if stage == 1:
            r = rmath.fold(a["x"][: m * H].view(m, H), a["residual"][: m * 4 * H].view(m, 4, H),
                         a["post_mix"][: m * 4].view(m, 4, 1), a["res_mix"][: m * 16].view(m, 4, 4), bool(a["do_fold"]))
            a["r_out"][: r.numel()].copy_(r.flatten())
            s["partials"][:m].copy_(rmath.seam_partials(r, w.hc_fn))
        elif stage == 2:
            r = a["r_out"][: m * 4 * H].view(m, 4, H)
            gate = rmath.gate_from_partials(s["partials"][:m], 4 * H, w.hc_base, w.hc_scale)
            x_norm = rmath.rms_norm(rmath.collapse(r, gate.pre), w.attn_norm)
            codes, scales = rmath.mxfp8_quantize(x_norm)
            a["post_out"][: m * 4].copy_(gate.post.flatten())
            a["comb_out"][: m * 16].copy_(gate.comb.flatten())
            a["x_norm"][: m * H].copy_(x_norm.flatten())
            s["x_codes"][:m], s["x_scales"][:m] = codes, scales
        elif stage == 3:
            raw = rmath.fp8_gemv(s["x_codes"][:m], s["x_scales"][:m], w.w_qkv, w.s_qkv, H)
            if break_it:
                raw[:, 100] += 1.0
            s["qkv_raw"][0, :m], s["qkv_raw"][1, :m] = raw / 2, raw / 2
        elif stage == 4:
            front = ref.attention_front(s["qkv_raw"][0, :m] + s["qkv_raw"][1, :m], w, a["positions"][:m])
            a["qr_out"][: m * 1536].copy_(front.qr.flatten())
            s["qr_codes"][:m], s["qr_scales"][:m] = front.qr_codes, front.qr_scales
            rmath.kv_insert(a["kv_cache"], front.records, a["slot_mapping"][:m], a["page_stride"], a["block_size"])
        elif stage == 5:
            s["q_raw"][:m] = rmath.fp8_gemv(s["qr_codes"][:m], s["qr_scales"][:m], w.w_qb, w.s_qb, 1536)
        elif stage == 6:
            q = ref.q_heads(s["q_raw"][:m], w.rope, a["positions"][:m])
            a["q_out"][: q.numel()].copy_(q.flatten())
        a["sync"][0] += 1

    return launch


def _stage_run(stage: int, break_it: bool = False):
    box: list = []
    run = K1Run(8, random_weights(row_pad=256), row_pad=256, shuffled=False, device="cpu",
                launcher=reference_stage_launcher(box, stage, 8, break_it))
    box.append(run)
    step = run.set_step(5, seed=stage, do_fold=1)
    want = ref.k1(step.x, step.residual, step.post_mix, step.res_mix, True, run.w, step.positions)
    prepare_stage(run, stage, step, want)
    return run, step, want


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(1, 7))
def test_stage_harness_self_test_accepts_the_reference_stage(stage):
    run, step, want = _stage_run(stage)
    before = run.cache.clone()
    run.launch(step)
    check_stage(run, stage, step, want, before)


def test_stage_harness_self_test_catches_a_wrong_output_column():
    run, step, want = _stage_run(3, break_it=True)
    before = run.cache.clone()
    run.launch(step)
    with pytest.raises(AssertionError):
        check_stage(run, 3, step, want, before)
