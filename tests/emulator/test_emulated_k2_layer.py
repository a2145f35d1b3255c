"""Our shipped K2 on 8 emulated ranks from a layer_math checkpoint layer and step, with the tensors
vLLM holds and the runner's weights table of them (tests/support/k2_layer_buffers.py), as
bench/emulated_k2.py runs it beside vLLM's own K2. Checked on every rank: res_out, post_out and
comb_out against layer_math's decode_layer (K2 is fed layer_math's own K1 outputs, so within
layer_math.BOUNDS), the same x_norm on every rank, and `out` against moe_reference's MoE of the
kernel's own x_norm.

At bucket 1 this found the bucket-1 build's `out` unrelated to the MoE of its own x_norm (relative
error 1.43 on every rank) while res_out, post, comb and pre agreed: the MoE's gate / up parts
began 2 words off a 16-byte boundary (moe_layout.sgu_raw, now on 8 words; its layout test in
test_k2_moe_protocol.py failed at bucket 1 before the fix).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("tinygrad", reason="the emulator needs the emulate extra (numba, tinygrad)")
pytest.importorskip("flydsl", reason="the K2 builds compile with FlyDSL (the build extra)")

import k2_layer_buffers as kb  # noqa: E402
import layer_math as lm  # noqa: E402
from cache_settings import settings_at  # noqa: E402
from k2_emulation import K2Code, run_on_ranks  # noqa: E402

from mono_jit.pipeline.resolve import resolve  # noqa: E402
from mono_jit.spec import Spec  # noqa: E402
from mono_jit.templates import get  # noqa: E402
from mono_jit.templates.k2 import moe_reference as moe  # noqa: E402

pytestmark = pytest.mark.slow
TP, H = 8, 7168
OUT_BOUND = 1e-4  # the MoE of the kernel's own x_norm: f32 sums in another order (measured 1.7e-5)


@pytest.fixture(scope="module")
def layer():
    """A CSA checkpoint layer (8 reachable experts, expert 383 among them) and its ranks' tensors."""
    ckpt = lm.random_checkpoint_layer(5, 4, False, seed=1)
    return ckpt, [lm.rank_tensors(ckpt, rank, TP) for rank in range(TP)]


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("bucket", [4, 1])
def test_our_k2_on_a_layer_math_step(k2_cache, layer, bucket):
    """One row on the `bucket` build: the seam's outputs within BOUNDS of layer_math, `out` the
    MoE of the kernel's own x_norm within OUT_BOUND, every rank."""
    ckpt, tensors = layer
    spec = Spec(TP, 4, 1024, bucket)
    found = resolve(get("k2"), spec, settings=settings_at(k2_cache))
    code = K2Code.of(spec, found.hsaco, [launch.to_json() for launch in found.meta.launches])
    step = lm.random_step(ckpt, m=1, seed=1)
    want = lm.decode_layer(step, ckpt)
    front = kb.FrontOutputs.of(step, ckpt)
    boxes = kb.mailboxes(spec, TP)
    ranks = [kb.LayerK2Buffers(spec, step, front, tensors[rank], rank, boxes) for rank in range(TP)]
    run_on_ranks(code, ranks)
    x_norm = ranks[0].state_tensors["x_norm"].view(-1, H)[:1]
    out = moe.all_reduce([moe.rank_moe(x_norm, moe.MoeWeights(**lm.vllm_layout(ckpt.moe, rank))).partial
                          for rank in range(TP)])
    for rank, buffers in enumerate(ranks):
        s = buffers.state_tensors
        seam = {"res_out": s["r_out"].view(-1, 4, H)[:1], "post_out": s["post_out"].view(-1, 4, 1)[:1],
                "comb_out": s["comb_out"].view(-1, 4, 4)[:1]}
        errors = lm.layer_errors(seam, want, [0])
        assert {n: e for n, e in errors.items() if not e <= lm.BOUNDS[n]} == {}, f"rank {rank}: {errors}"
        assert torch.equal(s["x_norm"].view(-1, H)[:1], x_norm), f"rank {rank}: x_norm"
        assert _relative(buffers.out(), out) <= OUT_BOUND, f"rank {rank}: out {_relative(buffers.out(), out):.3g}"
