"""All-or-none across the TP ranks: every rank takes the same path at every layer.

The kernels wait on each other's pushes, so one rank on the kernels and another on vLLM's path
would hang. After a rank has resolved its kernels (or its peer memory), the ranks agree: a MIN
of an ok flag over the TP group's CPU (gloo) process group, as vLLM's in-tree runner does
(`peer_memory.tp_agree`); when any rank failed, the reasons are gathered so that every rank's
log names the rank that failed and why. Collective: every rank of the group must call it.
"""

from __future__ import annotations

from typing import Any


def agree(group: Any, ok: bool, why: str) -> str | None:
    """None when every rank is ok, else "rank R: why; ..." for each failed rank (same on all)."""
    if group is None:
        return None if ok else f"rank 0: {why}"
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if int(flag.item()) == 1:
        return None
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (ok, why), group=group)
    return "; ".join(f"rank {rank}: {reason}" for rank, (fine, reason) in enumerate(gathered) if not fine)
