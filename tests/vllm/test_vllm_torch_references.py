"""tests/support/layer_math.py against vLLM's own torch references, imported in this folder so that vLLM
resolves its platform under the CPU host of conftest.vllm_host (an import of vLLM before it would
fix the platform as unspecified for the whole session)."""

from __future__ import annotations

import importlib

import layer_math as lm
import torch


def test_mhc_matches_vllms_torch_reference_bit_for_bit(vllm_host):
    """mhc_pre / mhc_post restate vllm/model_executor/kernels/mhc/torch.py: they agree bit for bit."""
    theirs = importlib.import_module("vllm.model_executor.kernels.mhc.torch")  # the package's `torch` is torch

    g = torch.Generator().manual_seed(3)
    residual = torch.randn(5, 4, lm.H, generator=g).bfloat16()
    fn, base, scale = torch.randn(24, 4 * lm.H, generator=g) * 0.01, torch.randn(24, generator=g) * 0.1, \
        torch.rand(3, generator=g) + 0.5
    post, comb, collapse, _ = lm.mhc_pre(residual, fn, scale, base)
    want = theirs.mhc_pre_torch(residual, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, 20)
    assert torch.equal(post, want[0]) and torch.equal(comb, want[1]) and torch.equal(collapse, want[2])
    x = torch.randn(5, lm.H, generator=g).bfloat16()
    assert torch.equal(lm.mhc_post(x, residual, post, comb), theirs.mhc_post_torch(x, residual, post, comb))
