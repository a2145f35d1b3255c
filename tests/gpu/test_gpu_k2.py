"""K2 launched against its torch references: each stage group alone on one MI355X (part one's,
and the MoE's router, shared and routed experts), and the whole of K2 across 8 of them (8
processes, peer buffers exchanged over gloo and opened by IPC, as the runner does). Skipped where
there is no gfx950 GPU (or fewer than 8 for the group tests); none of these has run on hardware
yet."""

from __future__ import annotations

import os

import pytest
import torch
from k2_harness import K2Run
from k2_inputs import TP, full_weights, shard, world
from test_gpu import _on_gfx950

from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates import reference_math as rmath
from mono_jit.templates.k2 import attention_reference as ref

pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
]

BUCKET = 4  # the world's 3 rows (one of them graph padding) and one pad row past m


def _launcher(ratio: int, width: int, stages: frozenset[int] | None = None, bucket: int = BUCKET):
    from mono_jit.templates.k2.kernel import ALL_STAGES, build

    launcher = build(Spec(8, ratio, width, bucket), stages or ALL_STAGES).launcher
    return lambda run: launcher(*run.ordered())


@pytest.fixture(scope="module")
def shards():
    weights = full_weights()
    return [shard(weights, r) for r in range(TP)]


@pytest.mark.parametrize("ratio", [4, 128])
def test_key_table_and_attention_alone_match_the_reference(ratio, shards):
    """Stages 1-3 (key table, split sparse MQA with sink, merge, inverse RoPE, MXFP8) on rank 3:
    the key table exactly, the wo_a operand within an e4m3 step."""
    wd = world(ratio)
    run = K2Run(wd, shards[3], 3, BUCKET, "cuda")
    _launcher(ratio, run.lay.topk_width, frozenset({1, 2, 3}))(run)
    torch.cuda.synchronize()
    want = ref.rank_attention(run.x, run.w)
    s = run.scratch()
    for row in range(run.m):
        count = int(want.keys.lens[row])
        assert int(s["counts"][row, 0]) == count and int(s["counts"][row, 1]) == int(want.keys.swa[row])
        assert torch.equal(s["slots"][row, :count], want.keys.slots[row, :count])
    run.check_attention(ref.finish(want, run.x, run.w, [want.partial] * TP))
    assert int(run.sync[0]) == 1, "a standalone launch still advances the epoch"


def test_wo_a_and_z_alone_match_the_reference(shards):
    """Stages 4-5 fed the reference's wo_a operand: wo_b's operand (MXFP8 of bf16(z)) exactly but
    for codes an f32 summation order can flip."""
    wd = world(4)
    run = K2Run(wd, shards[0], 0, BUCKET, "cuda")
    want = ref.rank_attention(run.x, run.w)
    run.write_scratch("xo_codes", want.xo_codes)
    run.write_scratch("xo_scales", want.xo_scales)
    _launcher(4, 1024, frozenset({4, 5}))(run)
    torch.cuda.synchronize()
    s = run.scratch()
    got = rmath.mxfp8_dequantize(s["z_codes"][:run.m], s["z_scales"][:run.m])
    torch.testing.assert_close(got, rmath.mxfp8_dequantize(want.z_codes, want.z_scales), rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("bucket", [4, 32])  # one hop, two hops
def test_wo_b_alone_pushes_the_ranks_bf16_partial(bucket, shards):
    """Stage 6 fed the reference's wo_b operand, every peer address this GPU's own mailbox: the
    pushes land in PART[rank] (one hop) or RS (two hops), tagged with the launch's tag, pad rows 0."""
    wd = world(4)
    run = K2Run(wd, shards[2], 2, bucket, "cuda")
    want = ref.rank_attention(run.x, run.w)
    run.write_scratch("z_codes", want.z_codes)
    run.write_scratch("z_scales", want.z_scales)
    _launcher(4, 1024, frozenset({6}), bucket)(run)
    torch.cuda.synchronize()
    lay = run.lay
    words = run.mailbox.cpu().view(torch.int32).view(-1, 2)
    for row in range(lay.rows):
        for col in range(0, 7168, 2):
            pair = (lay.rs_pair(2, row, col) if lay.two_hop else lay.part_pair(2, row, col)) // 8
            if lay.two_hop and lay.wob_owner(col // 16) != 2:
                continue  # another owner's columns: pushed to that owner (here: this GPU too)
            value, tag = words[pair].tolist()
            assert tag == 1, (row, col)
            got = torch.tensor([value], dtype=torch.int32).view(torch.bfloat16).float()
            expected = want.partial[row, col:col + 2].float() if row < run.m else torch.zeros(2)
            torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("bucket", [4, 32])
def test_reduce_and_ffn_seam_alone_match_the_reference(bucket, shards):
    """Stages 7-8 on a mailbox filled as the 8 ranks' pushes would fill it (the reference's
    partials, tagged for the launch): y, the fold, the FFN seam's mixes and ffn_norm."""
    wd = world(128)
    partials = [o.rank.partial for o in ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)]
    run = K2Run(wd, shards[6], 6, bucket, "cuda")
    run.put_partials(partials, tag=1)
    _launcher(128, run.lay.topk_width, frozenset({7, 8}), bucket)(run)
    torch.cuda.synchronize()
    run.check(run.expected(partials))


@pytest.fixture(scope="module")
def moe_weights():
    """All 384 experts at the real widths (about 1.6 GB of fp4 a rank), rank 2's shares in
    vLLM's layouts (tests/templates/k2/test_k2_moe_reference.py's generator and AITER shuffles)."""
    from test_k2_moe_reference import global_weights, vllm_layout

    return vllm_layout(global_weights(experts=384), 2)


@pytest.mark.parametrize("hash_layer", [False, True])
def test_the_moe_alone_matches_the_reference(hash_layer, shards, moe_weights):
    """Stages 9-17 fed the reference's FFN-seam output (x_norm and its MXFP8): the router's ids
    and weights, the shared expert's output and the routed sum against moe_reference.rank_moe
    (a hash layer with the ids vLLM would pass)."""
    import dataclasses

    from mono_jit.templates.k2 import moe_reference as moe

    wd = world(4)
    run0 = K2Run(wd, shards[2], 2, BUCKET, "cpu")
    seam = ref.finish(ref.rank_attention(run0.x, run0.w), run0.x, run0.w,
                      [o.rank.partial for o in ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)]).seam
    weights = dataclasses.replace(moe_weights, bias=None) if hash_layer else moe_weights
    route_ids = torch.randint(0, 384, (run0.m, 6), generator=torch.Generator().manual_seed(5)) if hash_layer else None
    run = K2Run(wd, shards[2], 2, BUCKET, "cuda", moe=weights, route_ids=route_ids)
    run.state_tensors["x_norm"][: seam.x_norm.numel()] = seam.x_norm.flatten().to("cuda")
    run.write_scratch("ffn_codes", seam.x_codes)
    run.write_scratch("ffn_scales", seam.x_scales)
    _launcher(4, 1024, frozenset(range(9, 18)))(run)
    torch.cuda.synchronize()
    want = moe.rank_moe(seam.x_norm, weights, route_ids)
    got = run.moe_scratch()
    assert (got["ids"] == want.ids).float().mean() > 0.99, "experts differ beyond near-ties"
    same = got["ids"] == want.ids
    torch.testing.assert_close(got["weights"][same], want.weights[same], rtol=2e-3, atol=2e-4)
    torch.testing.assert_close(got["shared"].to(torch.bfloat16).float(), want.shared.float(), rtol=3e-2, atol=3e-2)
    routed = got["picks"].sum(1).to(torch.bfloat16)
    torch.testing.assert_close(routed.float(), want.routed.float(), rtol=3e-2, atol=3e-2)


