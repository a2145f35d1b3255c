"""Each of K2's MoE stages (9-19) as a standalone launch on one MI355X: fed the reference's
hand-off from the stage before (written into the work buffer at K2MoeLayout's offsets) and
compared with the reference's hand-off to the next, all 384 experts at real widths. Skipped where
there is no gfx950 GPU; none of these has run on hardware yet."""

from __future__ import annotations

import pytest
import torch
from k2_harness import K2Run
from k2_inputs import TP, full_weights, shard, world
from test_gpu import _on_gfx950

from mono_jit.spec import Spec
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import attention_reference as ref
from mono_jit.templates.k2 import moe_reference as moe

pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
]

BUCKET, H, E, TOPK = 4, 7168, 384, 6
CLOSE = dict(rtol=3e-2, atol=3e-2)


@pytest.fixture(scope="module")
def setting():
    """Rank 2's run (CSA world, all 384 experts), its FFN seam, and the reference's MoE."""
    from test_k2_moe_reference import global_weights, vllm_layout

    weights = full_weights()
    shards = [shard(weights, r) for r in range(TP)]
    wd = world(4)
    ones = ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)
    weights_moe = vllm_layout(global_weights(experts=E), 2)
    seam = ones[2].seam
    return wd, shards[2], weights_moe, seam, moe.rank_moe(seam.x_norm, weights_moe)


def _run(setting, stages: set[int]) -> K2Run:
    wd, shard2, weights_moe, seam, _ = setting
    run = K2Run(wd, shard2, 2, BUCKET, "cuda", moe=weights_moe)
    run.state_tensors["x_norm"][: seam.x_norm.numel()] = seam.x_norm.flatten().to("cuda")
    run.write_scratch("ffn_codes", seam.x_codes)
    run.write_scratch("ffn_scales", seam.x_scales)
    spec = Spec(8, 4, 1024, BUCKET)
    from mono_jit.templates.k2.kernel import build

    run.launch_stages = lambda: build(spec, frozenset(stages)).launcher(*run.ordered())
    return run


