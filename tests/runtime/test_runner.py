"""The runner on the CPU: vLLM's hook arguments -> K1's argument mapping -> the reference
backend -> vLLM's select, and the all-rank fallback when anything is missing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hook_inputs import (PAGE_BLOCK, PAGE_BYTES, PAGES, Dims, expected_front, hook_step, layer_weights,
                         random_weights, record_view)
from sparse_memory import GiB, sparse_bytes

from mono_jit.errors import CaptureError
from mono_jit.runtime import runner as runner_module
from mono_jit.runtime.backends import ReferenceBackend
from mono_jit.runtime.runner import DECLINED, MonoRunner
from mono_jit.runtime.weights import WeightError


@pytest.fixture(scope="module")
def k1_weights():
    return random_weights(row_pad=256, positions=64)


@pytest.fixture(scope="module")
def weights(k1_weights):
    w = layer_weights(k1_weights)
    w.attn.check(Dims())
    w.check(Dims())
    return w


def front_runner(**kwargs) -> MonoRunner:
    return MonoRunner(8, 0, None, "cpu", 8192, templates=("k1",), backend=ReferenceBackend(), **kwargs)


@pytest.mark.parametrize("m, first, rows", [(3, False, 3), (1, True, 1), (5, False, 8)])
def test_the_front_through_the_reference_matches_k1_on_vllms_tensors(k1_weights, weights, m, first, rows):
    runner = front_runner()
    assert runner.declined is None
    step = hook_step(weights, m, first, rows=rows)
    want, cache = expected_front(k1_weights, step)
    out = runner.forward(*step.args, **step.kwargs)
    assert out[:4] is None  # no K2 yet: the layer goes on in vLLM's path
    got = runner.front_out
    for name, expected in (("r_out", want.r), ("post_out", want.post), ("comb_out", want.comb),
                           ("x_norm", want.x_norm), ("qr_out", want.qr), ("q_out", want.q)):
        assert torch.equal(got[name][:rows], expected), name
    view = step.args[7]
    assert torch.equal(view.as_strided(cache.shape, (1,)), cache), "KV records not where vLLM's pages hold them"
    (normed, qr), = step.selected
    assert torch.equal(normed, want.x_norm) and torch.equal(qr, want.qr)


def test_the_front_serves_an_swa_cache_past_4_gib(k1_weights, weights, tmp_path):
    """vLLM's view of a > 4 GiB SWA cache (a sparse file), the step's slots in pages past 4 GiB:
    forward packs it (an i32 extent raised KernargError inside forward) and the records land
    where the reference places them."""
    step = hook_step(weights, 3, False)
    want, small = expected_front(k1_weights, step)
    first = 4 * GiB // PAGE_BYTES + 10
    big = sparse_bytes(tmp_path / "swa", (first + PAGES) * PAGE_BYTES)
    at = first * PAGE_BYTES
    big[at:] = step.args[7].as_strided(small.shape, (1,))
    args = list(step.args)
    args[6] = torch.where(args[6] >= 0, args[6] + first * PAGE_BLOCK, args[6])
    args[7] = record_view(big.view(-1, PAGE_BYTES), PAGE_BLOCK)
    assert at > 4 * GiB
    assert front_runner().forward(*args, **step.kwargs)[:4] is None
    assert torch.equal(big[at:], small), "KV records not where vLLM's pages hold them"


def test_a_rank_without_its_peers_declines_on_every_step_without_running_anything(weights):
    runner = MonoRunner(8, 0, None, "cpu", 8192, backend=ReferenceBackend())
    assert runner.declined == "rank 0: peer memory: ValueError: no process group to exchange 8 ranks' peer buffers over"
    assert not runner.kernels
    step = hook_step(weights, 2, False)
    assert runner.forward(*step.args, **step.kwargs)[:4] is None
    assert step.selected == []


def test_the_runner_is_never_built_inside_a_capture(monkeypatch):
    monkeypatch.setattr(runner_module, "capturing", lambda: True)
    with pytest.raises(CaptureError, match="graph capture"):
        front_runner()


def test_hook_tensors_that_do_not_fit_are_refused_by_name(weights):
    runner = front_runner()
    step = hook_step(weights, 2, False)
    args = list(step.args)
    args[2] = args[2].transpose(1, 2).contiguous().transpose(1, 2)  # residual, strided
    with pytest.raises(ValueError, match="residual"):
        runner.forward(*args, **step.kwargs)
    args = list(step.args)
    args[5] = args[5].to(torch.int32)
    with pytest.raises(ValueError, match="positions"):
        runner.forward(*args, **step.kwargs)


@pytest.mark.parametrize("cache", ["swa_cache", "comp_cache"])
def test_a_page_stride_off_the_16_byte_chunks_is_refused_by_name(weights, cache):
    """The kernels read a record's bytes as 16-byte chunks of the cache (offset // 16): a page
    stride that is not a multiple of 16 would read other bytes without a sign."""
    runner = front_runner()
    step = hook_step(weights, 2, False)
    stride = 64 * 584 + 8
    off = record_view(torch.zeros(4, stride, dtype=torch.uint8), 64)
    args = list(step.args)
    if cache == "swa_cache":
        args[7] = off
    else:
        step.kwargs["comp_cache"] = off
    with pytest.raises(ValueError, match=f"{cache}: page stride {stride} bytes; expected a multiple of 16"):
        runner.forward(*args, **step.kwargs)


def test_weights_in_another_layout_are_refused_by_name(k1_weights):
    w = layer_weights(k1_weights)
    w.attn.wq_b = w.attn.wq_b.contiguous()  # rows no longer 1792 bytes apart
    with pytest.raises(WeightError, match="wq_b"):
        w.attn.check(Dims())
    w = layer_weights(k1_weights)
    w.attn.wqkv_scale = w.attn.wqkv_scale.clone()
    w.attn.wqkv_scale[1, 0] += 1  # not a 128 x 128 block's code repeated
    with pytest.raises(WeightError, match="wqkv_scale"):
        w.attn.check(Dims())
    w = layer_weights(k1_weights)
    w.bias = torch.zeros(383)
    with pytest.raises(WeightError, match="bias"):
        w.check(Dims())


def test_the_declined_result_slices_to_none():
    assert DECLINED[:4] is None and DECLINED[0] is None


def test_a_layers_weights_table_is_made_once_and_never_inside_a_capture(weights, k1_weights, monkeypatch):
    runner = front_runner()
    table = runner.weights_table(weights)
    assert runner.weights_table(weights) is table
    other = layer_weights(k1_weights, layer_id=4)
    other.attn.check(Dims())
    other.check(Dims())
    monkeypatch.setattr(runner_module, "capturing", lambda: True)
    assert runner.weights_table(weights) is table  # made at an eager step: replays read it
    with pytest.raises(CaptureError, match="layer 4 first reached"):
        runner.weights_table(other)


def test_the_weights_table_points_k2_at_vllms_tensors(weights):
    """Entries by name (layout.WEIGHT_TABLE): the tensors vLLM loaded, the 128 x 128 codes behind
    vLLM's 32 x 32 scales, wo_a's padded row stride, and 0 for a hash layer's bias."""
    from mono_jit.runtime.tables import weight_table
    from mono_jit.templates.k2.attention_layout import WEIGHT_TABLE

    table = dict(zip(WEIGHT_TABLE, weight_table(weights)))
    a = weights.attn
    assert table["w_oa"] == a.wo_a.data_ptr() and table["woa_stride"] == 4096 + 256 and table["woa_shuffled"] == 0
    assert table["w_ob"] == a.wo_b.data_ptr() and table["wob_stride"] == 2048 and table["wob_shuffled"] == 1
    s_oa, s_ob = a.k2_scales()
    assert table["s_oa"] == s_oa.data_ptr() and torch.equal(s_oa, a.wo_a_scale[::4, ::4])
    assert torch.equal(s_ob, a.wo_b_scale[::4, ::4]) and tuple(s_ob.shape) == (56, 16)
    assert table["bias"] == weights.bias.data_ptr() and table["sw2_stride"] == 384
    hashed = layer_weights(random_weights(row_pad=256, positions=64))
    hashed.bias = None
    assert dict(zip(WEIGHT_TABLE, weight_table(hashed)))["bias"] == 0


