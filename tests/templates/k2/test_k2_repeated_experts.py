"""A hash layer's row that names one expert twice, on the emulated gfx950.

vLLM's FusedMoE counts every (token, k) entry of the top-k: its down outputs are [M, topk, K]
and moe_sum adds the topk rows (vllm/model_executor/layers/fused_moe/fused_moe.py:1863), so a
tid2eid row naming expert e twice adds e's output twice; K2's reference does the same
(moe_reference.routed_experts). K2's S11 keeps one pick per (union slot, row), so S15-S17 compute
e once for that row; S18 must count that pick for both entries. S11 and S18 run here as
standalone launches: S11's picks decide where the down outputs go (every other pick row holds
NaN, as a pick row left from an earlier step does), and S18's pushed partial must be the
reference's. Skipped without the emulate extra."""

from __future__ import annotations

import pytest
import torch
from k2_harness import K2Run
from k2_inputs import full_weights, shard, world

from mono_jit import deepseek_v4
from mono_jit.spec import Spec
from mono_jit.templates.k2 import moe_reference as moe

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

from k2_emulation import stage_launchers  # noqa: E402

BUCKET, RANK, H, E, TOPK = 4, 2, deepseek_v4.HIDDEN, deepseek_v4.ROUTED_EXPERTS, deepseek_v4.EXPERTS_PER_TOKEN
# rows 0 and 2 name an expert twice (7; 300 at the ends), row 1 six distinct experts
IDS = torch.tensor([[3, 7, 11, 40, 7, 90], [5, 6, 7, 8, 9, 10], [300, 7, 12, 13, 14, 300]], dtype=torch.int32)


@pytest.fixture(scope="module")
def stages():
    return stage_launchers(Spec(8, deepseek_v4.CSA_RATIO, 1024, BUCKET), [frozenset({11}), frozenset({18})])


def hash_weights(ids: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """S10's weights of a hash row: each entry's expert score over the row's sum, x 2.5 (an
    expert named twice gets one weight twice, bit for bit)."""
    score = torch.rand(ids.shape[0], E, generator=g) + 0.1
    chosen = score.gather(1, ids.long())
    return chosen / chosen.sum(1, keepdim=True) * deepseek_v4.ROUTED_SCALING


@pytest.mark.slow
def test_a_repeated_hash_expert_counts_twice(stages):
    union_stage, push_stage = stages
    run = K2Run(world(4), shard(full_weights(), RANK), RANK, BUCKET, "cpu")
    lay, m = run.lay, run.m
    g = torch.Generator().manual_seed(23)
    weights = hash_weights(IDS, g)
    run.region("i32", lay.ids, m * TOPK).copy_(IDS.flatten())
    run.region("f32", lay.route_weights, m * TOPK).copy_(weights.flatten())
    union_stage(run)

    union = moe.expert_union(IDS, E)
    pick_of = run.region("i32", lay.pick_of, len(union) * BUCKET).view(len(union), BUCKET)[:, :m]
    assert int((pick_of[:, 0] >= 0).sum()) == 5, "S11: one pick for the row's repeated expert"
    expert_out = {(r, int(e)): torch.randn(H, generator=g) for r in range(m) for e in IDS[r]}
    y = torch.full((m * TOPK, H), float("nan"))
    for slot, expert in enumerate(union):
        for r in range(m):
            pick = int(pick_of[slot, r])
            if pick >= 0:
                y[pick] = weights.flatten()[pick] * expert_out[(r, expert)]
    shared = torch.randn(m, H, generator=g)
    run.region("f32", lay.routed_y, m * TOPK * H).copy_(y.flatten())
    run.region("f32", lay.shared_raw, m * H).copy_(shared.flatten())
    run.sync.zero_()  # a fresh epoch: S18 pushes into the first half with tag 1
    push_stage(run)

    words = run.mailbox.view(torch.int32).view(-1, 2)
    first = (lay.moe_at + lay.part_pair(RANK, 0, 0)) // 8
    pushed = words[first: first + m * H // 2]
    assert bool((pushed[:, 1] == 1).all()), "every pair tagged with the launch's tag"
    got = pushed[:, 0].contiguous().view(torch.bfloat16).view(m, H)
    routed = torch.zeros(m, H)
    for j in range(TOPK):  # every entry counted, in top-k order (moe_reference.routed_experts)
        routed = routed + torch.stack([weights[r, j] * expert_out[(r, int(IDS[r, j]))] for r in range(m)])
    want = moe.moe_partial(routed.to(torch.bfloat16), shared.to(torch.bfloat16))
    assert torch.equal(got, want)