def _picks(ids: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The union (ascending) and pick_of [slots, BUCKET] as S11 defines them."""
    union = moe.expert_union(ids, E)
    pick_of = torch.full((len(union), BUCKET), -1, dtype=torch.int32)
    for slot, expert in enumerate(union):
        for row in range(ids.shape[0]):
            for j in range(TOPK):
                if int(ids[row, j]) == expert:
                    pick_of[slot, row] = row * TOPK + j
    return union, pick_of


def _put_route(run: K2Run, want: moe.RankMoe) -> None:
    lay, m = run.lay, run.m
    run.region("i32", lay.ids, TOPK * m).copy_(want.ids.int().flatten().cuda())
    run.region("f32", lay.route_weights, TOPK * m).copy_(want.weights.float().flatten().cuda())


def _put_union(run: K2Run, want: moe.RankMoe) -> list[int]:
    union, pick_of = _picks(want.ids)
    lay = run.lay
    run.region("i32", lay.union, len(union)).copy_(torch.tensor(union, dtype=torch.int32).cuda())
    run.region("i32", lay.union_size, 1).fill_(len(union))
    run.region("i32", lay.pick_of, pick_of.numel()).copy_(pick_of.flatten().cuda())
    return union


def _expert_rows(weights_moe: moe.MoeWeights, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    return moe.expert_matrices(weights_moe, expert)


def test_s9_logits(setting):
    _, _, weights_moe, seam, _ = setting
    run = _run(setting, {9})
    run.launch_stages()
    torch.cuda.synchronize()
    got = run.region("f32", run.lay.logits, run.m * E).cpu().view(run.m, E)
    torch.testing.assert_close(got, seam.x_norm.float() @ weights_moe.gate.float().T, rtol=1e-3, atol=1e-3)


def test_s10_top6(setting):
    _, _, weights_moe, seam, want = setting
    run = _run(setting, {10})
    run.region("f32", run.lay.logits, run.m * E).copy_((seam.x_norm.float() @ weights_moe.gate.float().T).flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    got = run.moe_scratch()
    assert torch.equal(got["ids"], want.ids)
    torch.testing.assert_close(got["weights"], want.weights, rtol=1e-4, atol=1e-5)


def test_s11_union_and_picks(setting):
    *_, want = setting
    run = _run(setting, {11})
    _put_route(run, want)
    run.launch_stages()
    torch.cuda.synchronize()
    union, pick_of = _picks(want.ids)
    lay = run.lay
    assert int(run.region("i32", lay.union_size, 1).cpu()) == len(union)
    assert run.region("i32", lay.union, len(union)).cpu().tolist() == union
    assert torch.equal(run.region("i32", lay.pick_of, pick_of.numel()).cpu().view(-1, BUCKET), pick_of)


def test_s12_to_s14_shared_expert_stage_by_stage(setting):
    _, _, weights_moe, seam, want = setting
    m, inter = seam.x_norm.shape[0], 384
    gate_up = rmath.fp8_gemv(seam.x_codes, seam.x_scales, weights_moe.sgu, weights_moe.sgu_s, H, shuffled=True)
    run = _run(setting, {12})  # S12: the four K quarters add up to the GEMV
    run.launch_stages()
    torch.cuda.synchronize()
    quarters = run.region("f32", run.lay.sgu_raw, 4 * BUCKET * 2 * inter).cpu().view(4, BUCKET, 2 * inter)
    torch.testing.assert_close(quarters.sum(0)[:m], gate_up, rtol=1e-3, atol=1e-2)

    h = moe.swiglu(gate_up[:, :inter].to(torch.bfloat16), gate_up[:, inter:].to(torch.bfloat16)).to(torch.bfloat16)
    h_codes, h_scales = rmath.mxfp8_quantize(h)
    run = _run(setting, {13})  # S13: quarter 0 holds the whole sum
    run.region("f32", run.lay.sgu_raw, m * 2 * inter).copy_(gate_up.flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    lay = run.lay
    got = rmath.mxfp8_dequantize(run.region("u8", lay.sh_codes, m * inter).cpu().view(m, inter),
                              run.region("u8", lay.sh_scales, m * inter // 32).cpu().view(m, -1))
    torch.testing.assert_close(got, rmath.mxfp8_dequantize(h_codes, h_scales), rtol=0.07, atol=1e-3)

    run = _run(setting, {14})
    run.region("u8", run.lay.sh_codes, m * inter).copy_(h_codes.flatten().cuda())
    run.region("u8", run.lay.sh_scales, m * inter // 32).copy_(h_scales.flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    shared = run.moe_scratch()["shared"].to(torch.bfloat16)
    torch.testing.assert_close(shared.float(), want.shared.float(), **CLOSE)


def test_s15_to_s17_routed_experts_stage_by_stage(setting):
    _, _, weights_moe, seam, want = setting
    m, inter = seam.x_norm.shape[0], 384
    x = rmath.mxfp8_dequantize(seam.x_codes, seam.x_scales).double()
    gu = torch.zeros(m * TOPK, 2 * inter)
    for row in range(m):
        for j in range(TOPK):
            w13, _ = _expert_rows(weights_moe, int(want.ids[row, j]))
            gu[row * TOPK + j] = (x[row] @ w13.double().T).float()
    run = _run(setting, {15})
    _put_route(run, want)
    _put_union(run, want)
    run.launch_stages()
    torch.cuda.synchronize()
    got = run.region("f32", run.lay.gu, m * TOPK * 2 * inter).cpu().view(m * TOPK, 2 * inter)
    torch.testing.assert_close(got, gu, rtol=1e-3, atol=1e-2)  # f32 sums over 7168 in another order

    h = moe.swiglu(gu[:, :inter], gu[:, inter:]).to(torch.bfloat16)
    h_codes, h_scales = rmath.mxfp8_quantize(h)
    run = _run(setting, {16})
    _put_route(run, want)
    run.region("f32", run.lay.gu, gu.numel()).copy_(gu.flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    lay = run.lay
    got = rmath.mxfp8_dequantize(run.region("u8", lay.rh_codes, m * TOPK * inter).cpu().view(-1, inter),
                              run.region("u8", lay.rh_scales, m * TOPK * inter // 32).cpu().view(m * TOPK, -1))
    torch.testing.assert_close(got, rmath.mxfp8_dequantize(h_codes, h_scales), rtol=0.07, atol=1e-3)

    run = _run(setting, {17})
    _put_route(run, want)
    _put_union(run, want)
    run.region("u8", run.lay.rh_codes, h_codes.numel()).copy_(h_codes.flatten().cuda())
    run.region("u8", run.lay.rh_scales, h_scales.numel()).copy_(h_scales.flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    routed = run.moe_scratch()["picks"].sum(1).to(torch.bfloat16)
    torch.testing.assert_close(routed.float(), want.routed.float(), **CLOSE)


def test_s18_and_s19_the_moe_all_reduce_alone(setting):
    """S18 alone pushes the rank's partial into its own mailbox's MoE region (every peer address
    is this GPU's); S19 alone reduces a mailbox filled with 8 ranks' partials into out."""
    *_, want = setting
    m = want.ids.shape[0]
    run = _run(setting, {18})
    _put_route(run, want)
    lay = run.lay
    picks = torch.zeros(m * TOPK, H)
    for row in range(m):  # the routed sum split over the picks: pick 0 holds it, the others 0
        picks[row * TOPK] = want.routed[row].float()
    run.region("f32", lay.routed_y, picks.numel()).copy_(picks.flatten().cuda())
    run.region("f32", lay.shared_raw, m * H).copy_(want.shared.float().flatten().cuda())
    run.launch_stages()
    torch.cuda.synchronize()
    words = run.mailbox.cpu().view(torch.int32).view(-1, 2)
    first = (lay.moe_at + lay.part_pair(2, 0, 0)) // 8
    block = words[first: first + m * H // 2]
    assert (block[:, 1] == 1).all(), "every pair tagged with the launch's tag"
    got = block[:, 0].contiguous().view(torch.bfloat16).view(m, H)
    torch.testing.assert_close(got.float(), want.partial.float(), rtol=1e-2, atol=1e-2)

    partials = [want.partial * (1 + r / 8) for r in range(TP)]
    run = _run(setting, {19})
    run.put_partials([p.to(torch.bfloat16) for p in partials], tag=1)
    view = run.mailbox.view(torch.int32)
    half = lay.half_bytes // 2 // 4  # part one's regions -> the MoE's (moe_at = half / 2)
    view[half: 2 * half].copy_(view[:half].clone())
    run.launch_stages()
    torch.cuda.synchronize()
    run.check_out(moe.all_reduce([p.to(torch.bfloat16) for p in partials]))
