"""The whole decode layer end to end through vLLM 0.33 on the CPU: K1, vLLM's select, K2.

Eight rank processes (e2e_rank.py) run vLLM's real `DeepseekV4DecoderLayer`s at V4-Pro's widths
through vLLM's own forward and `--monokernel` hook into mono-jit's runner (reference backend, the
templates' torch references; K2's all-reduces through shared-memory peer buffers between the
processes), for three decode steps of five layers: the first layer (no fold), hash layers,
CSA layers (top-k through the block table), HCA layers (global slots, the deployment's width
8192 with vLLM's active 128), a graph-pad row. What they return is checked here against
tests/support/layer_math.py, an independent torch formulation of vLLM's layer math, on the very inputs
each layer got (the previous layer's outputs), and the SWA caches byte for byte.

Bounds: layer_math.BOUNDS, relative norm errors over the live rows, and why they follow from
the MXFP8 quantisation. Measured here (worst of the 15 cases, printed in the summary): normed
6e-5, qr 2.5e-4, res_out 2e-3, post_out / comb_out 1e-3, out 2.9e-2 (layer 0 of step 0: y 2.5e-3
off from the formulations' summation orders, which flips 15% of res_out's bf16 roundings and
decorrelates the MoE's MXFP8 codes); SWA records 0.06% of bytes one code off. The runner itself
adds nothing: on step 1 it equals the references composed bit for bit (tests/support/composed.py).

Stood in (they cannot run on a CPU, e2e_rank.py says how): vLLM's compressor and indexer, and
vLLM's original layer path, whose use fails the run.
"""

from __future__ import annotations

import pytest
import torch
from composed import compose
from e2e_ranks import assert_same_bits_on_every_rank, layer_step, run_ranks
from e2e_world import LAYERS, STEPS, base_checkpoint, layer_checkpoint
from layer_math import BOUNDS, check_swa_cache, decode_layer, layer_errors

TIMEOUT = 1500  # seconds for the 8 processes; they take about 3 minutes on 2 busy cores

pytestmark = pytest.mark.slow  # eight vLLM processes: every test here waits for them


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """The 8 rank processes' records (e2e_rank.py, reference backend, every step and the replay)."""
    return run_ranks(tmp_path_factory.mktemp("e2e"), TIMEOUT, MONO_JIT_BACKEND="reference")


@pytest.fixture(scope="module")
def checkpoints() -> dict:
    base = base_checkpoint()
    return {i: layer_checkpoint(base, i) for i in LAYERS}


CASES = [(s, i) for s in range(len(STEPS)) for i in LAYERS]


@pytest.mark.parametrize("step, layer", CASES, ids=[f"e2e-step{s}-layer{i}" for s, i in CASES])
def test_e2e_layer_through_vllms_hook_matches_vllms_math(ranks, checkpoints, measured, step, layer):
    record = ranks[0]["steps"][step]
    entry = record["layers"][layer]
    want = decode_layer(layer_step(record, entry), checkpoints[layer])
    live = record["plan"].requests
    (normed, qr), = entry["selected"]  # select ran once, between K1 and K2, on K1's outputs
    out, res_out, post_out, comb_out = entry["out"]
    got = dict(normed=normed, qr=qr, out=out, res_out=res_out, post_out=post_out, comb_out=comb_out)
    errors = layer_errors(got, want, range(live))
    over = {name: e for name, e in errors.items() if not e <= BOUNDS[name]}
    assert not over, f"past the bounds {BOUNDS}: {over} (all: {errors})"
    off = check_swa_cache(entry["swa_after"], want.swa_cache, layer_step(record, entry))
    for name, error in errors.items():
        measured(f"e2e {name}", error)
    measured("e2e SWA record bytes off", off)


@pytest.mark.parametrize("layer", LAYERS, ids=[f"e2e-step1-layer{i}" for i in LAYERS])
def test_e2e_the_runner_returns_its_references_composed_bit_for_bit(ranks, checkpoints, layer):
    """Step 1 (a graph-pad row), every layer kind: through vLLM's hook, the runner's argument path
    (tables, peer buffers, output sets, HCA slots) changes nothing: its outputs, pad rows included,
    and the SWA cache equal mono_jit's references composed over the 8 ranks (tests/support/composed.py),
    bit for bit. What the bounds above leave is the two formulations' rounding, not the runner."""
    record = ranks[0]["steps"][1]
    entry = record["layers"][layer]
    want = compose(layer_step(record, entry), checkpoints[layer])
    rows = record["plan"].rows
    for got, name in zip(entry["out"], ("out", "res_out", "post_out", "comb_out")):
        assert torch.equal(got[:rows], want[name][:rows]), name
    assert torch.equal(entry["swa_after"], want["swa_cache"])


def test_e2e_the_steps_took_mono_jits_runner_on_every_rank(ranks):
    for rank, record in enumerate(ranks):
        assert record["runner"] == "mono_jit.runtime.runner" and record["declined"] is None, rank
    assert {i for s in ranks[0]["steps"].values() for i in s["layers"]} == set(LAYERS)


def test_e2e_every_rank_returns_the_same_bits(ranks):
    assert_same_bits_on_every_rank(ranks)


def test_e2e_graph_pad_rows_leave_the_caches_untouched(ranks):
    """Step 1 pads 3 requests to 4 rows: the pad row's slot is -1 and its metadata garbage; the
    SWA bytes that change are exactly the live rows' records (layer_math's insert skips -1)."""
    record = ranks[0]["steps"][1]
    assert record["plan"].rows > record["plan"].requests
    for entry in record["layers"].values():
        changed = (entry["swa_after"] != entry["swa_before"]).nonzero().numel()
        assert 0 < changed <= 584 * record["plan"].requests


def test_e2e_a_replay_allocates_nothing_and_reuses_the_buffers(ranks):
    """The last step run again as a FULL graph's capture runs it (the runner's allocation, load
    and compile paths raise): the same outputs, in the same buffers, with the same layer tables."""
    for record in ranks:
        last = record["steps"][len(STEPS) - 1]
        assert record["same_buffers"] and record["same_tables"]
        for i in LAYERS:
            assert all(torch.equal(a, b) for a, b in zip(record["replay"]["layers"][i]["out"], last["layers"][i]["out"]))
