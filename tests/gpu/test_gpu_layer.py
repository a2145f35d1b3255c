"""The whole layer through the runner on 8 MI355X GPUs: K1, a `select` stand-in, K2 with its
all-reduces through IPC peer buffers, all from the cache through the HIP backend, against
tests/support/layer_math.py's independent formulation of vLLM's math (layer_math.BOUNDS, the SWA cache
byte for byte), for a CSA layer with its bias and a hash HCA layer, two steps in a row each:
what tests/vllm/test_e2e_layer.py checks of the reference backend on the CPU. Skipped without 8
gfx950 GPUs; it has never run."""

from __future__ import annotations

import os

import pytest
import torch
from layer_math import (ATTN_FIELDS, BOUNDS, LayerStep, check_swa_cache, decode_layer, layer_errors,
                        random_checkpoint_layer, random_step, rank_tensors)
from test_gpu import _on_gfx950

from mono_jit import deepseek_v4

TP = 8
pytestmark = [
    pytest.mark.gfx950,
    pytest.mark.skipif(not _on_gfx950(), reason="needs an AMD MI355X (gfx950) GPU with ROCm; none on this machine"),
    pytest.mark.skipif(torch.cuda.device_count() < TP if torch.cuda.is_available() else True,
                       reason="needs 8 MI355X GPUs in one node (the TP8 all-reduces)"),
]
ROWS = 4
PADS = (2,)
RECORD = 584


def on_device(t, device: str):
    """A tensor on `device` with its layout: a row-padded view (vLLM's FP8 padding) keeps its padding."""
    if not isinstance(t, torch.Tensor) or t.is_contiguous():
        return t.to(device) if isinstance(t, torch.Tensor) else t
    whole = torch.as_strided(t, (t.shape[0], t.stride(0)), (t.stride(0), 1)).to(device)
    return whole[:, : t.shape[1]]


def layer_weights(fields: dict, device: str):
    from mono_jit.runtime.weights import AttnWeights, MonoLayerWeights

    moved = {name: on_device(value, device) for name, value in fields.items()}
    attn = AttnWeights(**{name: moved[name] for name in ATTN_FIELDS})
    w = MonoLayerWeights(attn=attn, **{name: v for name, v in moved.items() if name not in ATTN_FIELDS})

    class Dims:
        tp = TP

    attn.check(Dims())
    w.check(Dims())
    return w


def record_view(flat: torch.Tensor, page_stride: int, block: int) -> torch.Tensor:
    """vLLM's `_record_view` of a flat paged cache: [pages, block, 584] at the page stride."""
    return torch.as_strided(flat, (flat.numel() // page_stride, block, RECORD), (page_stride, RECORD, 1))


def hook_arguments(step: LayerStep, w, device: str, selected: list) -> tuple[tuple, dict, torch.Tensor]:
    """`MonoRunner.forward`'s arguments as vLLM's hook passes them for `step`, on `device`, and
    the SWA cache's flat bytes (written in place)."""
    dev = lambda t: None if t is None else t.to(device)  # noqa: E731
    first = step.x is None
    residual = dev(step.residual)
    x = residual if first else dev(step.x)
    post_mix, res_mix = (x, x) if first else (dev(step.post_mix), dev(step.res_mix))
    swa = dev(step.swa_cache)
    rows = step.positions.shape[0]
    csa = w.attn.ratio == deepseek_v4.CSA_RATIO
    if csa:  # the indexer's output, in the model's [T, 1024] top-k buffer
        topk = torch.full((rows, deepseek_v4.CSA_INDEX_TOPK), -1, dtype=torch.int32)
        topk[:, : step.topk.shape[1]] = step.topk
    else:
        topk = step.topk[[r for r in range(rows) if r not in PADS]]
    kwargs = dict(topk_indices=dev(topk), comp_cache=record_view(dev(step.comp_cache), step.comp_page_stride,
                                                                 step.comp_block),
                  select=lambda normed, qr: selected.append((normed.cpu(), qr.cpu())), fold=not first,
                  route_ids=dev(step.route_ids), topk=0 if csa else 8192, global_keys=not csa)
    if csa:
        kwargs["comp_block_table"] = dev(step.block_table)
    args = (w, x, residual, post_mix, res_mix, dev(step.positions), dev(step.slot_mapping),
            record_view(swa, step.swa_page_stride, step.swa_block), dev(step.swa_indices.view(rows, 1, -1)),
            dev(step.swa_lens), dev(step.token_req if step.token_req is not None else torch.zeros(rows, dtype=torch.int32)))
    return args, kwargs, swa


def _rank_main(rank: int, port: int, ratio: int, hashed: bool, results) -> None:
    import torch.distributed as dist

    from mono_jit.runtime.backends import HipBackend
    from mono_jit.runtime.runner import MonoRunner

    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP)
    try:
        ckpt = random_checkpoint_layer(3, ratio, hashed, seed=7)
        w = layer_weights(rank_tensors(ckpt, rank), device)
        runner = MonoRunner(TP, rank, dist.group.WORLD, device, 8192, backend=HipBackend())
        assert runner.declined is None, runner.declined
        errors = []
        for seed in (1, 2):  # two steps in a row: epochs advance, peer halves alternate
            step = random_step(ckpt, ROWS, seed=seed, pads=PADS)
            want = decode_layer(step, ckpt)
            selected: list = []
            args, kwargs, swa = hook_arguments(step, w, device, selected)
            out, res_out, post_out, comb_out, pre_out = runner.forward(*args, **kwargs)
            torch.cuda.synchronize()
            (normed, qr), = selected
            got = dict(normed=normed, qr=qr, out=out.cpu(), res_out=res_out.cpu(), post_out=post_out.cpu(),
                       comb_out=comb_out.cpu())
            errors.append(layer_errors(got, want, [r for r in range(ROWS) if r not in PADS]))
            check_swa_cache(swa.cpu(), want.swa_cache, step)
        results[rank] = errors
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("ratio, hashed", [(deepseek_v4.CSA_RATIO, False), (deepseek_v4.HCA_RATIO, True)])
def test_the_layer_on_8_gpus_matches_vllms_math(ratio, hashed):
    import torch.multiprocessing as mp

    manager = mp.Manager()
    results = manager.dict()
    port = 29600 + os.getpid() % 1000
    mp.spawn(_rank_main, args=(port, ratio, hashed, results), nprocs=TP, join=True)
    assert sorted(results.keys()) == list(range(TP))
    for rank, steps in results.items():
        for errors in steps:
            over = {k: e for k, e in errors.items() if not e <= BOUNDS[k]}
            assert not over, f"rank {rank}: past the bounds {BOUNDS}: {over}"
