"""The decode layer end to end through vLLM 0.33 with the shipped code objects: test_e2e_layer.py's
eight rank processes (vLLM's real `DeepseekV4DecoderLayer`s through its `--monokernel` hook into
mono-jit's runner, a gloo TP group) with `MONO_JIT_BACKEND=emulator`: each process runs the
cached K1 and K2 of the deployment's grid on one emulated gfx950, and K2's all-reduces push into
the other processes' peer buffers in /dev/shm (the emulator's external writers).

Held, on every layer kind (e2e_world.LAYERS: first layer, HCA and CSA, hash-routed or not):
- against tests/support/layer_math.py, vLLM's math written independently, with
  test_e2e_layer.py's bounds (layer_math.BOUNDS) and the SWA cache byte for byte (check_swa_cache);
- against the reference backend (mono_jit's references composed over the 8 ranks, what the
  runner returns bit for bit with MONO_JIT_BACKEND=reference: test_e2e_layer.py) within the
  kernels' stated errors: K1's normed and qr, and the SWA records exactly; K2's R (res_out)
  against the reference's fold of the y every rank's own attention hand-off (its xo codes) gives,
  and against the reference's own but for values a rounding tie of y explains (check_res_out;
  the mean against the reference's own); its seam (post_out, comb_out) and the MoE's out against the references fed
  its own R (a rounding tie upstream moves later values without any error there; see the
  emulated K1 and K2 tests, whose tolerances these are).

Found here: K2 at bucket 1 read its MoE gate / up 2 floats early (moe_layout.sgu_raw, fixed). One
res_out value of layer 0 is 0.0146 off the reference backend's (past 1e-2): one bf16 ulp of y
(-1.0859 for -1.0938: the reference's unrounded y, -1.08972, is 1.2e-4 from that boundary) times
post 1.87; rank 0's xo and z codes equal the reference's, and no rank's reference partial there
is near a bf16 tie, so another rank's hand-off moved y (ranks 6 and 7 wrote 1 and 4 xo codes
other than the reference's). Chained it is 0.00195 off.

Cost: the CI case is step 0 alone (1 row: bucket 1 of K1 and of K2 at both ratios) through the
five layers: 918 s on 2 shared cores (the 8 processes 270-580 s, the checks about 570 s);
MONO_JIT_TEST_E2E_STEPS=3 runs every step of e2e_world.STEPS (buckets 1, 4 with a graph-pad row,
2) and the replay under capture.
"""

from __future__ import annotations

import os

import pytest
import torch
from cache_settings import joined_grid
from composed import compose, from_own_seam
from e2e_ranks import assert_same_bits_on_every_rank, layer_step, run_ranks
from e2e_world import LAYERS, STEPS, base_checkpoint, layer_checkpoint
from layer_math import BOUNDS, check_swa_cache, decode_layer, layer_errors

from mono_jit.selfcheck.k1_world import Mismatch
from mono_jit.selfcheck.k2_run import partial_from_xo
from mono_jit.selfcheck.k2_ties import fold_tie_flips
from mono_jit.templates.k2 import attention_reference as k2
from mono_jit.templates.reference_math import fold

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

# Read at import: the suite's autouse fixture clears MONO_JIT_* before each test.
STEPS_RUN = int(os.environ.get("MONO_JIT_TEST_E2E_STEPS", "1"))
TIMEOUT = 3600  # seconds for the 8 processes
# K2's cross-rank waits are bounded by `peer_wait_us` on s_memrealtime. The emulator's clock is
# 1 tick per 32 wave-instructions of the device, and, with the peers in other processes, runs
# on in wall time while the device waits on them (docs/emulator.md). So the bound is wall time
# here, and the slowest peer's emulation sets it: 8 processes share 2 (busy) cores, so a peer's
# whole K1, vLLM's select and K2's S1-S18 can take minutes of wall time before its partials
# land. 900 s is past any of that and below TIMEOUT, so a rank that died still fails the launch
# (K2 traps) before the test gives up.
PEER_WAIT = 900

pytestmark = pytest.mark.slow  # eight vLLM processes emulating K1 and K2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, k1_cache, k2_cache) -> list[dict]:
    """The 8 rank processes' records: the code objects from the session's K1 and K2 caches
    (offline: a miss fails the runner), STEPS_RUN steps, the replay when every step ran."""
    root = joined_grid(k1_cache, k2_cache, tmp_path_factory.mktemp("grid") / "cache")
    return run_ranks(tmp_path_factory.mktemp("e2e-emulated"), TIMEOUT, MONO_JIT_BACKEND="emulator",
                     MONO_JIT_CACHE_DIR=str(root), MONO_JIT_OFFLINE="1", MONO_JIT_PEER_WAIT=str(PEER_WAIT),
                     E2E_STEPS=str(STEPS_RUN), E2E_REPLAY="1" if STEPS_RUN == len(STEPS) else "0")


@pytest.fixture(scope="module")
def checkpoints() -> dict:
    base = base_checkpoint()
    return {i: layer_checkpoint(base, i) for i in LAYERS}


