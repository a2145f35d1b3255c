"""What vLLM 0.33's hook imports from `vllm.models.deepseek_v4.amd.mono.runner`, as mono-jit's.

`BLOCKS` (vLLM's CU gate: a persistent launch needs this many CUs), `MAX_TOKENS`,
`MonoRunner(tp, rank, group, device, max_topk=...)` and the weights classes vLLM fills by
keyword and `.check(dims)`s. The runner is mono-jit's (`mono_jit.runtime.runner`): kernels from
the cache, all-or-none across ranks, vLLM's original path when anything is missing.
"""

from __future__ import annotations

from ..config import Settings
from ..runtime.runner import BLOCKS, MonoRunner
from ..runtime.step import MAX_TOKENS
from ..runtime.weights import AttnWeights, MonoLayerWeights

__all__ = ["AttnWeights", "BLOCKS", "MAX_TOKENS", "MonoLayerWeights", "MonoRunner"]


def check_deployment() -> None:
    """Raise ImportError (vLLM's start-up refusal) when this host cannot run the backend."""
    settings = Settings()
    if settings.backend != "hip":
        return
    from ..runtime.hip import Hip, HipError

    try:
        Hip.get()
    except HipError as exc:
        raise ImportError(f"mono-jit: {exc}; the kernels need ROCm's HIP runtime (MONO_JIT_BACKEND=reference "
                          "runs their torch references instead)") from None
