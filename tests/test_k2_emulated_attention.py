"""K2's stages 1-3 (key table, split sparse MQA with sink, merge, inverse RoPE, MXFP8) as a
standalone launch on the emulated gfx950, against the reference, for both ratios: the test
world's records carry UE8M0 codes 127..129, so a code read sign-extended (issue 23, part 2)
flips the sign of its 64 dims and fails the comparison. tests/test_gpu_k2.py runs the same
check on a gfx950. Skipped without the emulate extra."""

from __future__ import annotations

import pytest
from k2_harness import K2Run
from k2_inputs import TP, full_weights, shard, world

from mono_jit.spec import Spec
from mono_jit.templates.k2 import reference as ref

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")

from k2_emulation import stage_launchers  # noqa: E402

BUCKET, RANK = 4, 3


@pytest.fixture(scope="module")
def weights():
    return shard(full_weights(), RANK)


@pytest.mark.parametrize("ratio", [4, 128])
def test_key_table_and_attention_on_the_emulator_match_the_reference(ratio, weights):
    run = K2Run(world(ratio), weights, RANK, BUCKET, "cpu")
    (launch,) = stage_launchers(Spec(8, ratio, run.lay.topk_width, BUCKET), [frozenset({1, 2, 3})])
    launch(run)
    want = ref.rank_attention(run.x, run.w)
    s = run.scratch()
    for row in range(run.m):
        count = int(want.keys.lens[row])
        assert int(s["counts"][row, 0]) == count and int(s["counts"][row, 1]) == int(want.keys.swa[row])
    run.check_attention(ref.finish(want, run.x, run.w, [want.partial] * TP))
    assert int(run.sync[0]) == 1, "a standalone launch still advances the epoch"
