"""The hook end to end on vLLM 0.33.0's real classes: the real `DeepseekV4DecoderLayer.forward`
-> the real `MonoDecodeLayer.__call__` (its `_decode_step` on the real forward context and ROCm
metadata) -> the served runner module's `MonoRunner.forward`; or, for a step the kernels do not
take, the layer's original path (replaced by a recorder: it needs AITER's kernels).

With the stand-in runner these pin what the hook hands a runner; they also check the step
fixtures themselves (`cpu_vllm.make_step`), which tests of mono-jit's runner build on."""

from __future__ import annotations

import pytest
import torch
from cpu_vllm import (
    HCA_WIDTH,
    INDEX_TOPK,
    make_step,
    mark_fallback,
    record_declines,
    stub_weights,
)

def same(a: tuple, b: tuple) -> bool:
    """The same objects, in order (tensors compare by identity here)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


# name -> (layer index, layer 0's inputs)
KINDS = {
    "layer0": (0, True),
    "hash-hca": (1, False),
    "hash-csa": (2, False),
    "hca": (3, False),
    "csa": (4, False),
}


@pytest.mark.parametrize("mode", ["FULL", "NONE"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("rows, decode_tokens", [(1, 1), (8, 5)])
def test_decode_step_reaches_the_runner(
    tiny_model, served_runner, run_step, monkeypatch, tp_group, kind, mode, rows, decode_tokens
):
    index, first = KINDS[kind]
    layer = tiny_model.layers[index]
    weights = stub_weights(monkeypatch, layer)
    fallback = mark_fallback(monkeypatch, layer)
    step = make_step(layer, rows, first=first, decode_tokens=decode_tokens)

    out = run_step(layer, step, mode)

    assert fallback == []
    calls = served_runner.calls
    assert calls.built == [
        dict(
            tp=1,
            rank=0,
            group=tp_group.cpu_group,
            device=torch.device("cpu"),
            max_topk=HCA_WIDTH,
        )
    ]
    (forward,) = calls.forwards
    a = forward["args"]
    assert same(out, forward["out"][:4])
    assert a["w"] is weights
    assert a["x"] is step.x and a["positions"] is step.positions
    if first:  # the embedding broadcast stands in for the residual and both mixes
        assert a["residual"] is a["post_mix"] is a["res_mix"] is step.x
        assert tuple(step.x.shape) == (rows, 4, layer.hidden_size)
    else:
        assert same(
            (a["residual"], a["post_mix"], a["res_mix"]),
            (step.residual, step.post_mix, step.res_mix),
        )
    assert a["fold"] is (not first)
    swa = step.metadata[layer.attn.swa_cache_layer.prefix]
    comp = step.metadata[layer.attn.prefix]
    assert a["slot_mapping"] is swa.slot_mapping
    assert same(
        (a["swa_indices"], a["swa_lens"], a["token_to_req"]),
        (swa.decode_swa_indices, swa.decode_swa_lens, swa.token_to_req_indices),
    )
    assert tuple(a["swa_cache"].shape[1:]) == (64, 584) and a["swa_cache"].dtype == torch.uint8
    ratio, hashed = layer.attn.compress_ratio, layer.ffn.gate.tid2eid is not None
    assert tuple(a["comp_cache"].shape[1:]) == (256 // ratio, 584)
    if ratio == 128:
        assert (a["topk"], a["global_keys"], a["comp_block_table"]) == (HCA_WIDTH, True, None)
        assert tuple(a["topk_indices"].shape) == (decode_tokens, 128)
        assert a["topk_indices"].stride(0) in (HCA_WIDTH, 128)  # one row: any stride
    else:
        assert (a["topk"], a["global_keys"]) == (0, False)
        assert a["comp_block_table"] is comp.block_table
        assert a["topk_indices"] is layer.attn.topk_indices_buffer
        assert a["topk_indices"].stride(0) == INDEX_TOPK
    if hashed:
        assert torch.equal(a["route_ids"], layer.ffn.gate.tid2eid[step.input_ids])
        assert a["route_ids"].dtype == torch.int32 and a["route_ids"].is_contiguous()
    else:
        assert a["route_ids"] is None


def test_one_runner_for_every_layer(tiny_model, served_runner, run_step, monkeypatch):
    for index, layer in tiny_model.layers.items():
        stub_weights(monkeypatch, layer)
        run_step(layer, make_step(layer, 2, first=index == 0))
    assert len(served_runner.calls.built) == 1
    assert len(served_runner.calls.forwards) == len(tiny_model.layers)


def _more_tokens_than_rows(step, layer):
    step.metadata[layer.attn.swa_cache_layer.prefix].num_decode_tokens = step.x.shape[0] + 1
    return step


def _non_contiguous_residual(step):
    step.residual = step.residual.transpose(0, 1).contiguous().transpose(0, 1)
    assert not step.residual.is_contiguous()
    return step


@pytest.mark.parametrize(
    "mode, index, step_of, reason",
    [
        ("PIECEWISE", 4, lambda layer: make_step(layer, 4), "PIECEWISE step"),
        (
            "FULL",
            4,
            lambda layer: make_step(layer, 4, decode_tokens=3, prefills=1),
            "not a decode-only step",
        ),
        ("NONE", 3, lambda layer: make_step(layer, 4, swa_width=256), "SWA width 256"),
        ("FULL", 4, lambda layer: make_step(layer, 65), "65 rows"),
        ("FULL", 4, lambda layer: make_step(layer, 4, metadata=False), "no attention metadata"),
        (
            "FULL",
            2,
            lambda layer: make_step(layer, 4, input_ids=False),
            "a hash layer without its input ids",
        ),
        (
            "FULL",
            4,
            lambda layer: _more_tokens_than_rows(make_step(layer, 4), layer),
            "more decode tokens than rows",
        ),
        (
            "FULL",
            3,
            lambda layer: _non_contiguous_residual(make_step(layer, 4)),
            "non-contiguous layer inputs",
        ),
    ],
    ids=[
        "piecewise",
        "prefill",
        "swa-256",
        "65-rows",
        "no-metadata",
        "hash-no-ids",
        "tokens>rows",
        "non-contiguous",
    ],
)
def test_step_declined(
    tiny_model, served_runner, run_step, monkeypatch, mode, index, step_of, reason
):
    """The step takes the layer's original path, for the hook's own reason, and no runner is
    made."""
    layer = tiny_model.layers[index]
    stub_weights(monkeypatch, layer)
    fallback = mark_fallback(monkeypatch, layer)
    declines = record_declines(monkeypatch)
    step = step_of(layer)
    out = run_step(layer, step, mode)
    assert declines == [reason]
    assert len(fallback) == 1 and same(fallback[0], step.args())
    assert same(out, (step.x, step.residual, step.post_mix, step.res_mix))
    assert served_runner.calls.built == [] and served_runner.calls.forwards == []


def test_no_forward_context_declined(tiny_model, served_runner, monkeypatch):
    layer = tiny_model.layers[4]
    fallback = mark_fallback(monkeypatch, layer)
    declines = record_declines(monkeypatch)
    layer(*make_step(layer, 4).args())
    assert declines == ["no forward context"]
    assert len(fallback) == 1 and served_runner.calls.built == []


def test_first_step_inside_a_capture_raises(tiny_model, served_runner, run_step, monkeypatch):
    """vLLM warms every graph size up eagerly first; a runner first reached under capture is
    an error, not a silent allocation inside the graph."""
    layer = tiny_model.layers[4]
    stub_weights(monkeypatch, layer)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
        run_step(layer, make_step(layer, 4))