def _rank_main(rank: int, port: int, ratio: int, results) -> None:
    """One of 8 processes: its device, the gloo group, the peer buffers (runtime/peer.py), K2
    part one from the cache through the runner's HIP backend, three launches in a row."""
    import torch.distributed as dist

    from mono_jit.pipeline.resolve import resolve
    from mono_jit.runtime.backends import HipBackend
    from mono_jit.runtime.hip import Hip
    from mono_jit.runtime.peer import DeviceBuffer, exchange
    from mono_jit.templates.k2.moe_layout import K2MoeLayout

    torch.cuda.set_device(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP)
    try:
        weights, wd = full_weights(), world(ratio)
        shards = [shard(weights, r) for r in range(TP)]
        width = wd.inputs.topk.shape[1]
        lay = K2MoeLayout(8, ratio, width, BUCKET)
        memory, why = exchange(Hip.get(), lay.peer_bytes, dist.group.WORLD, rank, TP)
        assert why is None, why
        mailbox = DeviceBuffer(memory.local.pointer, lay.peer_bytes // 8, "int64")
        from test_k2_moe_reference import global_weights, vllm_layout

        moes = [vllm_layout(global_weights(experts=384), r) for r in range(TP)]
        run = K2Run(wd, shards[rank], rank, BUCKET, "cuda", mailbox=mailbox, peer_addresses=memory.addresses,
                    moe=moes[rank])
        spec = Spec(8, ratio, width, BUCKET)
        found = resolve("k2", spec)
        backend = HipBackend()
        kernel = backend.load(get("k2"), spec, found.meta, found.hsaco)
        partials = [o.rank.partial for o in ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)]
        for _ in range(3):  # launches in a row: epochs advance, peer halves alternate
            backend.launch(kernel, run.arguments(), torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            run.check(run.expected(partials))
            run.check_out(run.expected_out(moes))
        results[rank] = int(run.sync[0])
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < TP if torch.cuda.is_available() else True,
                    reason="needs 8 MI355X GPUs in one node (the TP8 all-reduce)")
@pytest.mark.parametrize("ratio", [4, 128])
def test_k2_on_8_gpus_matches_the_reference(ratio):
    """The whole of K2 on a TP8 group, three launches in a row: part one's outputs (K2Run.check)
    and the MoE's reduced `out` against the reference's MoE on the kernel's own x_norm
    (K2Run.expected_out)."""
    import torch.multiprocessing as mp

    manager = mp.Manager()
    results = manager.dict()
    port = 29500 + os.getpid() % 1000
    mp.spawn(_rank_main, args=(port, ratio, results), nprocs=TP, join=True)
    assert dict(results) == {r: 3 for r in range(TP)}, "every rank ran three launches"
