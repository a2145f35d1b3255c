"""mono-jit's plug-in and runner on vLLM 0.33.0's real classes (CPU, the reference backend):
vLLM's plug-in loader installs mono-jit's finder; vLLM's `create()` imports mono-jit's runner
module (and refuses with mono-jit's reason on a host without HIP); the real decoder layer's
forward reaches mono-jit's runner through vLLM's hook, which runs K1's reference on vLLM's own
tensors and caches and calls vLLM's select with K1's outputs (a runner built without K2, so the
layer goes on down vLLM's original path); a runner that cannot exchange its peer buffers
declines on every step. The whole layer through vLLM is test_e2e_layer.py."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys

import pytest
import torch
from cpu_vllm import HCA_WIDTH, RUNNER, make_step, mark_fallback, stub_weights
from hook_inputs import layer_weights
from mono_jit.selfcheck.k1_world import random_activations, random_weights

from mono_jit.runtime.backends import ReferenceBackend
from mono_jit.runtime.hip import mapped_library
from mono_jit.runtime.runner import MonoRunner
from mono_jit.templates.k1 import reference as ref
from mono_jit.templates import reference_math as rmath
from mono_jit.vllm.finder import RunnerFinder

H = 7168


@pytest.fixture
def mono_jit_plugin(monkeypatch):
    """vLLM's plug-in loader run afresh in this process with only mono-jit's finder to find, the
    reference backend, and no runner module imported yet."""
    import vllm.plugins

    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, RunnerFinder)])
    monkeypatch.delitem(sys.modules, RUNNER, raising=False)
    monkeypatch.setenv("MONO_JIT_BACKEND", "reference")
    return vllm.plugins


def test_vllms_plugin_loader_serves_mono_jits_runner_module(mono_jit_plugin):
    mono_jit_plugin.load_general_plugins()
    mono_jit_plugin.load_general_plugins()
    assert sum(isinstance(f, RunnerFinder) for f in sys.meta_path) == 1
    served = importlib.import_module(RUNNER)
    assert served.MonoRunner is MonoRunner and served.BLOCKS == 256


def test_the_runners_log_lines_reach_vllms_handlers(mono_jit_plugin, monkeypatch):
    ours, vllm_logger = logging.getLogger("mono_jit"), logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "handlers", [logging.StreamHandler()])  # as vLLM's logging set-up leaves it
    monkeypatch.setattr(vllm_logger, "level", logging.INFO)
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    mono_jit_plugin.load_general_plugins()
    importlib.import_module(RUNNER)
    assert ours.handlers == vllm_logger.handlers and ours.handlers and not ours.propagate
    assert logging.getLogger("mono_jit.runtime").isEnabledFor(logging.INFO)


def test_vllm_plugins_can_leave_mono_jit_out(mono_jit_plugin, monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    mono_jit_plugin.load_general_plugins()
    assert not any(isinstance(f, RunnerFinder) for f in sys.meta_path)


def test_create_takes_mono_jits_module_and_refuses_a_host_without_hip(md, tiny_model, deployment,
                                                                       mono_jit_plugin, monkeypatch):
    mono_jit_plugin.load_general_plugins()
    layer = tiny_model.layers[4]
    assert isinstance(md.MonoDecodeLayer.create(layer, tiny_model.config), md.MonoDecodeLayer)
    monkeypatch.delitem(sys.modules, RUNNER)
    monkeypatch.setenv("MONO_JIT_BACKEND", "hip")
    if mapped_library() is not None:
        pytest.skip("this host has a HIP runtime")
    with pytest.raises(ValueError, match=r"--monokernel needs FlyDSL .*\(mono-jit: no HIP runtime"):
        md.MonoDecodeLayer.create(layer, tiny_model.config)


def test_a_runner_without_its_peers_sends_every_step_down_vllms_path(md, tiny_model, run_step, mono_jit_plugin,
                                                                    deployment, monkeypatch, caplog):
    """TP 8 on this process's 1-rank group: the peer buffers cannot be exchanged, so the runner
    declines at its construction, once, and the hook takes vLLM's path on every step."""
    mono_jit_plugin.load_general_plugins()
    layer = tiny_model.layers[3]
    stub_weights(monkeypatch, layer)
    fallback = mark_fallback(monkeypatch, layer)
    with caplog.at_level(logging.WARNING, logger="mono_jit.runtime"):
        for _ in range(2):
            run_step(layer, make_step(layer, 2))
    assert isinstance(md._runner, MonoRunner) and len(fallback) == 2
    assert md._runner.declined == ("rank 0: peer memory: ValueError: a TP group of 1 ranks, expected 8")
    assert caplog.text.count("every rank keeps vLLM's original path") == 1


def v4_pro_step(layer, rows: int, first: bool, decode_tokens: int):
    """A step with the real ROCm metadata (make_step) and V4-Pro-wide activations."""
    step = make_step(layer, rows, first=first, decode_tokens=decode_tokens)
    x, residual, post_mix, res_mix = random_activations(rows, seed=rows)
    if first:
        return dataclasses.replace(step, x=residual)
    return dataclasses.replace(step, x=x, residual=residual, post_mix=post_mix, res_mix=res_mix)


@pytest.mark.parametrize("index, first, rows, decode_tokens", [(0, True, 1, 1), (3, False, 4, 3), (4, False, 8, 8)])
def test_the_front_runs_on_vllms_tensors_through_vllms_hook(md, tiny_model, run_step, tp_group, monkeypatch,
                                                            index, first, rows, decode_tokens):
    layer = tiny_model.layers[index]
    k1 = random_weights(row_pad=256, positions=512)
    stub_weights(monkeypatch, layer, layer_weights(k1, layer_id=index, ratio=layer.attn.compress_ratio))
    md._runner = MonoRunner(8, 0, tp_group.cpu_group, "cpu", HCA_WIDTH, templates=("k1",),
                            backend=ReferenceBackend())
    selected = []
    monkeypatch.setattr(md, "_select",  # vLLM's own needs torch.mm(out_dtype=) (no CPU kernel)
                        lambda layer, positions, normed, qr: selected.append((normed.clone(), qr.clone())))
    fallback = mark_fallback(monkeypatch, layer)
    step = v4_pro_step(layer, rows, first, decode_tokens)
    cache = layer.attn.swa_cache_layer.kv_cache
    pages = cache.as_strided((cache.shape[0] * cache.stride(0),), (1,))
    before = pages.clone()

    run_step(layer, step)

    assert len(fallback) == 1, "the layer's rest (K2) must come from vLLM's path"
    fold = not first
    want = ref.k1(step.x if fold else None, step.residual if fold else step.x, step.post_mix if fold else None,
                  step.res_mix if fold else None, fold, k1, step.positions)
    (normed, qr), = selected
    assert torch.equal(normed, want.x_norm) and torch.equal(qr, want.qr)
    swa = step.metadata[layer.attn.swa_cache_layer.prefix]
    block = swa.block_size
    expected = before.clone()
    rmath.kv_insert(expected, want.records, swa.slot_mapping, cache.stride(0), block)
    assert torch.equal(pages, expected), "KV records differ from reference.kv_insert at vLLM's slots"
    assert (swa.slot_mapping >= 0).sum() == decode_tokens and not torch.equal(pages, before)