_memo: dict[tuple, object] = {}  # what two tests of one layer both need, computed once


def once(what: str, s, layer: int, make):
    """`make()`'s result for (what, step, layer), computed the first time it is asked for."""
    if (what, s, layer) not in _memo:
        _memo[what, s, layer] = make()
    return _memo[what, s, layer]


def outputs(entry: dict) -> dict[str, torch.Tensor]:
    (normed, qr), = entry["selected"]  # select ran once, between K1 and K2, on K1's outputs
    out, res_out, post_out, comb_out = entry["out"]
    return dict(normed=normed, qr=qr, out=out, res_out=res_out, post_out=post_out, comb_out=comb_out)


# The kernels' stated errors (worst element, mean absolute): K1's from its emulated launches
# (mono_jit/selfcheck/k1_world.py), K2's R and seam from tests/support/k2_harness.py's
# K2Run.check, the MoE's out from K2Run.check_out.
K1_ERRORS = {"normed": (2e-2, 2e-3), "qr": (3e-2, 3e-3)}
K2_ERRORS = {"res_out": (1e-2, 1e-3), "post_out": (1e-4, 1e-5), "comb_out": (1e-3, 1e-4), "out": (3e-2, 3e-3)}
BEFORE_THE_MOE = ("normed", "qr", "res_out", "post_out", "comb_out")


def check_against_vllms_math(ranks, checkpoints, measured, layer: int, names: tuple[str, ...]) -> None:
    """Outputs `names` of every step run against layer_math with layer_math.BOUNDS; the SWA cache
    byte for byte (check_swa_cache)."""
    for s, record in ranks[0]["steps"].items():
        entry = record["layers"][layer]
        step = layer_step(record, entry)
        want = once("layer_math", s, layer, lambda: decode_layer(step, checkpoints[layer]))
        got = {name: value for name, value in outputs(entry).items() if name in names}
        errors = layer_errors(got, want, range(record["plan"].requests))
        over = {name: e for name, e in errors.items() if not e <= BOUNDS[name]}
        assert not over, f"step {s}: past the bounds {BOUNDS}: {over} (all: {errors})"
        off = check_swa_cache(entry["swa_after"], want.swa_cache, step)
        for name, error in errors.items():
            measured(f"e2e emulated {name}", error)
        measured("e2e emulated SWA record bytes off", off)


def check_res_out(ranks: list[dict], s: int, layer: int, actual: torch.Tensor, reference: dict, live: int) -> int:
    """res_out ([live, 4, H]) within K2's worst element of (a) the reference's fold of the y that
    every rank's own attention hand-off gives (its xo codes, e2e_rank.k2_attention_hand_off, fed
    to the reference's wo_a, wo_b and all-reduce: the chain K2Ranks.check holds R to), and of (b)
    the reference backend's res_out but for values a rounding tie of y explains
    (k2_ties.fold_tie_flips). Returns how many (b) admitted.

    The xo codes themselves are not held to the reference's here: a few differ beyond ties
    (layers 0-2: 5, 9, 1 of 65,536; up to 7 steps), most likely as K2's q is the kernel K1's
    (not recorded; K1's checks allow a flipped qr code to move q by > 3 %); the 8-rank K2 test,
    whose inputs are the reference's, holds them tie-aware."""
    inputs, weights, attention = reference["k2_inputs"], reference["k2_weights"], reference["k2_attention"]
    m = attention[0].xo_codes.shape[0]
    hand_offs = [rank["steps"][s]["layers"][layer]["xo"] for rank in ranks]
    partials = [partial_from_xo({"xo_codes": codes, "xo_scales": scales}, m, w)
                for (codes, scales), w in zip(hand_offs, weights)]
    x = inputs[0]
    chained = fold(k2.all_reduce(partials), x.residual, x.post, x.comb, True)[:live].reshape(actual.shape).float()
    worst = K2_ERRORS["res_out"][0]
    torch.testing.assert_close(actual, chained, rtol=worst, atol=worst,
                               msg=lambda text: f"step {s} layer {layer} res_out (chained): {text}")
    expected = reference["res_out"][:live].reshape(actual.shape)
    return fold_tie_flips(actual, expected, [own.partial[:live] for own in attention], x.residual[:live],
                          x.post[:live], x.comb[:live], worst)


