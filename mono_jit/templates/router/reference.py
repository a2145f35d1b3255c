"""Pure-torch reference of the router: the semantics the kernel must match.

- logits = x (bf16) @ gate.T (bf16) accumulated in f32.
- score = sqrt(softplus(logit)), softplus(l) = max(l, 0) + log1p(exp(-|l|)).
- Selection (non-hash): the top-6 of score + bias. A NaN there counts as -inf. Order: larger
  first; equal values go to the lower expert index. Six experts are always chosen (when fewer
  than six are finite, the -inf ones follow in index order).
- Hash layers: the experts are hash_ids[row] as given, no bias.
- Weights: the chosen experts' unbiased scores with NaN -> 0 (and 0 for an out-of-range hash id),
  divided by their sum (or by 1e-20 if the sum is below it), times 2.5.
"""

from __future__ import annotations

import torch

from ... import deepseek_v4


def sqrt_softplus(logits: torch.Tensor) -> torch.Tensor:
    softplus = logits.clamp_min(0) + torch.log1p(torch.exp(-logits.abs()))
    return softplus.sqrt()


def router_logits(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """[M, 384] f32 logits of bf16 inputs."""
    return x.to(torch.bfloat16).float() @ gate.to(torch.bfloat16).float().T


def select_experts(biased: torch.Tensor, k: int = deepseek_v4.EXPERTS_PER_TOKEN) -> torch.Tensor:
    """Top-k indices per row: value descending, ties to the lower index, NaN as -inf."""
    values = torch.nan_to_num(biased, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    # A stable sort of (value desc) over indices already in ascending order breaks ties low-first.
    sorted_idx = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return sorted_idx[..., :k].to(torch.int32)


def route(
    x: torch.Tensor,
    gate: torch.Tensor,
    bias: torch.Tensor | None,
    hash_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [M, 6] int32, weights [M, 6] f32). Pass hash_ids on hash layers (bias is ignored)."""
    scores = sqrt_softplus(router_logits(x, gate))
    experts = scores.shape[-1]
    if hash_ids is not None:
        ids = hash_ids.to(torch.int32)
    else:
        if bias is None:
            raise ValueError("bias is required on non-hash layers")
        ids = select_experts(scores + bias.float())
    valid = (ids >= 0) & (ids < experts)
    raw = torch.gather(scores, 1, ids.clamp(0, experts - 1).long())
    raw = torch.where(valid & ~raw.isnan(), raw, torch.zeros_like(raw))
    total = raw.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    return ids, raw / total * deepseek_v4.ROUTED_SCALING