def test_a_nan_scale_code_is_refused_by_name(k1_weights):
    w = layer_weights(k1_weights)
    w.attn.check(Dims())
    w.sw2_s = w.sw2_s.clone()
    w.sw2_s[7, 1] = 255
    with pytest.raises(WeightError, match="sw2_s: E8M0 code 255"):
        w.check(Dims())
    attn = dataclasses.replace(w.attn, wo_b_scale=w.attn.wo_b_scale.clone(), _codes={})
    attn.wo_b_scale[:4, 4:8] = 255  # a whole 128 x 128 block: only the NaN is wrong
    with pytest.raises(WeightError, match="layer 3 attention wo_b_scale: E8M0 code 255"):
        attn.check(Dims())


def test_routed_scales_pass_with_any_code_in_aiters_pad_columns(k1_weights):
    """w2_s's columns past inter / 32 (12 of 16 at TP8) are AITER's shuffle_scale padding, left
    uninitialised: a layer whose pad bytes happen to be 255 is a valid layer."""
    w = layer_weights(k1_weights)
    w.attn.check(Dims())
    w.w2_s = torch.full_like(w.w2_s, 255)
    w.w13_s = torch.full_like(w.w13_s, 255)
    w.check(Dims())


@pytest.mark.parametrize("change, name", [
    (lambda kw: kw.update(topk_indices=kw["topk_indices"][:, :512]), "topk_indices"),
    (lambda kw: kw.update(comp_block_table=None), "comp_block_table"),
    (lambda kw: kw.update(global_keys=True), "global_keys"),
    (lambda kw: kw.update(route_ids=torch.zeros(8, 6, dtype=torch.int64)), "route_ids"),
])
def test_step_tables_that_do_not_fit_are_refused_by_name(weights, change, name):
    runner = front_runner()
    step = hook_step(weights, 2, False)
    change(step.kwargs)
    with pytest.raises(ValueError, match=name):
        runner.forward(*step.args, **step.kwargs)
