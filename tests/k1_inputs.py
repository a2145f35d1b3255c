"""Random K1 inputs in vLLM's layouts (fp8 weights as bytes, E8M0 block scales), for the
reference tests and the gfx950 launch test."""

from __future__ import annotations

import torch

from mono_jit.templates.k1 import reference as ref

H = 7168


def rope_table(positions: int, g: torch.Generator) -> torch.Tensor:
    theta = torch.rand(positions, 32, generator=g) * 6
    return torch.cat([torch.cos(theta), torch.sin(theta)], dim=1)


def random_weights(tp: int = 8, positions: int = 64, seed: int = 0, row_pad: int = 0) -> ref.K1Weights:
    """Weights whose GEMV outputs are O(1); row_pad bytes of 0x7F (NaN) pad each fp8 row, as
    VLLM_ROCM_FP8_PADDING does, so a kernel that reads past K shows it."""
    g = torch.Generator().manual_seed(seed)
    heads = 128 // tp

    def fp8(n: int, k: int) -> torch.Tensor:
        w = (torch.randn(n, k, generator=g) * 16).to(torch.float8_e4m3fn).view(torch.uint8)
        return torch.cat([w, torch.full((n, row_pad), 0x7F, dtype=torch.uint8)], dim=1)

    return ref.K1Weights(
        hc_fn=torch.randn(24, 4 * H, generator=g) * 0.01, hc_base=torch.randn(24, generator=g) * 0.1,
        hc_scale=torch.rand(3, generator=g) + 0.5,
        attn_norm=(1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16),
        w_qkv=fp8(2048, H), s_qkv=torch.randint(118, 122, (16, 56), generator=g, dtype=torch.uint8),
        q_norm=(1 + 0.2 * torch.randn(1536, generator=g)).to(torch.bfloat16),
        kv_norm=(1 + 0.2 * torch.randn(512, generator=g)).to(torch.bfloat16),
        w_qb=fp8(heads * 512, 1536), s_qb=torch.randint(118, 122, (heads * 4, 12), generator=g, dtype=torch.uint8),
        rope=rope_table(positions, g))


def random_activations(m: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """x, residual, post_mix, res_mix for m rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, H, generator=g).to(torch.bfloat16)
    residual = torch.randn(m, 4, H, generator=g).to(torch.bfloat16)
    post_mix = torch.rand(m, 4, 1, generator=g) * 2
    res_mix = ref.sinkhorn(torch.randn(m, 4, 4, generator=g))
    return x, residual, post_mix, res_mix
