"""`router`: the MoE router of a DeepSeek-V4-Pro decode layer, as a standalone FlyDSL launch.

Contract (M = rows this step, 1 <= M <= spec.max_tokens; flat row-major buffers):
  in   x         [M, 7168] bf16      the FFN input (normed)
       gate      [384, 7168] bf16    router weight, replicated on every TP rank
       bias      [384] f32           e_score_correction_bias (ignored on hash layers)
       hash_ids  [M, 6] int32        expert ids per token on hash layers (tid2eid[token])
       m, use_hash                   i32 runtime arguments (layers 0-2 pass use_hash=1)
  out  ids       [M, 6] int32        chosen experts, best first
       weights   [M, 6] f32          renormalised scores x 2.5
Semantics (tie-breaking, NaN handling) are defined by reference.route. The router reads only
max_tokens of the spec: TP, ratio and top-k width share one build.
"""

from __future__ import annotations

from ... import deepseek_v4
from ...spec import Spec
from ..base import Argument, LaunchShape, Template

BLOCK = 256  # 4 waves: each wave computes a quarter of the 384 logits, then wave 0 picks top-6


class RouterTemplate(Template):
    name = "router"
    spec_fields = ("max_tokens",)
    kernel_module = ".kernel"

    def launch_shape(self, spec: Spec) -> LaunchShape:
        # One CTA per row; CTAs past the runtime M return at once.
        return LaunchShape(grid=(spec.max_tokens, 1, 1), block=(BLOCK, 1, 1))

    def arguments(self, spec: Spec) -> tuple[Argument, ...]:
        k, h = deepseek_v4.EXPERTS_PER_TOKEN, deepseek_v4.HIDDEN
        return (
            Argument("x", "tensor", "bfloat16", f"[M, {h}] FFN input"),
            Argument("gate", "tensor", "bfloat16", f"[{deepseek_v4.ROUTED_EXPERTS}, {h}] router weight"),
            Argument("bias", "tensor", "float32", f"[{deepseek_v4.ROUTED_EXPERTS}] score correction bias"),
            Argument("hash_ids", "tensor", "int32", f"[M, {k}] expert ids on hash layers"),
            Argument("ids", "tensor", "int32", f"[M, {k}] out: chosen experts"),
            Argument("weights", "tensor", "float32", f"[M, {k}] out: routing weights"),
            Argument("m", "i32", "int32", "rows this step (1..max_tokens)"),
            Argument("use_hash", "i32", "int32", "1 on hash layers (ids from hash_ids, no bias)"),
        )