def check_against_the_reference_backend(ranks, checkpoints, measured, layer: int, names: tuple[str, ...]) -> None:
    """Outputs `names` of every step run against the references composed over the ranks (K2's
    seam and MoE: fed the kernel's own R) within the kernels' stated errors, res_out's worst
    element chained (check_res_out; its mean against the reference's own); the SWA cache
    identical to the reference's insert."""
    for s, record in ranks[0]["steps"].items():
        entry = record["layers"][layer]
        step = layer_step(record, entry)
        live = record["plan"].requests
        got = outputs(entry)
        reference = once("composed", s, layer, lambda: compose(step, checkpoints[layer]))
        own = once("own seam", s, layer, lambda: from_own_seam(got["res_out"][:live], step, checkpoints[layer]))
        want = {"normed": reference["normed"], "qr": reference["qr"], "res_out": reference["res_out"], **own}
        for name in names:
            worst, mean = {**K1_ERRORS, **K2_ERRORS}[name]
            actual = got[name][:live].float()
            expected = want[name][:live].reshape(actual.shape).float()
            error = (actual - expected).abs().mean().item()
            measured(f"e2e emulated vs reference {name} mean", error)
            if name == "res_out":
                measured("e2e emulated res_out values admitted as y tie flips", check_res_out(ranks, s, layer, actual,
                                                                                      reference, live))
            else:
                torch.testing.assert_close(actual, expected, rtol=worst, atol=worst,
                                           msg=lambda text: f"step {s} layer {layer} {name}: {text}")
            assert error <= mean, f"step {s} layer {layer} {name}: mean error {error:.2e} > {mean:.0e}"
        assert torch.equal(entry["swa_after"], reference["swa_cache"]), f"step {s} layer {layer}: SWA cache bytes"


@pytest.mark.parametrize("layer", LAYERS, ids=[f"layer{i}" for i in LAYERS])
def test_e2e_emulated_layer_up_to_the_moe_matches_vllms_math(ranks, checkpoints, measured, layer):
    check_against_vllms_math(ranks, checkpoints, measured, layer, BEFORE_THE_MOE)


@pytest.mark.parametrize("layer", LAYERS, ids=[f"layer{i}" for i in LAYERS])
def test_e2e_emulated_layer_up_to_the_moe_equals_the_reference_backend(ranks, checkpoints, measured, layer):
    check_against_the_reference_backend(ranks, checkpoints, measured, layer, BEFORE_THE_MOE)


def test_e2e_emulated_res_out_off_by_more_than_a_tie_of_y_fails(ranks, checkpoints):
    """Layer 0, step 0's res_out perturbed by 0.05 away from the reference's, at the value a tie of
    y explains (0.0146 off) and at one within the bound: each fails the chained check and the
    tie-aware one (a flip of y moves a value by post x ulp(y), and the refold with y the other
    way must be within 1e-2 of the kernel's value)."""
    record = ranks[0]["steps"][0]
    entry = record["layers"][0]
    live = record["plan"].requests
    reference = once("composed", 0, 0, lambda: compose(layer_step(record, entry), checkpoints[0]))
    actual = outputs(entry)["res_out"][:live].float()
    worst = K2_ERRORS["res_out"][0]
    expected = reference["res_out"][:live].reshape(actual.shape).float()
    tied = ((actual - expected).abs() > worst + worst * expected.abs()).nonzero().tolist()
    assert len(tied) == 1
    x = reference["k2_inputs"][0]
    partials = [own.partial[:live] for own in reference["k2_attention"]]
    for at in tied + [[0, 1, 100]]:
        bad = actual.clone()
        bad[tuple(at)] += 0.05 if bad[tuple(at)] >= expected[tuple(at)] else -0.05
        with pytest.raises(AssertionError, match="res_out"):
            check_res_out(ranks, 0, 0, bad, reference, live)
        with pytest.raises(Mismatch, match="not explained by a rounding tie of y"):
            fold_tie_flips(bad, expected, partials, x.residual[:live], x.post[:live], x.comb[:live], worst)


@pytest.mark.parametrize("layer", LAYERS, ids=[f"layer{i}" for i in LAYERS])
def test_e2e_emulated_moe_out_matches_vllms_math(ranks, checkpoints, measured, layer):
    check_against_vllms_math(ranks, checkpoints, measured, layer, ("out",))


@pytest.mark.parametrize("layer", LAYERS, ids=[f"layer{i}" for i in LAYERS])
def test_e2e_emulated_moe_out_equals_the_reference_backend(ranks, checkpoints, measured, layer):
    check_against_the_reference_backend(ranks, checkpoints, measured, layer, ("out",))


def test_e2e_emulated_the_steps_ran_the_code_objects_on_every_rank(ranks):
    for rank, record in enumerate(ranks):
        assert record["runner"] == "mono_jit.runtime.runner" and record["declined"] is None, rank
        assert record["backend"] == "emulator", rank
        assert list(record["steps"]) == list(range(STEPS_RUN)), rank
    assert {i for s in ranks[0]["steps"].values() for i in s["layers"]} == set(LAYERS)


def test_e2e_emulated_every_rank_returns_the_same_bits(ranks):
    assert_same_bits_on_every_rank(ranks)


@pytest.mark.skipif(STEPS_RUN < len(STEPS), reason="the replay runs with every step (MONO_JIT_TEST_E2E_STEPS=3)")
def test_e2e_emulated_a_replay_allocates_nothing_and_gives_the_same_bits(ranks):
    for record in ranks:
        last = record["steps"][len(STEPS) - 1]
        assert record["same_buffers"] and record["same_tables"]
        for i in LAYERS:
            assert all(torch.equal(a, b) for a, b in zip(record["replay"]["layers"][i]["out"], last["layers"][i]["out"]))
