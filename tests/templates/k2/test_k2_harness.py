"""The gfx950 harness of K2 (tests/support/k2_harness.py) on the CPU: its tables hold the addresses and
integers the kernel reads, in the template's order; its arguments are the template's contract;
its mailbox filling is what the pushes would write; its comparison accepts the reference and
rejects a perturbed output. So a GPU run that fails points at the kernel, not the harness."""

from __future__ import annotations

import pytest
import torch
from k2_harness import SENTINEL, K2Run
from k2_inputs import TP, full_weights, shard, world

from mono_jit.spec import Spec
from mono_jit.templates import get
from mono_jit.templates.k2 import attention_reference as ref
from mono_jit.templates.k2.attention_layout import STATE_TABLE, WEIGHT_TABLE


@pytest.fixture(scope="module")
def shards():
    weights = full_weights()
    return [shard(weights, r) for r in range(TP)]


@pytest.fixture(scope="module")
def partials(shards):
    wd = world(4)
    return [o.rank.partial for o in ref.k2_part_one_ranks([wd.rank(r) for r in range(TP)], shards)]


def test_tables_hold_the_tensors_addresses_in_the_templates_order(shards):
    run = K2Run(world(4), shards[3], 3, 4, "cpu")
    table = run.weights.tolist()
    for i, name in enumerate(WEIGHT_TABLE):
        if name in run.weight_tensors:
            assert table[i] == run.weight_tensors[name].data_ptr(), name
    assert table[WEIGHT_TABLE.index("woa_stride")] == 4096 + 256 and table[WEIGHT_TABLE.index("wob_shuffled")] == 1
    assert run.state.tolist() == [run.state_tensors[n].data_ptr() for n in STATE_TABLE]
    assert run.peers.tolist() == [run.mailbox.data_ptr()] * TP


@pytest.mark.parametrize("ratio", [4, 128])
def test_arguments_are_the_templates_contract(ratio, shards):
    run = K2Run(world(ratio), shards[0], 0, 4, "cpu")
    contract = get("k2").arguments(Spec(8, ratio, run.lay.topk_width, 4))
    values = run.ordered()
    for argument, value in zip(contract, values):
        if argument.kind == "tensor":
            assert value.dtype == getattr(torch, argument.dtype) and value.is_contiguous(), argument.name
        else:
            assert isinstance(value, int), argument.name
    assert run.arguments()["m"] == 3 and run.sync.numel() == run.lay.sync_words


@pytest.mark.parametrize("bucket", [4, 32])
def test_the_mailbox_holds_what_the_pushes_would_write(bucket, shards, partials):
    run = K2Run(world(4), shards[1], 1, bucket, "cpu")
    run.put_partials(partials, tag=7, half=1)
    lay, words = run.lay, run.mailbox.view(torch.int32).view(-1, 2)
    assert words[: lay.half_bytes // 8].eq(0).all(), "half 0 untouched"
    for src in (0, 5):
        for row, col in ((0, 0), (2, 7166), (bucket - 1, 1000)):
            if lay.two_hop:
                owned = lay.seam_owner(col // 128) == 1
                pair = lay.rs_pair(src, row, col) if owned else lay.ag_pair(row, col)
                want = partials[src] if owned else ref.all_reduce(partials)
            else:
                pair, want = lay.part_pair(src, row, col), partials[src]
            value, tag = words[(lay.half_bytes + pair) // 8].tolist()
            expected = want[row, col:col + 2] if row < 3 else torch.zeros(2, dtype=torch.bfloat16)
            assert tag == 7 and torch.equal(torch.tensor([value], dtype=torch.int32).view(torch.bfloat16), expected)


def test_the_comparison_accepts_the_reference_and_rejects_a_wrong_value(shards, partials):
    run = K2Run(world(4), shards[4], 4, 4, "cpu")
    want = run.expected(partials)
    m = run.m
    run.state_tensors["r_out"][: want.seam.r.numel()] = want.seam.r.flatten()
    run.state_tensors["post_out"][: 4 * m] = want.seam.post.flatten()
    run.state_tensors["comb_out"][: 16 * m] = want.seam.comb.flatten()
    run.state_tensors["pre_out"][: 4 * m] = want.seam.pre.flatten()
    run.state_tensors["x_norm"][: want.seam.x_norm.numel()] = want.seam.x_norm.flatten()
    run.check(want)
    run.state_tensors["x_norm"][5] += 1.0
    with pytest.raises(AssertionError):
        run.check(want)
    run.state_tensors["x_norm"][5] -= 1.0
    run.state_tensors["post_out"][4 * m] = 0.5  # a row past m written
    with pytest.raises(AssertionError, match="rows past m"):
        run.check(want)
    assert SENTINEL < 0


def test_the_moe_entries_and_route_ids_follow_the_contract(shards):
    from test_k2_moe_reference import global_weights, vllm_layout

    moe = vllm_layout(global_weights(experts=8), 0)
    ids = torch.randint(0, 8, (3, 6), dtype=torch.int32)
    run = K2Run(world(4), shards[0], 0, 4, "cpu", moe=moe, route_ids=ids)
    table = dict(zip(WEIGHT_TABLE, run.weights.tolist()))
    assert table["w13"] == run.weight_tensors["w13"].data_ptr() and table["sw2_stride"] == run.lay.inter
    assert table["gate"] == run.weight_tensors["gate"].data_ptr() and table["sgu_shuffled"] == 1
    args = run.arguments()
    assert args["use_hash"] == 1 and torch.equal(args["route_ids"], ids.flatten())
    assert K2Run(world(4), shards[0], 0, 4, "cpu").arguments()["use_hash"] == 0
